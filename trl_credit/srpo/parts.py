"""SRPO / RRPO's rollout as a part of the credit core (docs/srpo.md, paper §4, Algorithm 2): :class:`Resets`.

How it hooks into TRL 1.16.0's GRPOTrainer (everything else - tokenizing, reward calls, log-prob passes, loss,
vLLM / DeepSpeed / PEFT handling - is TRL's):

- Rollouts: :meth:`Resets.rollout_rows` builds the rows; the credit core installs it as TRL's ``rollout_func``
  (``Rollout.rollout_rows``; users cannot pass one). TRL's ``_generate`` calls it with this process's prompt rows
  and the core hands it the batch's context; it returns, for every prompt (``num_generations`` consecutive rows, all
  on this process), the base rows then the shared-prefix rows, and an ``env_mask`` (TRL's ``tool_mask``) that is 0
  on each shared-prefix row's prefix and on fallback rows. TRL then decodes, scores, computes log-probs and masks
  the loss with it. Every generation goes through ``ctx.generate`` (``generate_from_prefixes``, through
  ``_generate_single_turn``), so HF generate and vLLM both work; every call is collective and made the same number
  of times on every process.
- Rewards: the batch's global rewards are the core's capture of TRL's ``_calculate_rewards``; seed candidates are
  scored through TRL's ``_calculate_rewards`` too (padded to the same row count on every process, because it ends
  with a ``gather``), with reward-function side logs discarded.
- Record: a training step's :class:`~trl_credit.core.batch.RowBatch` has SRPO's sub-groups as its groups (each prompt's
  base group, each shared-prefix group; fallback rows in none), so the core's ``GroupOutcome`` normalizes within
  each (docs/srpo.md#advantages).
- Evaluation (``model.eval()``): plain iid generation from the wrapped prompts, TRL's groups and GRPO advantages.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import defaultdict
from typing import Any

import torch

from trl_credit.core.batch import NO_GROUP, ROW_BASE, ROW_FALLBACK, ROW_SUFFIX, RowBatch, trl_groups
from trl_credit.core.mixins import RolloutCapture
from trl_credit.core.registry import register_part
from trl_credit.core.setup import bind_success, is_composed, speaker
from trl_credit.core.success import success_rows, unscorable_rows
from trl_credit.core.trainer import Rollout
from trl_credit.srpo.advantages import srpo_group_ids
from trl_credit.srpo.config import SRPOFields
from trl_credit.srpo.localization import LocalizationQuality, checked_step, resolve_step_checker
from trl_credit.srpo.localize import localize
from trl_credit.srpo.prompts import check_prompt_format, question_of, resolve_rollout_template, wrap_prompt
from trl_credit.srpo.resets import Reset, incorrect_indices, prompt_rows, random_reset_step
from trl_credit.srpo.step_metrics import StepStats, log_step_stats
from trl_credit.core.steps import reset_prefix_length, split_thoughts, thought_texts
from trl_credit.core.tool_loop import BuiltRows
from trl_credit.srpo.multiturn import (EpisodeIds, episode_steps, generate_episodes, generated_tokens, loss_mask,
                                       resume_resets, transcript_texts)

__all__ = ["Resets", "ResetRows"]


@dataclasses.dataclass
class ResetRows:
    """SRPO's payload on the record of a training batch (``RowBatch.payload(ResetRows)``)."""

    prefix_clean: torch.Tensor
    """(N,) long (CPU), every row: a suffix row's reset prefix is clean (1) or erroneous (0) by the step checker;
    -1 when unknown (no checker) and on every other row."""


@register_part("rollout", "resets", help="SRPO/RRPO's reset-and-resample groups", fields=SRPOFields,
               check="_check_srpo_fields", check_after_grpo="_check_srpo_after_grpo")
