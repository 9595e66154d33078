"""CueGRPOTrainer: GRPOTrainer whose positive advantages are multiplied by rarity weights (docs/cue_grpo.md#positive-set).

Glue only (checked against trl 1.16.0); the math lives in :mod:`.cues`, :mod:`.partition`, :mod:`.weights` and
:mod:`.judge`. What is overridden, all calling ``super()``:

- ``_generate_and_score_completions``: inside a rollout capture (:class:`trl_credit.mixins.RolloutCaptureMixin`:
  this process's decoded completions from ``_generate``, the global reward matrix from ``_calculate_rewards``), after TRL has computed its group advantages, gathers them (and the texts of
  the positive completions) across processes, computes each group's partition and weights in TRL's global row
  order (rows grouped contiguously by ``num_generations``), multiplies the positive advantages and returns this
  process's slice. The loss, KL, clipping, importance sampling, ... are GRPO's, untouched.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import torch
from trl import GRPOTrainer

from ..collectives import gather_rows, local_rows
from ..generation import generate_from_prefixes
from ..trainer_logs import log_metric, replace_logged_advantages, warn_once, zero_nonfinite_groups
from ..trainer_setup import bind_success, outside_zero3_init, resolve_method_args, rollout_success
from ..success import groups_with_reward_variance
from ..model_card import MethodModelCardMixin
from ..rewards import completion_text
from .config import CueGRPOConfig
from .cues import extract_cues_batch
from .judge import judge_messages, judge_partition, parse_judge_groups
from .partition import canonical_cluster_ids, partition_skeletons, random_partition
from .weights import cluster_mass_slope, cluster_masses, compute_rarity_weights

__all__ = ["CueGRPOTrainer"]

PartitionFn = Callable[[list[str], object], Sequence]


class CueGRPOTrainer(MethodModelCardMixin, GRPOTrainer):
    """Drop-in GRPOTrainer with Cue-GRPO's rarity-aware credit redistribution.

    Args (beyond GRPOTrainer's):
        args: a :class:`CueGRPOConfig`.
        partition_fn: with ``cue_partition="callable"``: ``fn(completions: list[str], prompt) -> cluster labels``,
            called once per group with the texts of its positive completions (correct and A_i > 0) and the
            group's prompt as in the dataset; must return one hashable label per completion (a clear ValueError
            naming the function otherwise).
        judge_model: with ``cue_partition="judge"``: a causal LM instance used as judge (overrides
            ``args.cue_judge_model``). A separate judge runs HF ``generate`` on the training device (not vLLM and
            not sharded by DeepSpeed: every process holds a full copy); ``cue_judge_model="policy"`` asks the policy
            itself through TRL's generation path instead (vLLM when ``use_vllm``).
        judge_tokenizer: the judge's tokenizer (default: loaded from the judge's name or path).

    Judged and callable partitions are computed once per group, by one process (groups are dealt round-robin to
    processes), then shared; cue and random partitions are cheap and computed identically on every process.

    Metrics (docs/cue_grpo.md#metrics, next to GRPO's): ``cue/clusters_per_group`` (mean over redistributed groups),
    ``cue/frac_groups_nonuniform`` and ``cue/frac_groups_redistributed`` (over all groups of the step),
    ``cue/weight_spread`` (mean max - min of w' over P), ``cue/single_cluster_rate`` (groups with |P| >= 2 whose P
    is one cluster; warned once above 0.5), ``cue/mass_slope`` (log-log slope of the pre-floor cluster
    mass n_C·w̄_C against n_C over the step's clusters, Fig. 2c; logged when two cluster sizes occur) and, for judges,
    ``cue/judge_parse_failure_rate``. Redistributed groups: rewards vary and P is not empty, where P = {correct_i and A_i > 0, loss not masked}
    (correct = ``success_reward`` >= ``success_threshold``); ``cue/frac_positive_advantage_excluded`` is the fraction
    of A_i > 0 completions left out of P.
    """

    _tag_names = ["trl", "grpo", "cue-grpo", "trl_credit"]
    _name = "Cue-GRPO"
    _paper = {
        "title": "When Correct Solutions Repeat: Rarity-Aware Credit Redistribution for GRPO",
        "id": None,  # no arXiv id known to us: no Hub paper link in the model card
        "citation": "@misc{cuegrpo, title = {When Correct Solutions Repeat: Rarity-Aware Credit Redistribution for "
        "GRPO}, note = {https://github.com/CzZ12/When-Correct-Solutions-Repeat-Rarity-Aware-Credit-Redistribution-for-GRPO}}",
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: CueGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
        *,
        partition_fn: PartitionFn | None = None,
        judge_model=None,
        judge_tokenizer=None,
    ):
        args = resolve_method_args(args, CueGRPOConfig, model, "CueGRPOTrainer", "Cue-GRPO")
        _check_partition_arguments(args, partition_fn, judge_model, judge_tokenizer)
        super().__init__(
            model,
            reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            tools=tools,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
        )
        bind_success(self)
        self.partition_fn = partition_fn
        self.judge_model, self.judge_tokenizer = None, None
        self._judge_is_policy = args.cue_partition == "judge" and judge_model is None and args.cue_judge_model == "policy"
        if args.cue_partition == "judge" and not self._judge_is_policy:
            self.judge_model, self.judge_tokenizer = self._load_judge(judge_model, judge_tokenizer)
        self._cue_round = 0  # generation rounds so far, identical on every process (seeds the random partition)
        self.cue_overhead_seconds: list[float] = []  # wall time of each redistribution (for benchmarks)

    # ------------------------------------------------------------------ checkpoints (MethodRNGStateMixin)

    def _method_rng_state(self) -> dict:
        return {"cue_round": self._cue_round}  # seeds the random partition: a resumed run continues the count

    def _set_method_rng_state(self, state: dict) -> None:
        self._cue_round = int(state["cue_round"])

    # ------------------------------------------------------------------ judge loading

    def _load_judge(self, judge_model, judge_tokenizer):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = judge_model if judge_model is not None else self.args.cue_judge_model
        if isinstance(source, str):
            dtype = self.args.cue_judge_dtype
            dtype = dtype if dtype == "auto" else getattr(torch, dtype)
            with outside_zero3_init():  # a whole frozen copy per process, not ZeRO-3 shards
                model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        else:
            model = source
        model = model.to(self.accelerator.device).eval()
        model.requires_grad_(False)
        if judge_tokenizer is None:
            name = source if isinstance(source, str) else getattr(model, "name_or_path", None)
            if not name:
                raise ValueError("judge_tokenizer is required when judge_model is an instance without a name_or_path")
            judge_tokenizer = AutoTokenizer.from_pretrained(name)
        if judge_tokenizer.pad_token_id is None:
            judge_tokenizer.pad_token = judge_tokenizer.eos_token
        return model, judge_tokenizer

    # ------------------------------------------------------------------ the generation batch

    def _generate_and_score_completions(self, inputs):
        with self._capturing_rollouts() as rollouts:  # TRL's completions and rewards, for the redistribution
            output = super()._generate_and_score_completions(inputs)
            output["advantages"] = zero_nonfinite_groups(
                self, output["advantages"], rollouts.rewards("CueGRPOTrainer"), "cue/nonfinite_reward_rate"
            )
            start = time.perf_counter()
            # Rows whose loss TRL masks entirely (mask_truncated_completions): no gradient, so no strategy to credit.
            in_loss = output["completion_mask"].sum(dim=1) > 0
            output["advantages"] = self._redistribute_advantages(inputs, output["advantages"], in_loss)
            self.cue_overhead_seconds.append(time.perf_counter() - start)
        self._log_credit(output)
        return output

    # ------------------------------------------------------------------ redistribution

    def _redistribute_advantages(self, inputs, local_advantages: torch.Tensor, local_in_loss=None) -> torch.Tensor:
        rollouts = self._rollout_capture
        if rollouts is None or rollouts.generated is None or rollouts.rewards_per_func is None:
            raise RuntimeError("CueGRPOTrainer: completions/rewards were not captured (did a subclass bypass "
                               "_generate or _calculate_rewards?)")
        if local_advantages.dim() != 1:
            raise ValueError("CueGRPOTrainer expects sequence-level advantages of shape (B,)")
        args = self.args
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        self._cue_round += 1

        advantages = self.accelerator.gather(local_advantages.detach()).double().cpu()
        if local_in_loss is None:
            local_in_loss = torch.ones_like(local_advantages, dtype=torch.bool)
        local_in_loss = local_in_loss.to(device=local_advantages.device, dtype=torch.long)
        in_loss = self.accelerator.gather(local_in_loss).bool().cpu()
        rewards_per_func = rollouts.rewards_per_func
        total = advantages.numel()
        if total % group_size or rewards_per_func.size(0) != total:
            raise RuntimeError(
                f"CueGRPOTrainer: {total} advantages, {rewards_per_func.size(0)} rewards, group size {group_size}"
            )
        varied = groups_with_reward_variance(
            rewards_per_func, self.reward_weights, group_size, args.multi_objective_aggregation
        ).tolist()
        # Unscorable rows are never correct (success_rows), so they never enter P.
        correct = rollout_success(self, rewards_per_func).cpu()
        positives, excluded = positive_sets(advantages, correct, in_loss, varied, group_size)
        log_metric(self, "cue/frac_positive_advantage_excluded", excluded)
        if excluded == 1.0:
            warn_once(
                self,
                "cue_no_correct_positive",
                "Cue-GRPO found completions with A_i > 0 but none of them correct (or all with a masked loss), so "
                "this step was plain GRPO. Correct means the `success_reward` function "
                f"({self.reward_func_names[self._success_index]!r}) returned >= success_threshold "
                f"({args.success_threshold}): check both if your verifier is not that function or not 0/1. "
                "`cue/frac_positive_advantage_excluded` logs the rate every step.",
            )
        advantage_values = advantages.tolist()

        local_count = local_advantages.numel()
        offset = local_rows(self, local_count).start
        partitions, lengths, parse_failures = self._partitions(inputs, positives, offset, group_size)

        new_values = list(advantage_values)
        clusters_per_group, spreads, sizes, masses, nonuniform = [], [], [], [], 0
        for group, members in positives.items():
            result = compute_rarity_weights(
                partitions[group],
                lengths.get(group),
                args.cue_resolved_alpha,
                args.cue_gamma_min,
                args.cue_gamma_max,
                args.cue_tau,
                args.cue_weighting,
            )
            for row, weight in zip(members, result.weights, strict=True):
                new_values[row] = advantage_values[row] * weight
            clusters_per_group.append(len(set(partitions[group])))
            spreads.append(max(result.weights) - min(result.weights))
            nonuniform += spreads[-1] > 1e-9
            for size, mass in cluster_masses(partitions[group], result.prefloor):
                sizes.append(size)
                masses.append(mass)

        num_groups = total // group_size
        if positives:
            log_metric(self, "cue/clusters_per_group", sum(clusters_per_group) / len(clusters_per_group))
            log_metric(self, "cue/weight_spread", sum(spreads) / len(spreads))
        log_metric(self, "cue/frac_groups_nonuniform", nonuniform / num_groups)
        log_metric(self, "cue/frac_groups_redistributed", len(positives) / num_groups)
        self._log_single_clusters(positives, partitions)
        slope = cluster_mass_slope(sizes, masses)
        if slope == slope:  # defined only with two distinct cluster sizes in the step
            log_metric(self, "cue/mass_slope", slope)
        if parse_failures is not None:
            log_metric(self, "cue/judge_parse_failure_rate", parse_failures)
        replace_logged_advantages(self, new_values)  # TRL's table shows the pre-redistribution ones

        local = new_values[local_rows(self, local_count)]
        return torch.tensor(local, dtype=local_advantages.dtype, device=local_advantages.device)

    def _log_single_clusters(self, positives, partitions) -> None:
        """``cue/single_cluster_rate``: the share of groups with two or more positives whose positives all fall in
        one cluster, so their rarity weights are uniform (GRPO; with ``cr``, the positive advantages × τ). A group
        with one positive has nothing to partition and does not count; ``uniform_boost`` does not cluster at all."""
        args = self.args
        multi = [group for group, members in positives.items() if len(members) > 1]
        if not multi or args.cue_weighting == "uniform_boost":
            return
        rate = sum(len(set(partitions[group])) == 1 for group in multi) / len(multi)
        log_metric(self, "cue/single_cluster_rate", rate)
        if rate <= 0.5:
            return
        if args.cue_partition == "judge":
            cause = ("the judge put all of a group's correct answers in one group, or its answer could not be "
                     "parsed (cue/judge_parse_failure_rate)")
            fix = "use a stronger cue_judge_model or a larger cue_judge_max_new_tokens"
        elif args.cue_partition == "callable":
            cause = "partition_fn returned one label for all of a group's correct answers"
            fix = "check partition_fn"
        else:
            cause = ("their Strategy-Cue skeletons do not tell them apart: short answers have no reasoning step of "
                     "20+ characters (no cue), and cues in more than cue_rho of a group are suppressed, so the "
                     "answers share the one 'no retained cue' cluster")
            fix = ("ask for step-by-step reasoning, or partition otherwise: cue_partition='judge' (an LLM judge) or "
                   "'callable' with partition_fn; a higher cue_epsilon splits answers that share only some cues")
        boost = f" with positive advantages × cue_tau ({args.cue_tau})" if args.cue_weighting == "cr" else ""
        warn_once(
            self,
            "cue_single_cluster",
            f"Cue-GRPO: in {rate:.0%} of the groups with two or more correct positive completions, these formed one "
            f"cluster, so their rarity weights were uniform and those groups got GRPO{boost} "
            f"(cue/single_cluster_rate logs the rate every step). Cause: {cause}. Fix: {fix}.",
        )

    def _local_rows(self, inputs, rows: set[int], offset: int, with_prompt: bool) -> list[tuple]:
        # (global row, completion text[, prompt]) of the wanted rows held by this process
        return [
            (offset + i, completion_text(c), _prompt_of(inputs[i])) if with_prompt else (offset + i, completion_text(c))
            # trl 1.16.0's _generate: (prompt_ids, completion_ids, tool_mask, completions, ...)
            for i, c in enumerate(self._rollout_capture.generated[3])
            if offset + i in rows
        ]

    def _partitions(self, inputs, positives, offset, group_size):
        """Cluster ids (per group, over its positive rows in row order), cleaned skeleton lengths for the singleton
        reset (cue/random only) and the judge parse-failure rate (judge only, else None)."""
        args = self.args
        if args.cue_partition not in ("cue", "random"):
            return self._external_partitions(inputs, positives, offset, group_size)
        partitions: dict[int, list[int]] = {}
        lengths: dict[int, list[int]] = {}
        rows = [row for members in positives.values() for row in members]
        texts = dict(gather_rows(self, self._local_rows(inputs, set(rows), offset, with_prompt=False)))
        skeletons = dict(zip(rows, extract_cues_batch([texts[row] for row in rows]), strict=True))
        for group, members in positives.items():
            cluster_ids, cleaned_lengths = partition_skeletons(
                [skeletons[row] for row in members], args.cue_rho, args.cue_epsilon
            )
            if args.cue_partition == "random":
                rng = random.Random(f"{args.seed}:{self.state.global_step}:{self._cue_round}:{group}")
                cluster_ids = random_partition(len(members), len(set(cluster_ids)), rng)
            partitions[group] = cluster_ids
            if args.cue_singleton_reset:
                lengths[group] = cleaned_lengths
        return partitions, lengths, None

    def _external_partitions(self, inputs, positives, offset, group_size):
        # Judge / user callable: groups with |P| <= 1 need no call (one cluster). The others are dealt
        # round-robin to processes; each process partitions its own groups, then the results are shared.
        args = self.args
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        partitions = {group: [0] * len(members) for group, members in positives.items()}
        to_partition = [group for group, members in positives.items() if len(members) > 1]
        mine = [group for j, group in enumerate(to_partition) if j % world == rank]

        # The judge sees every completion of the group (paper Appendix B) or only the positive ones.
        need_all = args.cue_partition == "judge" and args.cue_judge_completions == "all"

        def shown_rows(group: int) -> list[int]:
            return list(range(group * group_size, (group + 1) * group_size)) if need_all else list(positives[group])

        needed = {row for group in to_partition for row in shown_rows(group)}
        shared = gather_rows(self, self._local_rows(inputs, needed, offset, with_prompt=True))
        all_texts = {row: text for row, text, _ in shared}
        prompts = {row // group_size: prompt for row, _, prompt in shared}  # every row of a group has its prompt

        results: list[tuple[int, list[int], bool]] = []
        if args.cue_partition == "callable":
            for group in mine:
                members = positives[group]
                labels = self.partition_fn([all_texts[row] for row in members], prompts[group])
                labels = checked_partition_labels(self.partition_fn, labels, len(members))
                results.append((group, canonical_cluster_ids(labels), False))
        else:
            requests = []
            for group in mine:
                members = positives[group]
                shown = shown_rows(group)
                numbers = [shown.index(row) + 1 for row in members]
                messages = judge_messages(
                    _problem_text(prompts[group]),
                    [all_texts[row] for row in shown],
                    args.cue_judge_head_chars,
                    args.cue_judge_tail_chars,
                )
                requests.append((group, messages, len(shown), numbers))
            outputs = self._run_judge([messages for _, messages, _, _ in requests])
            for (group, _, num_shown, numbers), output in zip(requests, outputs, strict=True):
                labels = parse_judge_groups(output, num_shown)
                results.append((group, judge_partition(labels, numbers), labels is None))
        failures = 0
        for group, cluster_ids, failed in gather_rows(self, results):
            partitions[group] = cluster_ids
            failures += failed
        rate = failures / len(to_partition) if args.cue_partition == "judge" and to_partition else None
        return partitions, {}, rate

    def _run_judge(self, conversations: list[list[dict]]) -> list[str]:
        """Greedy judge answers, one per conversation (Appendix B: do_sample=False, max_new_tokens=512)."""
        args = self.args
        if self._judge_is_policy:
            # Collective: every process calls it once per round, also with nothing to judge.
            tokenizer = self.processing_class
            tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
            prefixes = [_chat_ids(tokenizer, messages) for messages in conversations]
            completions, _ = generate_from_prefixes(
                self, prefixes, greedy=True, max_new_tokens=args.cue_judge_max_new_tokens
            )
            return tokenizer.batch_decode(completions, skip_special_tokens=True)
        outputs: list[str] = []
        tokenizer, model = self.judge_tokenizer, self.judge_model
        for start in range(0, len(conversations), args.cue_judge_batch_size):
            batch = [_chat_text(tokenizer, m) for m in conversations[start : start + args.cue_judge_batch_size]]
            encoded = tokenizer(batch, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
            encoded = encoded.to(model.device)
            with torch.no_grad():
                generated = model.generate(
                    **encoded,
                    do_sample=False,
                    max_new_tokens=args.cue_judge_max_new_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                )
            outputs += tokenizer.batch_decode(generated[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
        return outputs


def positive_sets(
    advantages: torch.Tensor, correct: torch.Tensor, in_loss: torch.Tensor, varied: Sequence[bool], group_size: int
) -> tuple[dict[int, list[int]], float]:
    """The positive set P of every group that redistribution touches (rows in TRL's global order, groups of
    ``group_size`` consecutive rows): P = {i : correct_i and A_i > 0 and i reaches the loss}, in groups whose rewards
    vary. The paper's P = {A_i > 0} assumes a 0/1 verifier as the only reward, where the two agree; with several
    reward functions a wrong but well-formatted answer can have A_i > 0, and boosting its "rare strategy" would
    reward being wrong. A completion whose loss TRL masks (``mask_truncated_completions``) gets no gradient, so it
    must not occupy a cluster either. Returns ``(positives, excluded)``: groups with a non-empty P, and the fraction
    of A_i > 0 rows of varied groups left out of P (0 when there are none)."""
    values = advantages.tolist()
    correct, in_loss = correct.tolist(), in_loss.tolist()
    positives: dict[int, list[int]] = {}
    candidates = kept = 0
    for group, has_variance in enumerate(varied):
        if not has_variance:
            continue
        rows = [row for row in range(group * group_size, (group + 1) * group_size) if values[row] > 0]
        members = [row for row in rows if correct[row] and in_loss[row]]
        candidates += len(rows)
        kept += len(members)
        if members:
            positives[group] = members
    return positives, (candidates - kept) / candidates if candidates else 0.0


def checked_partition_labels(partition_fn, labels, num_completions: int) -> list:
    """The labels a user ``partition_fn`` returned, as a list, or a ValueError naming the function and what is wrong."""
    name = getattr(partition_fn, "__qualname__", None) or getattr(partition_fn, "__name__", None) or repr(partition_fn)
    expected = (f"CueGRPOTrainer(partition_fn={name}) must return one hashable cluster label per completion it is "
                f"given (a list of {num_completions} labels, e.g. ints or strings)")
    if labels is None:
        raise ValueError(f"{expected}; it returned None.")
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__iter__"):
        raise ValueError(f"{expected}; it returned {type(labels).__name__} {labels!r:.80}.")
    labels = list(labels)
    if len(labels) != num_completions:
        raise ValueError(f"{expected}; it returned {len(labels)} labels.")
    for position, label in enumerate(labels):
        try:
            hash(label)
        except TypeError:
            raise ValueError(
                f"{expected}; label {position} is a {type(label).__name__} ({label!r:.60}), which is not hashable "
                "(use e.g. a tuple or a string instead of a list)."
            ) from None
    return labels


def _check_partition_arguments(args: CueGRPOConfig, partition_fn, judge_model, judge_tokenizer) -> None:
    if args.cue_partition == "callable":
        if partition_fn is None or not callable(partition_fn):
            raise ValueError("cue_partition='callable' needs CueGRPOTrainer(partition_fn=fn), "
                             "fn(completions: list[str], prompt) -> one cluster label per completion")
    elif partition_fn is not None:
        raise ValueError(f"partition_fn was given but cue_partition={args.cue_partition!r}; "
                         "set CueGRPOConfig(cue_partition='callable') to use it")
    if args.cue_partition == "judge":
        if judge_model is None and not args.cue_judge_model:
            raise ValueError("cue_partition='judge' needs a judge: CueGRPOConfig(cue_judge_model=<name or path> | "
                             "'policy') or CueGRPOTrainer(judge_model=<model instance>)")
    elif judge_model is not None or judge_tokenizer is not None:
        raise ValueError(f"judge_model/judge_tokenizer were given but cue_partition={args.cue_partition!r}; "
                         "set CueGRPOConfig(cue_partition='judge') to use a judge")


def _prompt_of(example):
    return example.get("prompt") if isinstance(example, dict) else None


def _problem_text(prompt) -> str:
    """The problem shown to the judge: a plain-text prompt, or the user turns of a conversational one."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(
        completion_text([{**m, "role": "assistant"}]) for m in prompt if isinstance(m, dict) and m.get("role") == "user"
    )


def _chat_text(tokenizer, messages: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages) + "\n\nAnswer:\n"


def _chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    return tokenizer(_chat_text(tokenizer, messages), add_special_tokens=False)["input_ids"]
