"""SRPOTrainer: GRPOTrainer with SRPO / RRPO reset-and-resample rollouts (docs/srpo.md, paper §4, Algorithm 2).

How it hooks into TRL 1.16.0's GRPOTrainer (everything else - tokenizing, reward calls, log-prob passes, loss,
vLLM / DeepSpeed / PEFT handling - is TRL's):

- Rollouts: the trainer installs its own rollout function on TRL's ``rollout_func`` hook (users cannot pass one).
  TRL's ``_generate`` calls it with this process's prompt rows; it returns, for every prompt (``num_generations``
  consecutive rows, all on this process), the base rows then the shared-prefix rows, and an ``env_mask`` (TRL's
  ``tool_mask``) that is 0 on each shared-prefix row's prefix and on fallback rows. TRL then decodes, scores,
  computes log-probs and masks the loss with it. Every generation goes through ``generate_from_prefixes``
  (``_generate_single_turn``), so HF generate and vLLM both work; every call is collective and made the same
  number of times on every process.
- Rewards: ``_calculate_rewards`` is wrapped to capture the global rewards of the batch; seed candidates are scored
  through TRL's ``_calculate_rewards`` too (padded to the same row count on every process, because it ends with a
  ``gather``), with reward-function side logs discarded.
- Advantages: ``_generate_and_score_completions`` is wrapped: after ``super()``, ``output["advantages"]`` is
  replaced by group-relative advantages within each sub-group (base group, each shared-prefix group; docs/srpo.md#advantages).
- Evaluation (``model.eval()``): plain iid generation from the wrapped prompts and TRL's GRPO advantages.
"""

from __future__ import annotations

import math
import random
import textwrap
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from trl import GRPOTrainer

from trl_credit._trl import (
    bind_success,
    check_single_turn,
    gather_counts,
    generate_from_prefixes,
    log_metric,
    nonfinite_reward_groups,
    refuse_empty_completions,
    resolve_method_args,
    rewards_of_extra_rows,
    rollout_success,
)
from trl_credit.model_card import MethodModelCardMixin
from trl_credit.srpo.advantages import grouped_advantages, normalize_then_sum_advantages, srpo_group_ids
from trl_credit.srpo.config import SRPOConfig
from trl_credit.srpo.localization import LocalizationQuality, checked_step, resolve_step_checker
from trl_credit.srpo.localize import localize
from trl_credit.srpo.prompts import check_prompt_format, question_of, resolve_rollout_template, wrap_prompt
from trl_credit.srpo.resets import (
    ROW_BASE, ROW_FALLBACK, ROW_SUFFIX, Reset, incorrect_indices, prompt_rows, random_reset_step,
)
from trl_credit.srpo.step_metrics import StepStats, log_step_stats
from trl_credit.srpo.thoughts import reset_prefix_length, split_thoughts, thought_texts
from trl_credit.success import total_rewards, unscorable_rows

__all__ = ["SRPOTrainer"]