class Resets(Rollout):
    """Per prompt and training step (paper §4.2, Algorithm 2): a base group of iid rollouts; seed candidates sampled
    in rounds until the prompt has ``reset_groups`` incorrect rollouts (never part of the base group); for each
    seed a reset thought h* (SRPO: the policy's own localization of the first erroneous thought, scored or greedy
    decoded, see ``SRPOConfig.localization``; RRPO: uniform; oracle: the step checker's first wrong thought);
    ``suffixes_per_reset`` suffixes resampled from the reset state ``question + thoughts 1..h*-1``, trained with the
    prefix masked out. Without an incorrect seed the reset group falls back to GRPO on the base group (its rows are
    in no group: zero advantage, zero loss mask).

    ``step_checker``: a callable ``(question, thoughts) -> int | None`` or a named checker, overriding
    ``SRPOConfig.step_checker`` (srpo/localization.py). The record's :class:`ResetRows` payload says, per row, whether
    a suffix row's reset prefix is clean (1), erroneous (0) or unknown (-1; every other row); its ``prompts`` are
    this process's rows' prompts as generated from (wrapped in the rollout template)."""

    name = "resets"
    resumes_tool_loop = True  # multi-turn rollouts: TRL's tool loop resumed from the reset state (srpo/multiturn.py)

    def __init__(self, step_checker=None):
        self._step_checker_arg = step_checker
        self.step_checker = None
        self.rollout_template: str | None = None
        self.rng: random.Random | None = None
        # State of the generation batch being built lives in ctx.scratch(self): "rows" (each row's kind, reset-prefix
        # flag and prefix length, set by rollout_rows in training) and "dummy" (a real row that pads the collective
        # reward calls).

    def setup(self, trainer) -> None:
        args = trainer.args
        who = speaker(trainer, self)
        # a user's rollout_func: refused by the core, which installs rollout_rows as TRL's rollout_func
        # (CreditTrainer, Rollout.rollout_rows); tools and environments run TRL's tool loop in the rows
        # (resumes_tool_loop, srpo/multiturn.py)
        bind_success(trainer)
        per_process = args.per_device_train_batch_size * args.steps_per_generation
        if per_process % trainer.num_generations != 0:
            raise ValueError(
                f"{who} needs whole prompt groups on each process: per_device_train_batch_size * "
                f"steps_per_generation ({per_process}) must be a multiple of num_generations ({trainer.num_generations})."
            )
        self.rollout_template = resolve_rollout_template(args.rollout_template)
        check_prompt_format(trainer.train_dataset, self.rollout_template, who,
                            environments=trainer.environment_factories is not None)
        # question + thoughts -> first wrong thought (srpo/localization.py): oracle resets and quality metrics.
        checker = self._step_checker_arg
        self.step_checker = resolve_step_checker(checker if checker is not None else args.step_checker)
        if args.reset == "oracle" and self.step_checker is None:
            passed = (f"{type(trainer).__name__}(rollout=Resets(step_checker=callable))" if is_composed(trainer)
                      else f"{type(trainer).__name__}(step_checker=callable)")
            raise ValueError(
                f"{who}: reset='oracle' needs a step checker: pass {passed} (question, thoughts -> 1-indexed first "
                f"wrong thought or None) or set {type(args).__name__}.step_checker to a named one ('chain')."
            )
        seed = args.seed if args.reset_seed is None else args.reset_seed
        # One generator per process (different streams), deterministic in the seed.
        self.rng = random.Random(1_000_003 * int(seed) + trainer.accelerator.process_index)

    # ------------------------------------------------------------------ checkpoints (MethodRNGStateMixin)

    def rng_state(self) -> dict:
        version, internal, gauss_next = self.rng.getstate()
        return {"reset_rng": [version, list(internal), gauss_next]}

    def set_rng_state(self, state: dict) -> None:
        version, internal, gauss_next = state["reset_rng"]
        self.rng.setstate((version, tuple(internal), gauss_next))

    def trained_prompt(self, prompt):
        # the question inside the rollout template the base group and the suffixes were generated from
        return wrap_prompt(prompt, self.rollout_template)

    # ------------------------------------------------------------------ the generation batch and its record

    def generate_and_score(self, ctx, inputs, capture: RolloutCapture) -> tuple[dict, RowBatch | None]:
        output = ctx.trl_batch(inputs)  # TRL's _generate calls rollout_rows (training) with this context
        rewards_per_func = capture.rewards(ctx.speaker(self))
        # The prompts this process's rows were generated from (the rollout template's), for credits that score
        # the completions under their own prompts (OPPO's oracle prompts).
        prompts = ctx.scratch(self).get("row_prompts") or [wrap_prompt(x["prompt"], self.rollout_template)
                                                            for x in inputs]
        rows = ctx.scratch(self).get("rows")
        if rows is None:  # evaluation: TRL's iid groups
            batch = trl_groups(ctx, rewards_per_func, output["completion_ids"].size(0))
            batch.prompts = prompts
            return output, batch
        # Each row's kind, reset-prefix flag and prefix length, of every process (one collective call).
        local = torch.tensor(list(zip(*rows[:3])), dtype=torch.long, device=ctx.device).view(-1, 3)
        kinds, clean, prefix_lengths = ctx.gather(local).cpu().unbind(dim=1)
        if kinds.numel() != rewards_per_func.size(0):
            raise RuntimeError(f"{ctx.speaker(self)}: {kinds.numel()} row kinds for {rewards_per_func.size(0)} "
                               "rewards.")
        args = ctx.args
        num_prompts = kinds.numel() // ctx.group_size
        group_ids = torch.tensor(
            srpo_group_ids(num_prompts, args.num_base_generations, args.reset_groups, args.suffixes_per_reset)
        )
        batch = RowBatch(
            rewards_per_func=rewards_per_func,
            group_ids=group_ids.masked_fill(kinds == ROW_FALLBACK, NO_GROUP),  # fallback rows: in no group
            row_kinds=kinds,
            success=success_rows(rewards_per_func, ctx.success_index, args.success_threshold).cpu(),
            scorable=(~unscorable_rows(rewards_per_func)).cpu(),
            num_local=len(rows[0]),
            process_index=ctx.process_index,
            prefix_lengths=prefix_lengths,
            prompts=prompts,
            # the env_mask of these rows masks their shared prefixes, which the model generated: every token is its own
            # but, in multi-turn rows, the tool results (rows[3]: each row's model mask)
            model_mask=torch.ones_like(output["completion_mask"]) if len(rows) == 3 else _padded(
                rows[3], output["completion_mask"]),
        )
        batch.attach(ResetRows(prefix_clean=clean))
        self._log_pass_rates(ctx, batch)
        return output, batch

    def _log_pass_rates(self, ctx, batch: RowBatch) -> None:
        """What the verifier says (``success_reward``) over the scorable rows of each kind: the suffix rows'
        correction rate (with a step checker also split by a clean / erroneous reset prefix), the base pass rate."""
        suffix_rows = (batch.row_kinds == ROW_SUFFIX) & batch.scorable
        if suffix_rows.any():
            ctx.metric("srpo/correction_rate", batch.success[suffix_rows].float().mean().item())
        if self.step_checker is not None:
            for flag, name in ((1, "clean"), (0, "erroneous")):
                rows = suffix_rows & (batch.payload(ResetRows).prefix_clean == flag)
                if rows.any():
                    ctx.metric(f"srpo/correction_rate_{name}_prefix", batch.success[rows].float().mean().item())
        base_rows = (batch.row_kinds == ROW_BASE) & batch.scorable
        if base_rows.any():
            ctx.metric("srpo/base_pass_rate", batch.success[base_rows].float().mean().item())

    # ------------------------------------------------------------------ rollouts

    def rollout_rows(self, ctx, prompts: list) -> dict[str, Any]:
        """TRL's ``rollout_func`` (installed by the core): this process's rows of the generation batch."""
        wrapped = [wrap_prompt(prompt, self.rollout_template) for prompt in prompts]
        if ctx.sampling.tool_loop:  # TRL's prompts (an environment's reset() observation appended), wrapped
            ctx.scratch(self)["row_prompts"] = wrapped
        if ctx.mode == "eval":
            # Evaluation: iid rollouts from the thought-MDP prompt, as GRPO would sample them.
            prompt_ids = [list(ids) for ids in ctx.tokenize(wrapped)[0]]
            completion_ids, logprobs = ctx.generate_groups(prompt_ids)  # num_generations_eval per prompt
            return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}
        return self._reset_and_resample(ctx, prompts, wrapped)

    def _reset_and_resample(self, ctx, prompts: list, wrapped: list) -> dict[str, Any]:
        """One training step's rollouts (paper Algorithm 2): seeds, a reset per seed, suffixes, the rows TRL trains
        on. Collective: every process makes the same generation, reward and scoring calls."""
        group_prompts, group_inputs, prompt_ids = self._prompt_groups(ctx, prompts, wrapped)
        stats = StepStats(prompts=len(prompt_ids), reset_groups=len(prompt_ids) * ctx.args.reset_groups)
        base, candidates, seeds, rounds = self._sample_seeds(ctx, group_prompts, group_inputs, prompt_ids, stats)
        resets = self._choose_resets(ctx, seeds, group_prompts, stats)
        suffixes, suffix_logprobs = self._resample(ctx, resets, prompt_ids, group_inputs, stats)
        output = self._training_rows(ctx, base, candidates, seeds, resets, suffixes, suffix_logprobs, prompt_ids)
        args = ctx.args
        paper_mode = args.localization == "generate" and args.localization_fallback == "random"
        log_sources = args.reset == "self" and not paper_mode  # paper's mode: the parse rate is the split
        log_step_stats(ctx, stats, rounds, log_sources, self.step_checker is not None,
                       replays=ctx.environments is not None)
        return output

    def _prompt_groups(self, ctx, prompts: list, wrapped: list) -> tuple[list, list, list[list[int]]]:
        """Per prompt group (``num_generations`` consecutive rows): the prompt, its input row (``ctx.inputs``, the
        rows TRL's ``_generate`` got ``prompts`` from) and its token ids."""
        size = ctx.group_size
        if len(prompts) % size != 0:
            raise RuntimeError(f"{ctx.speaker(self)} got {len(prompts)} prompt rows, not a multiple of "
                               f"num_generations={size}.")
        num_groups = len(prompts) // size
        for group in range(num_groups):
            if any(prompt != prompts[group * size] for prompt in prompts[group * size : (group + 1) * size]):
                raise RuntimeError(
                    f"{ctx.speaker(self)} needs the num_generations rows of a prompt consecutive on one process "
                    "(TRL's "
                    "RepeatSampler layout); this batch mixes prompts inside a group."
                )
        group_prompts = [prompts[g * size] for g in range(num_groups)]
        group_inputs = [ctx.inputs[g * size] for g in range(num_groups)]
        ctx.scratch(self)["wrapped_prompts"] = [wrapped[g * size] for g in range(num_groups)]
        if ctx.environments is None:
            tokenized = ctx.tokenize([wrapped[g * size] for g in range(num_groups)])[0]
        else:  # TRL renders each row with its environment's tools: every row of the batch, in order
            tokenized = ctx.tokenize(wrapped)[0][::size]
        return group_prompts, group_inputs, [list(map(int, ids)) for ids in tokenized]

    def _sample_seeds(self, ctx, group_prompts, group_inputs, prompt_ids, stats: StepStats):
        """The base groups, the seed candidates and the seeds: the first ``reset_groups`` incorrect rollouts per
        prompt in sampling order (paper §4.2): fresh candidates in rounds, or (seed_source="base", Appendix D) the
        base group's own rollouts. Returns ``(base, candidates, seeds, rounds)``, each a list per prompt."""
        args = ctx.args
        num_groups, base_size, num_resets = len(prompt_ids), args.num_base_generations, args.reset_groups
        from_base = args.seed_source == "base"
        per_round = 0 if from_base else args.seed_candidates_per_round
        # Round 1: the base group and the first seed candidates, in one generation call.
        completions, logprobs = self._rollouts(
            ctx, [g for g in range(num_groups) for _ in range(base_size + per_round)], prompt_ids, group_prompts,
            group_inputs, first_round=True)
        rollouts = [(ids, logprobs[i] if logprobs is not None else None) for i, ids in enumerate(completions)]
        width = base_size + per_round
        base = [rollouts[g * width : g * width + base_size] for g in range(num_groups)]
        candidates = [rollouts[g * width + base_size : (g + 1) * width] for g in range(num_groups)]
        ctx.scratch(self)["dummy"] = (0, (base[0] if from_base else candidates[0])[0][0])
        seeds: list[list] = [[] for _ in range(num_groups)]
        batch = (group_prompts, group_inputs, prompt_ids, seeds, num_resets)
        first_round = [(g, c) for g in range(num_groups) for c in (base[g] if from_base else candidates[g])]
        stats.empty_candidates += self._collect_seeds(ctx, first_round, *batch)
        stats.scored_candidates += len(first_round)
        rounds = 0 if from_base else 1
        while not from_base and rounds < args.max_seed_rounds:
            needy = [g for g in range(num_groups) if len(seeds[g]) < num_resets]
            if sum(ctx.gather_counts(len(needy))) == 0:
                break  # every process is done: all stop together
            owners = [g for g in needy for _ in range(per_round)]
            new_completions, new_logprobs = self._rollouts(ctx, owners, prompt_ids, group_prompts, group_inputs)
            new_rollouts = []
            for i, g in enumerate(owners):
                rollout = (new_completions[i], new_logprobs[i] if new_logprobs is not None else None)
                candidates[g].append(rollout)
                new_rollouts.append((g, rollout))
            stats.empty_candidates += self._collect_seeds(ctx, new_rollouts, *batch)
            stats.scored_candidates += len(new_rollouts)
            rounds += 1
        stats.seeds = sum(len(s) for s in seeds)
        stats.base_tokens = sum(generated_tokens(ids) for g in range(num_groups) for ids, _ in base[g])
        stats.seed_tokens = sum(generated_tokens(ids) for g in range(num_groups) for ids, _ in candidates[g])
        stats.iid_rollouts = sum(len(base[g]) + len(candidates[g]) for g in range(num_groups))
        return base, candidates, seeds, rounds

    def _choose_resets(self, ctx, seeds, group_prompts, stats: StepStats) -> list[Reset]:
        """h* for every seed (paper §4.2): SRPO asks the policy (``localize``), RRPO draws uniformly, the oracle
        asks the step checker. A one-thought seed resets at the question (h* = 1). Logs quality with a checker."""
        args = ctx.args
        tokenizer, delimiter = ctx.tokenizer, args.thought_delimiter
        resets = []
        for g, group_seeds in enumerate(seeds):
            for slot, (ids, logprobs) in enumerate(group_seeds):
                if isinstance(ids, EpisodeIds):  # multi-turn: thoughts inside the model's turns
                    spans = episode_steps(ids, tokenizer, delimiter)
                    resets.append(Reset(g, ids, logprobs, [end for _, end in spans], slot=slot,
                                        starts=[start for start, _ in spans]))
                else:
                    resets.append(Reset(g, ids, logprobs, split_thoughts(ids, tokenizer, delimiter), slot=slot))
        checker = self.step_checker
        if checker is not None or args.reset != "random":
            for reset in resets:
                if reset.starts is not None:  # the whole transcript: each step with the tool results after it
                    spans = list(zip(reset.starts, reset.ends))
                    reset.texts = transcript_texts(reset.ids, spans, tokenizer, delimiter)
                else:
                    reset.texts = thought_texts(reset.ids, reset.ends, tokenizer, delimiter)
        if checker is not None:
            for reset in resets:
                reset.oracle = checked_step(checker, question_of(group_prompts[reset.group]), reset.texts)
        if args.reset == "self":
            for reset in resets:
                if len(reset.ends) == 1:
                    reset.step = 1  # one thought: the only reset state is the question
            localize(ctx, [r for r in resets if r.step is None], group_prompts, stats, rng=self.rng)
        elif args.reset == "oracle":
            for reset in resets:
                stats.oracle_attempts += 1
                stats.oracle_misses += reset.oracle is None
                if reset.oracle is None:  # the checker finds no wrong thought: degrade to RRPO's draw (logged)
                    reset.step, reset.source = random_reset_step(len(reset.ends), self.rng), "random"
                else:
                    reset.step, reset.source = reset.oracle, "oracle"
        else:
            for reset in resets:
                reset.step, reset.source = random_reset_step(len(reset.ends), self.rng), "random"
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

    def _resample(self, ctx, resets: list[Reset], prompt_ids, group_inputs, stats: StepStats):
        """``suffixes_per_reset`` iid continuations of every reset state x* = question + thoughts 1..h*-1, each
        with the budget ``max_completion_length`` minus its prefix, so prefix + suffix fits the row (multi-turn:
        TRL's tool loop resumed, srpo/multiturn.py)."""
        if ctx.sampling.tool_loop:
            wrapped = ctx.scratch(self)["wrapped_prompts"]
            return resume_resets(ctx, resets, prompt_ids, wrapped, group_inputs, stats, part=self)
        num_suffixes, max_length = ctx.args.suffixes_per_reset, ctx.args.max_completion_length
        rows, budgets = [], []
        for reset in resets:
            keep = reset_prefix_length(reset.ends, reset.step)
            rows += [prompt_ids[reset.group] + reset.ids[:keep]] * num_suffixes
            budgets += [max(1, max_length - keep) if max_length is not None else None] * num_suffixes
        suffixes, logprobs = ctx.generate(rows, max_new_tokens=budgets if max_length is not None else None)
        # training rows, as TRL's own
        ctx.refuse_empty_completions(suffixes, "the generation of suffixes", part=self)
        stats.suffix_tokens = sum(len(ids) for ids in suffixes)
        return suffixes, logprobs

    def _rollouts(self, ctx, owners: list[int], prompt_ids, group_prompts, group_inputs, first_round: bool = False):
        """One rollout per entry of ``owners`` (a prompt group each), from the prompt: one generation call
        (``ctx.generate``) or, in a multi-turn run, a whole episode through TRL's tool loop (srpo/multiturn.py). With
        an environment, in the ``first_round`` the first ``num_base_generations`` rollouts of each group are its base
        rows and run in the batch's own environments (TRL's, one per training row); seed candidates run in fresh
        instances. Returns ``(ids, logprobs)``."""
        if not ctx.sampling.tool_loop:
            return ctx.generate([prompt_ids[g] for g in owners])
        environments, batch_environments = [None] * len(owners), ctx.environments
        if batch_environments is not None:
            base_size, seen, fresh = ctx.args.num_base_generations if first_round else 0, defaultdict(int), []
            for index, g in enumerate(owners):
                if seen[g] < base_size:  # a base row: its training row's own environment (TRL's, already reset)
                    environments[index] = batch_environments[g * ctx.group_size + seen[g]]
                else:
                    fresh.append(index)
                seen[g] += 1
            for index, environment in zip(fresh, ctx.fresh_environments([group_inputs[owners[i]] for i in fresh])):
                environments[index] = environment
        wrapped = ctx.scratch(self)["wrapped_prompts"]
        return generate_episodes(ctx, [prompt_ids[g] for g in owners], [wrapped[g] for g in owners],
                                 [group_inputs[g] for g in owners], environments)

    def _training_rows(self, ctx, base, candidates, seeds, resets, suffixes, suffix_logprobs, prompt_ids) -> dict:
        """The rows TRL trains on: per prompt, base rows then each reset group's rows (``prompt_rows``), with the
        loss mask as ``env_mask``. Records each row's kind, its masked shared prefix (suffix rows) and, with a step
        checker, whether a suffix row's reset prefix is clean (1), erroneous (0) or unknown (-1) for the split
        correction rates (kept in ``ctx.scratch(self)["rows"]`` for the record)."""
        args = ctx.args
        num_suffixes, max_length = args.suffixes_per_reset, args.max_completion_length
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
        kinds, clean, prefix_lengths, cursor = [], [], [], 0
        multi_turn = ctx.sampling.tool_loop
        model_masks, messages, tool_masks = [], [], []  # multi-turn rows (srpo/multiturn.py)
        for g in range(len(prompt_ids)):
            slots, slot_clean, episodes = [], [], [ids.episode for ids, _ in base[g]] if multi_turn else []
            # The fallback filler is a rollout already sampled with no incorrect verdict (the last non-empty
            # candidate).
            filler = next((c for c in reversed(candidates[g]) if c[0]), None) or base[g][-1]
            for slot in range(args.reset_groups):
                if slot >= len(seeds[g]) or resets[cursor].skipped:
                    cursor += slot < len(seeds[g])  # a skipped reset (its replay differed) has suffixes, unused
                    slots.append(None)  # no incorrect seed: fallback rows
                    episodes += [filler[0].episode] * num_suffixes if multi_turn else []
                    continue
                reset, first = resets[cursor], cursor * num_suffixes
                keep = reset.prefix_length()
                # multi-turn suffixes are whole completions (srpo/multiturn.py): the rows take what follows the prefix
                cut = keep if multi_turn else 0
                rollouts = [
                    (suffixes[row][cut:], suffix_logprobs[row][cut:] if suffix_logprobs is not None else None)
                    for row in range(first, first + num_suffixes)
                ]
                episodes += [suffixes[row].episode for row in range(first, first + num_suffixes)] if multi_turn else []
                prefix_logprobs = reset.logprobs[:keep] if reset.logprobs is not None else None
                slots.append((reset.ids[:keep], prefix_logprobs, rollouts))
                slot_clean.append(-1 if reset.oracle is None else int(reset.step <= reset.oracle))
                cursor += 1
            suffix_flags = iter(flag for flag in slot_clean for _ in range(num_suffixes))
            rows = prompt_rows(base[g], slots, num_suffixes, filler, max_length)
            for index, (completion, mask, lps, kind) in enumerate(rows):
                for key, value in zip(out, (prompt_ids[g], completion, lps, mask)):
                    out[key].append(value)
                kinds.append(kind)
                clean.append(next(suffix_flags) if kind == ROW_SUFFIX else -1)
                prefix_lengths.append(mask.count(0) if kind == ROW_SUFFIX else 0)  # a suffix row masks its prefix
                if multi_turn:  # the loss mask also leaves out the tool results
                    episode = episodes[index]
                    model_masks.append(episode.model_mask[: len(completion)])
                    messages.append(episode.messages)
                    tool_masks.append(loss_mask(mask, model_masks[-1]))
        ctx.scratch(self)["rows"] = (kinds, clean, prefix_lengths, model_masks) if multi_turn else (
            kinds, clean, prefix_lengths)
        if all(lps is None for lps in out["logprobs"]):  # HF generate: no sampling log-probs
            out["logprobs"] = None
        if multi_turn:  # TRL's tool loop runs over rollout_func rows: the core hands it these (BuiltRows)
            out.pop("env_mask")
            out["tool_loop"] = BuiltRows(tool_mask=tool_masks, completions=messages)
        return out

    def _collect_seeds(self, ctx, rollouts, group_prompts, group_inputs, prompt_ids, seeds, num_resets) -> int:
        """Score ``rollouts`` (``[(group, (ids, logprobs))]``, in sampling order) and append each group's incorrect
        ones to ``seeds[group]`` until it holds ``num_resets``. An empty rollout (0 tokens) has no thought to reset
        from: never a seed. Returns the number of empty rollouts. Collective (reward call)."""
        verifier = self._verifier_rewards(
            ctx, [g for g, _ in rollouts], [r[0] for _, r in rollouts], group_prompts, group_inputs, prompt_ids
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
            for position in incorrect_indices([verifier[i] for i in indices], ctx.args.success_threshold, room):
                seeds[g].append(rollouts[indices[position]][1])
        return len(empty)

    def _verifier_rewards(self, ctx, row_groups, completion_ids, group_prompts, group_inputs, prompt_ids):
        """Raw reward of the ``success_reward`` function (NaN when it returned None) for this process's seed
        candidates, through TRL's reward path (``rewards_of_extra_rows``, a collective call padded with a real
        rollout), so every reward function runs with its kwargs as for the batch."""
        dummy_group, dummy_ids = ctx.scratch(self)["dummy"]
        filler = (group_inputs[dummy_group], group_prompts[dummy_group], prompt_ids[dummy_group], dummy_ids)
        turns = {}
        if isinstance(dummy_ids, EpisodeIds):  # multi-turn: the messages and environments reward functions read
            filler += (dummy_ids.episode.messages, dummy_ids.environment)
            turns["completions"] = [ids.episode.messages for ids in completion_ids]
            if ctx.environments is not None:
                turns["environments"] = [ids.environment for ids in completion_ids]
        per_process = ctx.score(
            [group_inputs[g] for g in row_groups],
            [group_prompts[g] for g in row_groups],
            [prompt_ids[g] for g in row_groups],
            completion_ids,
            filler=filler,
            **turns,
        )
        mine = per_process[ctx.process_index]
        return mine[:, ctx.success_index].tolist()


def _padded(rows: list[list[int]], like: torch.Tensor) -> torch.Tensor:
    """Per-row 0/1 lists as a tensor shaped and placed like TRL's ``completion_mask`` (padded with 1, as TRL pads its
    ``tool_mask``)."""
    out = torch.ones_like(like)
    for index, values in enumerate(rows):
        out[index, : len(values)] = torch.tensor(values, dtype=like.dtype)
    return out
