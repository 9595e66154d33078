"""Cue-GRPO's part of the credit core: :class:`RarityWeights`, a modifier that multiplies the positive sequence
advantages of each group by rarity weights (docs/cue_grpo.md#positive-set).

Glue only; the math lives in :mod:`.cues`, :mod:`.partition`, :mod:`.weights` and :mod:`.judge`. After the credit
computed the advantages (GRPO's: TRL's group advantages of every row; a credit's of this process's rows are
gathered), it gathers the texts of the positive completions (from the batch record), computes each group's
partition and weights over the batch record's groups (:class:`~trl_credit.core.batch.RowBatch`), multiplies the
positive advantages and returns them in the layout it got (the core cuts global ones to this process's rows). The
loss, KL, clipping, importance sampling, ... are GRPO's, untouched.

With DATPO's trees (rollout ``trees``, credit ``blocks``) P and the weights come from the trees' leaf outcomes
(:meth:`RarityWeights.leaf_outcomes`, the outcome stage the core runs before the credit); ``cue_tree_credit`` decides
where they act: on the positive block advantages of the rows of P's leaves (``"rows"``, Cue-GRPO's rule, in
:meth:`RarityWeights.apply`), or on the leaf outcomes before the block Monte Carlo aggregation (``"leaves"``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from trl_credit.core.batch import RowBatch
from trl_credit.core.context import BatchContext
from trl_credit.core.registry import register_part
from trl_credit.core.setup import is_composed, outside_zero3_init, speaker, whole_copy
from trl_credit.core.trainer import Modifier
from trl_credit.tasks.rewards import completion_text
from .config import CueGRPOConfig, CueGRPOFields
from .cues import extract_cues_batch
from .judge import judge_messages, judge_partition, parse_judge_groups
from .partition import canonical_cluster_ids, partition_skeletons, random_partition
from .positive import (
    checked_partition_labels, leaf_advantages, positive_sets, reweighted_leaves, reweighted_rows, varied_groups,
)
from .weights import cluster_mass_slope, cluster_masses, compute_rarity_weights

__all__ = [
    "RarityWeights", "PartitionFn", "positive_sets", "varied_groups", "checked_partition_labels", "leaf_advantages",
    "reweighted_leaves", "reweighted_rows",
]

PartitionFn = Callable[[list[str], object], Sequence]


@register_part("modifiers", "cue", help="Cue-GRPO's rarity weights", fields=CueGRPOFields,
               check_after_grpo="_check_cue_grpo_composed")
class RarityWeights(Modifier):
    """Cue-GRPO's rarity-aware redistribution of positive sequence advantages.

    ``partition_fn`` (``cue_partition="callable"``), ``judge_model`` / ``judge_tokenizer`` (``cue_partition="judge"``)
    as :class:`~trl_credit.cue_grpo.CueGRPOTrainer` takes them; the rest comes from the trainer's
    :class:`CueGRPOConfig` (or a ``CreditConfig`` with ``modifiers=["cue"]``).

    The groups are the batch record's: with SRPO's resets, each base group and each reset group is partitioned on its
    own (fallback rows are in none). A suffix row's text is its whole completion (shared prefix + suffix, as TRL
    decoded and rewarded it): the strategy is that of the full solution, and cues of the shared prefix, common to
    the reset group, are suppressed by ``cue_rho`` like any common cue. The judge's problem is the dataset's prompt,
    not SRPO's rollout template."""

    name = "cue"
    acts_on_outcomes = True  # on DATPO's leaves (the core's outcome stage): leaf_outcomes

    def __init__(self, partition_fn: PartitionFn | None = None, judge_model=None, judge_tokenizer=None):
        self.partition_fn = partition_fn
        self._judge_source = (judge_model, judge_tokenizer)
        self.judge_model, self.judge_tokenizer = None, None
        self._judge_is_policy = False
        self._cue_round = 0  # generation rounds so far, identical on every process (seeds the random partition)
        # One batch's state lives in the context: ctx.scratch(self)["row_weights_on_trees"] (cue_tree_credit="rows":
        # rollout of a leaf of P -> its weight), from leaf_outcomes to apply.
        self.overhead_seconds: list[float] = []  # wall time of each redistribution (for benchmarks)

    def setup(self, trainer) -> None:
        args: CueGRPOConfig = trainer.args
        judge_model, judge_tokenizer = self._judge_source
        # CueGRPOTrainer checked these before loading the model; a composed trainer built this part itself (or took
        # it from the user), so the check runs here, before the first step could ignore or miss a partition source.
        owner = "RarityWeights" if is_composed(trainer) else type(trainer).__name__
        _check_partition_arguments(args, self.partition_fn, judge_model, judge_tokenizer, owner,
                                   type(args).__name__, speaker(trainer, self))
        self._judge_source = (None, None)
        self._judge_is_policy = args.cue_partition == "judge" and judge_model is None and args.cue_judge_model == "policy"
        if args.cue_partition == "judge" and not self._judge_is_policy:
            self.judge_model, self.judge_tokenizer = self._load_judge(trainer, judge_model, judge_tokenizer)

    # checkpoints: the round counter seeds the random partition, so a resumed run continues the count
    def rng_state(self) -> dict:
        return {"cue_round": self._cue_round}

    def set_rng_state(self, state: dict) -> None:
        self._cue_round = int(state["cue_round"])

    def _load_judge(self, trainer, judge_model, judge_tokenizer):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = judge_model if judge_model is not None else trainer.args.cue_judge_model
        if isinstance(source, str):
            dtype = trainer.args.cue_judge_dtype
            dtype = dtype if dtype == "auto" else getattr(torch, dtype)
            with outside_zero3_init():  # a whole frozen copy per process, not ZeRO-3 shards
                model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        else:  # loaded by the user: partitioned if a ZeRO-3 config was registered then
            model = whole_copy(source)
        model = model.to(trainer.accelerator.device).eval()
        model.requires_grad_(False)
        if judge_tokenizer is None:
            name = source if isinstance(source, str) else getattr(model, "name_or_path", None)
            if not name:
                raise ValueError("judge_tokenizer is required when judge_model is an instance without a name_or_path")
            judge_tokenizer = AutoTokenizer.from_pretrained(name)
        if judge_tokenizer.pad_token_id is None:
            judge_tokenizer.pad_token = judge_tokenizer.eos_token
        return model, judge_tokenizer

    # ------------------------------------------------------------------ redistribution

    def apply(self, ctx: BatchContext, batch: RowBatch, inputs, output: dict, advantages: torch.Tensor) -> torch.Tensor:
        """Sequence advantages ``(B,)``: A_i -> w_i A_i for i in P (docs/cue_grpo.md#positive-set). Per-token credit
        ``(B, T)`` (OPPO's): P is read from each row's sequence direction (``batch.sequence_signs``) and w_i scales
        the positive part of the row's credit, A_it -> w_i A_it where A_it > 0 (docs/composition.md). DATPO's trees
        (``advantages`` a :class:`~trl_credit.datpo.forest.ForestCredit`, ``batch.outcomes`` the leaves the core
        handed :meth:`leaf_outcomes`): with
        ``cue_tree_credit="rows"`` the positive block advantages of the rows of P's leaves are multiplied by their
        weights (:func:`~.positive.reweighted_rows`); with ``"leaves"`` a pass-through, the weights were applied to
        the leaf outcomes (:meth:`leaf_outcomes`).

        Sequence advantages may hold every row of the record (a credit over sub-groups computes them globally) or
        this process's rows (TRL's); the result keeps the layout it got, and the core cuts it once."""
        if batch.outcomes is not None or not torch.is_tensor(advantages):
            # DATPO's trees: P and the weights came from the leaf outcomes (leaf_outcomes, the core's outcome stage).
            if batch.outcomes is None:
                raise RuntimeError(
                    f"{ctx.speaker(self)}: Cue-GRPO's rarity weights on DATPO's trees are computed from the leaf "
                    "outcomes, but the rollout declared none (Rollout.outcomes) and the core did not call "
                    "RarityWeights.leaf_outcomes: use rollout='trees' with credit='blocks'."
                )
            row_weights = ctx.scratch(self).get("row_weights_on_trees", {})
            if ctx.args.cue_tree_credit == "rows":
                # The diversity bonus's gate was read from DATPO's A_base; w > 0 keeps every sign, so it holds.
                advantages.base = reweighted_rows(advantages.base, batch.outcomes.unit_rows, row_weights)
            return advantages
        start = time.perf_counter()
        if batch.completions is None:
            raise RuntimeError(f"{ctx.speaker(self)}: the batch record holds no completion texts (TRL's "
                               "_generate was not captured: did a subclass bypass it?)")
        # Rows whose loss TRL masks entirely (mask_truncated_completions): no gradient, so no strategy to credit.
        in_loss = ctx.gather((batch.loss_mask.sum(dim=1) > 0).long()).bool().cpu()
        # Every row already (GroupOutcome's, on TRL's groups or sub-groups): nothing to gather
        whole = batch.is_global(advantages)
        if advantages.dim() == 1:
            sequence = (advantages if whole else ctx.gather(advantages)).detach().double().cpu()
        elif batch.sequence_signs is not None:
            sequence = batch.sequence_signs.double().cpu()
        else:
            raise ValueError(f"{ctx.speaker(self)}: Cue-GRPO's rarity weights got per-token advantages from a "
                             "credit that gives no sequence "
                             "direction per row (RowBatch.sequence_signs).")
        if sequence.numel() != batch.num_rows:
            raise RuntimeError(f"{ctx.speaker(self)}: {sequence.numel()} advantages for a batch record of "
                               f"{batch.num_rows} rows")
        weights = self._row_weights(ctx, batch, inputs, sequence, in_loss)
        local_weights = (weights if whole else batch.local_rows(weights)).to(advantages.device)
        if advantages.dim() == 1:
            batch.log_advantages((sequence * weights).tolist())  # TRL's table shows GRPO's
            result = (advantages.double() * local_weights).to(advantages.dtype)
        else:
            scaled = (advantages.double() * local_weights.unsqueeze(1)).to(advantages.dtype)
            result = torch.where(advantages > 0, scaled, advantages)
        self.overhead_seconds.append(time.perf_counter() - start)
        return result

    def _row_weights(self, ctx: BatchContext, batch: RowBatch, inputs, advantages: torch.Tensor,
                     in_loss: torch.Tensor):
        """(N,) float64: each global row's rarity weight w_i (1 outside P), from the sequence advantages of every
        row (their sign decides P). Logs the cue/ metrics."""
        args = ctx.args
        groups = batch.groups()
        varied = varied_groups(batch, ctx.reward_weights, args.multi_objective_aggregation)
        # Unscorable rows are never correct (success_rows), so they never enter P.
        positives, excluded = positive_sets(advantages, batch.success, in_loss, varied, groups)
        texts = self._captured_texts(batch, inputs)
        return self._rarity_weights(ctx, positives, excluded, groups, texts, batch.num_rows)

    def leaf_outcomes(self, ctx: BatchContext, batch: RowBatch, leaves) -> torch.Tensor:
        """DATPO's trees (docs/composition.md): rarity weights on the leaf outcomes, before the block Monte Carlo
        aggregation (the core's outcome stage calls this with the :class:`~trl_credit.datpo.forest.LeafOutcomes` of
        the forest, and :class:`~trl_credit.datpo.parts.BlockCredit` aggregates what it returns).

        Within each tree (the prompt's group), the leaves are the base rollouts and the branches (each a full
        completion: prefix + branch), with their leaf rewards r_l. P = the leaves that are correct (the verifier),
        scorable and above the tree's mean leaf reward m (a positive outcome advantage r_l − m, m over the scorable
        leaves), in a tree whose leaf rewards vary, whose last block reaches the loss (not truncated under
        ``mask_truncated_completions``). P's completion texts are partitioned as a group's (``cue_partition``), the
        weights w_l come from ``compute_rarity_weights`` and each l in P gets r'_l = m + w_l (r_l − m); the other
        leaves keep r_l. Returns r' (L,), float64, with ``cue_tree_credit="leaves"``; with ``"rows"`` (Cue-GRPO's
        rule) it returns r unchanged and keeps the weights for :meth:`apply`, which scales the positive block
        advantages of the rows of P's leaves. Logs the cue/ metrics over the trees."""
        start = time.perf_counter()
        advantages, varied = leaf_advantages(leaves.rewards, leaves.groups)
        positives, excluded = positive_sets(advantages, leaves.correct, leaves.in_loss, varied, leaves.groups)
        weights = self._rarity_weights(ctx, positives, excluded, leaves.groups, leaves.local_texts,
                                       len(leaves.rewards))
        if ctx.args.cue_tree_credit == "rows":
            ctx.scratch(self)["row_weights_on_trees"] = {
                row: float(w) for row, w in zip(leaves.rows, weights.tolist()) if w != 1.0
            }
            rewards = leaves.rewards
        else:
            rewards = reweighted_leaves(leaves.rewards, advantages, weights)
        self.overhead_seconds.append(time.perf_counter() - start)
        return rewards

    def _rarity_weights(self, ctx: BatchContext, positives, excluded, groups, local_texts, num_rows) -> torch.Tensor:
        """(num_rows,) float64: the rarity weight of each row of P (``positives``: group -> its rows), 1 elsewhere.
        ``local_texts``: row -> (completion text, prompt) of this process's rows (:meth:`_partitions`). Logs the cue/
        metrics over ``groups``."""
        args = ctx.args
        self._cue_round += 1
        ctx.metric("cue/frac_positive_advantage_excluded", excluded)
        if excluded == 1.0:
            ctx.warn(
                "cue_no_correct_positive",
                f"{ctx.speaker(self)} found completions with A_i > 0 but none of them correct (or all with a "
                "masked loss), so "
                "this step was plain GRPO. Correct means the `success_reward` function "
                f"({ctx.success_reward_name!r}) returned >= success_threshold "
                f"({args.success_threshold}): check both if your verifier is not that function or not 0/1. "
                "`cue/frac_positive_advantage_excluded` logs the rate every step.",
            )
        partitions, lengths, parse_failures = self._partitions(ctx, positives, groups, local_texts)

        weights = torch.ones(num_rows, dtype=torch.float64)
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
                weights[row] = weight
            clusters_per_group.append(len(set(partitions[group])))
            spreads.append(max(result.weights) - min(result.weights))
            nonuniform += spreads[-1] > 1e-9
            for size, mass in cluster_masses(partitions[group], result.prefloor):
                sizes.append(size)
                masses.append(mass)

        num_groups = len(groups)
        if positives:
            ctx.metric("cue/clusters_per_group", sum(clusters_per_group) / len(clusters_per_group))
            ctx.metric("cue/weight_spread", sum(spreads) / len(spreads))
        ctx.metric("cue/frac_groups_nonuniform", nonuniform / num_groups)
        ctx.metric("cue/frac_groups_redistributed", len(positives) / num_groups)
        self._log_single_clusters(ctx, positives, partitions)
        slope = cluster_mass_slope(sizes, masses)
        if slope == slope:  # defined only with two distinct cluster sizes in the step
            ctx.metric("cue/mass_slope", slope)
        if parse_failures is not None:
            ctx.metric("cue/judge_parse_failure_rate", parse_failures)
        return weights

    def _log_single_clusters(self, ctx: BatchContext, positives, partitions) -> None:
        """``cue/single_cluster_rate``: the share of groups with two or more positives whose positives all fall in
        one cluster, so their rarity weights are uniform (GRPO; with ``cr``, the positive advantages × τ). A group
        with one positive has nothing to partition and does not count; ``uniform_boost`` does not cluster at all."""
        args = ctx.args
        multi = [group for group, members in positives.items() if len(members) > 1]
        if not multi or args.cue_weighting == "uniform_boost":
            return
        rate = sum(len(set(partitions[group])) == 1 for group in multi) / len(multi)
        ctx.metric("cue/single_cluster_rate", rate)
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
        ctx.warn(
            "cue_single_cluster",
            f"{ctx.speaker(self)}: in {rate:.0%} of the groups with two or more correct positive completions, "
            "these formed one "
            f"cluster, so their rarity weights were uniform and those groups got GRPO{boost} "
            f"(cue/single_cluster_rate logs the rate every step). Cause: {cause}. Fix: {fix}.",
        )

    @staticmethod
    def _captured_texts(batch: RowBatch, inputs) -> dict[int, tuple[str, object]]:
        """Global row -> (completion text, prompt) of this process's rows: the record's texts, and the dataset's
        prompt (the judge's problem, not a rollout template's)."""
        offset = batch.local.start
        return {offset + i: (text, _prompt_of(inputs[i])) for i, text in enumerate(batch.completions)}

    def _partitions(self, ctx: BatchContext, positives, groups, local_texts):
        """Cluster ids (per group, over its positive rows in row order), cleaned skeleton lengths for the singleton
        reset (cue/random only) and the judge parse-failure rate (judge only, else None). ``positives``: group ->
        its rows in P; ``groups``: group -> all its rows (the judge may see them all); ``local_texts``: row ->
        (completion text, prompt) of the rows this process holds (every process partitions from the gathered
        texts of the rows it needs)."""
        args = ctx.args
        if args.cue_partition not in ("cue", "random"):
            return self._external_partitions(ctx, positives, groups, local_texts)
        partitions: dict[int, list[int]] = {}
        lengths: dict[int, list[int]] = {}
        rows = [row for members in positives.values() for row in members]
        texts = dict(ctx.gather_rows(_texts_of(local_texts, set(rows), with_prompt=False)))
        skeletons = dict(zip(rows, extract_cues_batch([texts[row] for row in rows]), strict=True))
        for group, members in positives.items():
            cluster_ids, cleaned_lengths = partition_skeletons(
                [skeletons[row] for row in members], args.cue_rho, args.cue_epsilon
            )
            if args.cue_partition == "random":
                rng = ctx.rng(self._cue_round, group)  # random.Random("seed:step:round:group")
                cluster_ids = random_partition(len(members), len(set(cluster_ids)), rng)
            partitions[group] = cluster_ids
            if args.cue_singleton_reset:
                lengths[group] = cleaned_lengths
        return partitions, lengths, None

    def _external_partitions(self, ctx: BatchContext, positives, groups, local_texts):
        # Judge / user callable: groups with |P| <= 1 need no call (one cluster). The others are dealt
        # round-robin to processes; each process partitions its own groups, then the results are shared.
        args = ctx.args
        world, rank = ctx.num_processes, ctx.process_index
        partitions = {group: [0] * len(members) for group, members in positives.items()}
        to_partition = [group for group, members in positives.items() if len(members) > 1]
        mine = [group for j, group in enumerate(to_partition) if j % world == rank]

        # The judge sees every completion of the group (paper Appendix B) or only the positive ones.
        need_all = args.cue_partition == "judge" and args.cue_judge_completions == "all"

        def shown_rows(group: int) -> list[int]:
            return list(groups[group]) if need_all else list(positives[group])

        needed = {row for group in to_partition for row in shown_rows(group)}
        shared = ctx.gather_rows(_texts_of(local_texts, needed, with_prompt=True))
        all_texts = {row: text for row, text, _ in shared}
        group_of = {row: group for group, rows in groups.items() for row in rows}
        prompts = {group_of[row]: prompt for row, _, prompt in shared}  # every row of a group has its prompt

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
            outputs = self._run_judge(ctx, [messages for _, messages, _, _ in requests])
            for (group, _, num_shown, numbers), output in zip(requests, outputs, strict=True):
                labels = parse_judge_groups(output, num_shown)
                results.append((group, judge_partition(labels, numbers), labels is None))
        failures = 0
        for group, cluster_ids, failed in ctx.gather_rows(results):
            partitions[group] = cluster_ids
            failures += failed
        rate = failures / len(to_partition) if args.cue_partition == "judge" and to_partition else None
        return partitions, {}, rate

    def _run_judge(self, ctx: BatchContext, conversations: list[list[dict]]) -> list[str]:
        """Greedy judge answers, one per conversation (Appendix B: do_sample=False, max_new_tokens=512)."""
        args = ctx.args
        if self._judge_is_policy:
            # Collective: every process calls it once per round, also with nothing to judge.
            tokenizer = ctx.processing_class
            tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
            prefixes = [_chat_ids(tokenizer, messages) for messages in conversations]
            completions, _ = ctx.generate(prefixes, greedy=True, max_new_tokens=args.cue_judge_max_new_tokens)
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
                    # A whole copy per process: no collective. transformers turns synced_gpus on whenever ZeRO-3
                    # runs with several processes, and processes judge different numbers of groups: it would hang.
                    synced_gpus=False,
                )
            outputs += tokenizer.batch_decode(generated[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
        return outputs



def _check_partition_arguments(args: CueGRPOConfig, partition_fn, judge_model, judge_tokenizer,
                               owner: str = "CueGRPOTrainer", config: str = "CueGRPOConfig",
                               who: str | None = None) -> None:
    """The partition source the config selects has what it needs, and nothing is given that it would ignore.
    ``owner`` / ``config``: how the user passed the objects and the config (the preset's names, or
    ``RarityWeights`` and the config class of a composed trainer); ``who``: who refuses (``trainer_setup.speaker``,
    default ``owner``)."""
    who = who or owner
    if args.cue_partition == "callable":
        if partition_fn is None or not callable(partition_fn):
            raise ValueError(f"{who}: cue_partition='callable' needs {owner}(partition_fn=fn), "
                             "fn(completions: list[str], prompt) -> one cluster label per completion")
    elif partition_fn is not None:
        raise ValueError(f"{who}: partition_fn was given but cue_partition={args.cue_partition!r}; "
                         f"set {config}(cue_partition='callable') to use it")
    if args.cue_partition == "judge":
        if judge_model is None and not args.cue_judge_model:
            raise ValueError(f"{who}: cue_partition='judge' needs a judge: {config}(cue_judge_model=<name or path> | "
                             f"'policy') or {owner}(judge_model=<model instance>)")
    elif judge_model is not None or judge_tokenizer is not None:
        raise ValueError(f"{who}: judge_model/judge_tokenizer were given but cue_partition={args.cue_partition!r}; "
                         f"set {config}(cue_partition='judge') to use a judge")


def _texts_of(local_texts: dict[int, tuple[str, object]], rows: set[int], with_prompt: bool) -> list[tuple]:
    # (row, completion text[, prompt]) of the wanted rows this process holds
    return [(row, text, prompt) if with_prompt else (row, text)
            for row, (text, prompt) in local_texts.items() if row in rows]


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