class SRPOTrainer(MethodModelCardMixin, GRPOTrainer):
    """Self-Reset (``reset="self"``), Random-Reset (``reset="random"``) and oracle-reset (``reset="oracle"``)
    Policy Optimization on top of GRPOTrainer.

    Per prompt and training step (paper §4.2, Algorithm 2): a base group of iid rollouts; seed candidates sampled
    in rounds until the prompt has ``reset_groups`` incorrect rollouts (never part of the base group); for each
    seed a reset thought h* (SRPO: the policy's own localization of the first erroneous thought, scored or greedy
    decoded, see ``SRPOConfig.localization``; RRPO: uniform; oracle: the step checker's first wrong thought);
    ``suffixes_per_reset`` suffixes resampled from the reset state ``question + thoughts 1..h*-1``, trained with the
    prefix masked out. Without an incorrect seed the reset group falls back to GRPO on the base group (its rows get
    zero advantage and zero loss mask).

    ``step_checker``: a callable ``(question, thoughts) -> int | None`` (the 1-indexed first wrong thought, None when
    none is wrong; ``question`` is the prompt's last user message before the rollout template wraps it) overriding
    ``SRPOConfig.step_checker``. Needed by ``reset="oracle"``; with any reset mode it adds the localization quality
    metrics. The ``srpo/`` metrics are listed in docs/srpo.md#metrics (srpo/step_metrics.py logs them).
    """

    _tag_names = ["trl", "srpo", "rrpo", "trl_credit"]
    _name = "SRPO"
    _paper = {
        "title": "Credit Assignment with Resets in Language Model Reasoning",
        "id": "2605.25507",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{samanta2026credit,
                title        = {{Credit Assignment with Resets in Language Model Reasoning}},
                author       = {Ankur Samanta and Akshayaa Magesh and Ayush Jain and Youliang Yu and Daniel Jiang and Kavosh Asadi and Kaveh Hassani and Paul Sajda and Jalaj Bhandari and Yonathan Efroni},
                year         = 2026,
                eprint       = {arXiv:2605.25507},
            }"""),
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: SRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        step_checker: Callable[[str, list[str]], int | None] | None = None,
        **kwargs,
    ):
        args = resolve_method_args(args, SRPOConfig, model, "SRPOTrainer", "SRPO")
        if kwargs.get("environment_factory") is not None:
            raise ValueError("SRPOTrainer does not support `environment_factory`.")
        if reward_funcs is None:
            # TRL's wording, so scripts and tests that match it keep working.
            raise ValueError(
                "No reward source provided. Pass `reward_funcs`: SRPOTrainer's seeds are the rollouts the "
                "`success_reward` function scores as incorrect."
            )
        super().__init__(
            model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
            processing_class=processing_class, reward_processing_classes=reward_processing_classes,
            callbacks=callbacks, optimizers=optimizers, peft_config=peft_config, **kwargs,
        )
        check_single_turn(self, "SRPOTrainer")
        bind_success(self)
        per_process = args.per_device_train_batch_size * args.steps_per_generation
        if per_process % self.num_generations != 0:
            raise ValueError(
                f"SRPOTrainer needs whole prompt groups on each process: per_device_train_batch_size * "
                f"steps_per_generation ({per_process}) must be a multiple of num_generations ({self.num_generations})."
            )
        self._rollout_template = resolve_rollout_template(args.rollout_template)
        check_prompt_format(train_dataset, self._rollout_template)
        # question + thoughts -> first wrong thought (srpo/localization.py): oracle resets and quality metrics.
        self._step_checker = resolve_step_checker(step_checker if step_checker is not None else args.step_checker)
        if args.reset == "oracle" and self._step_checker is None:
            raise ValueError(
                "reset='oracle' needs a step checker: pass SRPOTrainer(step_checker=callable) (question, thoughts "
                "-> 1-indexed first wrong thought or None) or set SRPOConfig.step_checker to a named one ('chain')."
            )
        seed = args.seed if args.reset_seed is None else args.reset_seed
        # One generator per process (different streams), deterministic in the seed.
        self._reset_rng = random.Random(1_000_003 * int(seed) + self.accelerator.process_index)
        self._srpo_inputs: list[dict] | None = None
        self._srpo_row_kinds: list[int] | None = None
        self._srpo_row_clean: list[int] | None = None
        self._srpo_rewards_per_func: torch.Tensor | None = None
        # TRL's custom-rollout hook: GRPOTrainer._generate calls it and handles everything downstream.
        self.rollout_func = self._srpo_rollout

    # ------------------------------------------------------------------ checkpoints (MethodRNGStateMixin)

    def _method_rng_state(self) -> dict:
        version, internal, gauss_next = self._reset_rng.getstate()
        return {"reset_rng": [version, list(internal), gauss_next]}

    def _set_method_rng_state(self, state: dict) -> None:
        version, internal, gauss_next = state["reset_rng"]
        self._reset_rng.setstate((version, tuple(internal), gauss_next))

    # ------------------------------------------------------------------ TRL hooks

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._srpo_rewards_per_func = rewards_per_func  # global (all processes), for the sub-group advantages
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._srpo_inputs = inputs
        self._srpo_row_kinds = None
        self._srpo_rewards_per_func = None
        output = super()._generate_and_score_completions(inputs)
        if self._srpo_row_kinds is not None:  # training step with SRPO rollouts
            output["advantages"] = self._srpo_advantages(output["advantages"])
        self._srpo_inputs = None
        self._log_credit(output)  # suffix rows show their shared prefix struck (tool_mask 0)
        return output

    # ------------------------------------------------------------------ rollouts

    def _srpo_rollout(self, prompts: list, trainer=None) -> dict[str, Any]:
        wrapped = [wrap_prompt(prompt, self._rollout_template) for prompt in prompts]
        if not self.model.training:
            # Evaluation: iid rollouts from the thought-MDP prompt, as GRPO would sample them.
            prompt_ids = [list(ids) for ids in self._tokenize_prompts(wrapped)[0]]
            completion_ids, logprobs = self._generate_single_turn(prompt_ids, None, {}, self.num_generations_eval)
            return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}
        return self._reset_and_resample(prompts, wrapped)

    def _reset_and_resample(self, prompts: list, wrapped: list) -> dict[str, Any]:
        """One training step's rollouts (paper Algorithm 2): seeds, a reset per seed, suffixes, the rows TRL trains
        on. Collective: every process makes the same generation, reward and scoring calls."""
        group_prompts, group_inputs, prompt_ids = self._prompt_groups(prompts, wrapped)
        stats = StepStats(prompts=len(prompt_ids), reset_groups=len(prompt_ids) * self.args.reset_groups)
        base, candidates, seeds, rounds = self._sample_seeds(group_prompts, group_inputs, prompt_ids, stats)
        resets = self._choose_resets(seeds, group_prompts, stats)
        suffixes, suffix_logprobs = self._resample(resets, prompt_ids, stats)
        output = self._training_rows(base, candidates, seeds, resets, suffixes, suffix_logprobs, prompt_ids)
        args: SRPOConfig = self.args
        paper_mode = args.localization == "generate" and args.localization_fallback == "random"
        log_sources = args.reset == "self" and not paper_mode  # paper's mode: the parse rate is the split
        log_step_stats(self, stats, rounds, log_sources, self._step_checker is not None)
        return output

    def _prompt_groups(self, prompts: list, wrapped: list) -> tuple[list, list, list[list[int]]]:
        """Per prompt group (``num_generations`` consecutive rows): the prompt, its input row and its token ids."""
        size = self.num_generations
        if len(prompts) % size != 0:
            raise RuntimeError(f"SRPOTrainer got {len(prompts)} prompt rows, not a multiple of num_generations={size}.")
        num_groups = len(prompts) // size
        for group in range(num_groups):
            if any(prompt != prompts[group * size] for prompt in prompts[group * size : (group + 1) * size]):
                raise RuntimeError(
                    "SRPOTrainer needs the num_generations rows of a prompt consecutive on one process (TRL's "
                    "RepeatSampler layout); this batch mixes prompts inside a group."
                )
        group_prompts = [prompts[g * size] for g in range(num_groups)]
        group_inputs = [self._srpo_inputs[g * size] for g in range(num_groups)]
        tokenized = self._tokenize_prompts([wrapped[g * size] for g in range(num_groups)])[0]
        return group_prompts, group_inputs, [list(map(int, ids)) for ids in tokenized]

    def _sample_seeds(self, group_prompts, group_inputs, prompt_ids, stats: StepStats):
        """The base groups, the seed candidates and the seeds: the first ``reset_groups`` incorrect rollouts per
        prompt in sampling order (paper §4.2): fresh candidates in rounds, or (seed_source="base", Appendix D) the
        base group's own rollouts. Returns ``(base, candidates, seeds, rounds)``, each a list per prompt."""
        args: SRPOConfig = self.args
        num_groups, base_size, num_resets = len(prompt_ids), args.num_base_generations, args.reset_groups
        from_base = args.seed_source == "base"
        per_round = 0 if from_base else args.seed_candidates_per_round
        # Round 1: the base group and the first seed candidates, in one generation call.
        completions, logprobs = generate_from_prefixes(
            self, [prompt_ids[g] for g in range(num_groups) for _ in range(base_size + per_round)]
        )
        rollouts = [(ids, logprobs[i] if logprobs is not None else None) for i, ids in enumerate(completions)]
        width = base_size + per_round
        base = [rollouts[g * width : g * width + base_size] for g in range(num_groups)]
        candidates = [rollouts[g * width + base_size : (g + 1) * width] for g in range(num_groups)]
        # A real row for padding collective reward calls.
        self._srpo_dummy = (0, (base[0] if from_base else candidates[0])[0][0])
        seeds: list[list] = [[] for _ in range(num_groups)]
        batch = (group_prompts, group_inputs, prompt_ids, seeds, num_resets)
        first_round = [(g, c) for g in range(num_groups) for c in (base[g] if from_base else candidates[g])]
        stats.empty_candidates += self._collect_seeds(first_round, *batch)
        stats.scored_candidates += len(first_round)
        rounds = 0 if from_base else 1
        while not from_base and rounds < args.max_seed_rounds:
            needy = [g for g in range(num_groups) if len(seeds[g]) < num_resets]
            if sum(gather_counts(self, len(needy))) == 0:
                break  # every process is done: all stop together
            owners = [g for g in needy for _ in range(per_round)]
            new_completions, new_logprobs = generate_from_prefixes(self, [prompt_ids[g] for g in owners])
            new_rollouts = []
            for i, g in enumerate(owners):
                rollout = (new_completions[i], new_logprobs[i] if new_logprobs is not None else None)
                candidates[g].append(rollout)
                new_rollouts.append((g, rollout))
            stats.empty_candidates += self._collect_seeds(new_rollouts, *batch)
            stats.scored_candidates += len(new_rollouts)
            rounds += 1
        stats.seeds = sum(len(s) for s in seeds)
        stats.base_tokens = sum(len(ids) for g in range(num_groups) for ids, _ in base[g])
        stats.seed_tokens = sum(len(ids) for g in range(num_groups) for ids, _ in candidates[g])
        stats.iid_rollouts = sum(len(base[g]) + len(candidates[g]) for g in range(num_groups))
        return base, candidates, seeds, rounds

    def _choose_resets(self, seeds, group_prompts, stats: StepStats) -> list[Reset]:
        """h* for every seed (paper §4.2): SRPO asks the policy (``_localize``), RRPO draws uniformly, the oracle
        asks the step checker. A one-thought seed resets at the question (h* = 1). Logs quality with a checker."""
        args: SRPOConfig = self.args
        tokenizer, delimiter = self._tokenizer, args.thought_delimiter
        resets = []
        for g, group_seeds in enumerate(seeds):
            for ids, logprobs in group_seeds:
                resets.append(Reset(g, ids, logprobs, split_thoughts(ids, tokenizer, delimiter)))
        checker = self._step_checker
        if checker is not None or args.reset != "random":
            for reset in resets:
                reset.texts = thought_texts(reset.ids, reset.ends, tokenizer, delimiter)
        if checker is not None:
            for reset in resets:
                reset.oracle = checked_step(checker, question_of(group_prompts[reset.group]), reset.texts)
        if args.reset == "self":
            for reset in resets:
                if len(reset.ends) == 1:
                    reset.step = 1  # one thought: the only reset state is the question
            localize(self, [r for r in resets if r.step is None], group_prompts, stats)
        elif args.reset == "oracle":
            for reset in resets:
                stats.oracle_attempts += 1
                stats.oracle_misses += reset.oracle is None
                if reset.oracle is None:  # the checker finds no wrong thought: degrade to RRPO's draw (logged)
                    reset.step, reset.source = random_reset_step(len(reset.ends), self._reset_rng), "random"
                else:
                    reset.step, reset.source = reset.oracle, "oracle"
        else:
            for reset in resets:
                reset.step, reset.source = random_reset_step(len(reset.ends), self._reset_rng), "random"
        quality = LocalizationQuality()
        for reset in resets:
            stats.position_sum += (reset.step - 1) / len(reset.ends)
            stats.at_question += reset.step == 1
            stats.single_thought += len(reset.ends) == 1
            stats.thoughts_sum += len(reset.ends)
            if checker is not None:
                quality.add(reset.step, reset.oracle)
        stats.add_quality(quality)
        return resets

    def _resample(self, resets: list[Reset], prompt_ids, stats: StepStats):
        """``suffixes_per_reset`` iid continuations of every reset state x* = question + thoughts 1..h*-1, each
        with the budget ``max_completion_length`` minus its prefix, so prefix + suffix fits the row."""
        num_suffixes, max_length = self.args.suffixes_per_reset, self.args.max_completion_length
        rows, budgets = [], []
        for reset in resets:
            keep = reset_prefix_length(reset.ends, reset.step)
            rows += [prompt_ids[reset.group] + reset.ids[:keep]] * num_suffixes
            budgets += [max(1, max_length - keep) if max_length is not None else None] * num_suffixes
        suffixes, logprobs = generate_from_prefixes(
            self, rows, max_new_tokens=budgets if max_length is not None else None
        )
        refuse_empty_completions(self, suffixes, "the generation of suffixes")  # training rows, as TRL's own
        stats.suffix_tokens = sum(len(ids) for ids in suffixes)
        return suffixes, logprobs

    def _training_rows(self, base, candidates, seeds, resets, suffixes, suffix_logprobs, prompt_ids) -> dict:
        """The rows TRL trains on: per prompt, base rows then each reset group's rows (``prompt_rows``), with the
        loss mask as ``env_mask``. Records each row's kind and, with a step checker, whether a suffix row's reset
        prefix is clean (1), erroneous (0) or unknown (-1) for the split correction rates."""
        args: SRPOConfig = self.args
        num_suffixes, max_length = args.suffixes_per_reset, args.max_completion_length
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
        kinds, clean, cursor = [], [], 0
        for g in range(len(prompt_ids)):
            slots, slot_clean = [], []
            for slot in range(args.reset_groups):
                if slot >= len(seeds[g]):
                    slots.append(None)  # no incorrect seed: fallback rows
                    continue
                reset, first = resets[cursor], cursor * num_suffixes
                keep = reset_prefix_length(reset.ends, reset.step)
                rollouts = [
                    (suffixes[row], suffix_logprobs[row] if suffix_logprobs is not None else None)
                    for row in range(first, first + num_suffixes)
                ]
                prefix_logprobs = reset.logprobs[:keep] if reset.logprobs is not None else None
                slots.append((reset.ids[:keep], prefix_logprobs, rollouts))
                slot_clean.append(-1 if reset.oracle is None else int(reset.step <= reset.oracle))
                cursor += 1
            # The fallback filler is a rollout already sampled with no incorrect verdict (the last non-empty
            # candidate).
            filler = next((c for c in reversed(candidates[g]) if c[0]), None) or base[g][-1]
            suffix_flags = iter(flag for flag in slot_clean for _ in range(num_suffixes))
            for completion, mask, lps, kind in prompt_rows(base[g], slots, num_suffixes, filler, max_length):
                for key, value in zip(out, (prompt_ids[g], completion, lps, mask)):
                    out[key].append(value)
                kinds.append(kind)
                clean.append(next(suffix_flags) if kind == ROW_SUFFIX else -1)
        self._srpo_row_kinds, self._srpo_row_clean = kinds, clean
        if all(lps is None for lps in out["logprobs"]):  # HF generate: no sampling log-probs
            out["logprobs"] = None
        return out

    def _collect_seeds(self, rollouts, group_prompts, group_inputs, prompt_ids, seeds, num_resets) -> int:
        """Score ``rollouts`` (``[(group, (ids, logprobs))]``, in sampling order) and append each group's incorrect
        ones to ``seeds[group]`` until it holds ``num_resets``. An empty rollout (0 tokens) has no thought to reset
        from: never a seed. Returns the number of empty rollouts. Collective (reward call)."""
        verifier = self._verifier_rewards(
            [g for g, _ in rollouts], [r[0] for _, r in rollouts], group_prompts, group_inputs, prompt_ids
        )
        empty = [index for index, (_, (ids, _)) in enumerate(rollouts) if len(ids) == 0]
        for index in empty:
            verifier[index] = math.nan  # neither correct nor incorrect: never a seed
        by_group: dict[int, list[int]] = defaultdict(list)
        for index, (g, _) in enumerate(rollouts):
            by_group[g].append(index)
        for g, indices in by_group.items():
            room = num_resets - len(seeds[g])
            if room <= 0:
                continue
            for position in incorrect_indices([verifier[i] for i in indices], self.args.success_threshold, room):
                seeds[g].append(rollouts[indices[position]][1])
        return len(empty)

    def _verifier_rewards(self, row_groups, completion_ids, group_prompts, group_inputs, prompt_ids) -> list[float]:
        """Raw reward of the ``success_reward`` function (NaN when it returned None) for this process's seed
        candidates, through TRL's reward path (``rewards_of_extra_rows``, a collective call padded with a real
        rollout), so every reward function runs with its kwargs as for the batch."""
        dummy_group, dummy_ids = self._srpo_dummy
        per_process = rewards_of_extra_rows(
            self,
            [group_inputs[g] for g in row_groups],
            [group_prompts[g] for g in row_groups],
            [prompt_ids[g] for g in row_groups],
            completion_ids,
            filler=(group_inputs[dummy_group], group_prompts[dummy_group], prompt_ids[dummy_group], dummy_ids),
        )
        mine = per_process[self.accelerator.process_index]
        return mine[:, self._success_index].tolist()

    # ------------------------------------------------------------------ advantages

    def _srpo_advantages(self, trl_advantages: torch.Tensor) -> torch.Tensor:
        """Group-relative advantages within each sub-group (paper §4.3) from the captured global rewards: of TRL's
        weighted total reward (``sum_then_normalize``), or of each reward function, then summed
        (``normalize_then_sum``); fallback and unscorable rows get 0 and stay out of every statistic. Also logs the
        verifier's pass rates and fixes TRL's logged advantages."""
        device = trl_advantages.device
        rewards_per_func = self._srpo_rewards_per_func
        rewards = total_rewards(rewards_per_func, self.reward_weights)  # NaN when unscorable
        local_kinds = torch.tensor(self._srpo_row_kinds, dtype=torch.long, device=device)
        kinds = self.accelerator.gather(local_kinds)
        if kinds.numel() != rewards.numel():
            raise RuntimeError(f"SRPOTrainer: {kinds.numel()} row kinds for {rewards.numel()} rewards.")
        args: SRPOConfig = self.args
        num_prompts = rewards.numel() // self.num_generations
        group_ids = srpo_group_ids(num_prompts, args.num_base_generations, args.reset_groups, args.suffixes_per_reset)
        valid = (kinds != ROW_FALLBACK).cpu()  # fallback rows: zero advantage, outside every group's statistics
        # a sub-group with a ±inf reward gets 0 (as TRL's GRPO; grouped_advantages): say so
        nonfinite_reward_groups(self, rewards_per_func[valid.to(rewards_per_func.device)],
                                torch.tensor(group_ids)[valid], "srpo/nonfinite_reward_rate")
        if args.multi_objective_aggregation == "normalize_then_sum":
            # Each reward function z-scored within each sub-group, weighted sum, one batch-wide rescale (TRL's GDPO).
            advantages = normalize_then_sum_advantages(rewards_per_func, group_ids, self.reward_weights, valid=valid)
        else:
            advantages = grouped_advantages(rewards, group_ids, scale=self.scale_rewards, valid=valid)
        advantages = advantages.to(device)

        # Pass rates: what the verifier says (success_reward), over the scorable rows of each kind.
        kinds_cpu = kinds.cpu()
        correct = rollout_success(self, rewards_per_func).cpu()
        scorable = ~unscorable_rows(rewards_per_func).cpu()
        suffix_rows = (kinds_cpu == ROW_SUFFIX) & scorable
        if suffix_rows.any():
            log_metric(self, "srpo/correction_rate", correct[suffix_rows].float().mean().item())
        if self._step_checker is not None:  # the correction rate split by a clean / erroneous reset prefix
            local_clean = torch.tensor(self._srpo_row_clean, dtype=torch.long, device=device)
            clean = self.accelerator.gather(local_clean).cpu()
            for flag, name in ((1, "clean"), (0, "erroneous")):
                rows = suffix_rows & (clean == flag)
                if rows.any():
                    log_metric(self, f"srpo/correction_rate_{name}_prefix", correct[rows].float().mean().item())
        base_rows = (kinds_cpu == ROW_BASE) & scorable
        if base_rows.any():
            log_metric(self, "srpo/base_pass_rate", correct[base_rows].float().mean().item())

        logged = self._logs["advantages"]
        if len(logged) >= advantages.numel():
            for _ in range(advantages.numel()):
                logged.pop()
            logged.extend(advantages.tolist())

        local = len(self._srpo_row_kinds)
        start = self.accelerator.process_index * local
        return advantages[start : start + local].to(trl_advantages.dtype)

