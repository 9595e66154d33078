"""The per-step counts of SRPO's rollout and the ``srpo/`` metrics and warnings made from them (docs/srpo.md#metrics).

Every process fills a :class:`StepStats` with its own counts; :func:`log_step_stats` sums them over processes in one
``gather`` (a collective call, made by every process) and logs the rates through TRL's metrics, all through the
batch's :class:`~trl_credit.core.context.BatchContext` (``ctx``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from trl_credit.srpo.localization import LocalizationQuality

__all__ = ["StepStats", "log_step_stats", "SOURCES"]

#: Where a localized reset came from (``srpo/localization_source/<source>``).
SOURCES = ("generated", "scored", "random")


@dataclass
class StepStats:
    """Counts of one rollout step on one process (summed over processes before logging)."""

    reset_groups: float = 0  # prompts x reset_groups
    seeds: float = 0  # reset groups with an incorrect seed
    position_sum: float = 0  # sum of (h* - 1) / H_s: the kept fraction of the seed's thoughts
    at_question: float = 0  # resets with h* = 1
    single_thought: float = 0  # seeds with H_s = 1
    thoughts_sum: float = 0  # sum of H_s
    localization_attempts: float = 0  # decoded localization answers (localization="generate")
    localization_parsed: float = 0  # ... that named a valid step
    generated: float = 0  # localized resets by source (reset="self", multi-thought seeds)
    scored: float = 0
    random: float = 0
    localization_forward_tokens: float = 0  # tokens of the scoring forward passes (prompt + answer rows)
    oracle_attempts: float = 0  # reset="oracle": resets asked of the step checker
    oracle_misses: float = 0  # ... for which it found no wrong thought (uniform reset instead)
    base_tokens: float = 0
    seed_tokens: float = 0  # every fresh seed candidate, seeds included
    localization_tokens: float = 0  # decoded localization tokens
    suffix_tokens: float = 0
    iid_rollouts: float = 0  # base rollouts + seed candidates
    prompts: float = 0
    empty_candidates: float = 0
    scored_candidates: float = 0
    checked: float = 0  # LocalizationQuality's counts (with a step checker)
    unchecked: float = 0
    exact: float = 0
    clean: float = 0
    deviation_sum: float = 0
    replayed: float = 0  # multi-turn resets whose environments were replayed to the reset point (environment_factory)
    replay_mismatches: float = 0  # ... whose replayed tool results differed from the recorded ones (reset skipped)

    def summed(self, ctx) -> StepStats:
        """The counts summed over processes (collective)."""
        values = [float(getattr(self, f.name)) for f in fields(self)]
        local = torch.tensor(values, dtype=torch.float64, device=ctx.device)
        totals = ctx.gather(local).view(-1, len(values)).sum(dim=0).tolist()
        return StepStats(*totals)

    def add_quality(self, quality: LocalizationQuality) -> None:
        for name in ("checked", "unchecked", "exact", "clean", "deviation_sum"):
            setattr(self, name, getattr(self, name) + getattr(quality, name))


def log_step_stats(ctx, local: StepStats, rounds: int, log_sources: bool, has_checker: bool,
                   replays: bool = False) -> None:
    """Sum ``local`` over processes and log the step's ``srpo/`` metrics (docs/srpo.md#metrics), with the warnings
    they call for (once each). ``log_sources``: log ``srpo/localization_source/*`` (SRPO outside the paper's
    generate-then-uniform mode, where ``srpo/localization_parse_rate`` already is the split)."""
    args = ctx.args
    s = local.summed(ctx)
    fallbacks = s.reset_groups - s.seeds
    ctx.metric("srpo/fallback_rate", fallbacks / s.reset_groups)
    if replays:  # environment_factory: resets whose environment replay differed, skipped (srpo/multiturn.py)
        ctx.metric("srpo/replay_mismatch_rate", s.replay_mismatches / s.replayed if s.replayed else 0.0)
        if s.replay_mismatches:
            ctx.warn(
                "srpo/replay_mismatch",
                f"{ctx.speaker('resets')}: {s.replay_mismatches:.0f} of {s.replayed:.0f} resets were skipped: "
                "replaying the seed's tool calls on a fresh environment (reset(), then the same calls in order) "
                "gave other results than the seed's rollout got, so the environment is not deterministic and its "
                "state at the reset point cannot be rebuilt. Those reset groups train as fallback rows (no loss, advantage 0; "
                "srpo/replay_mismatch_rate). Make reset() and the tools deterministic in the row's columns (seed any "
                "randomness from them), or train this environment with rollout='groups'.",
            )
    ctx.metric("srpo/seed_rounds", rounds)
    empty_rate = s.empty_candidates / s.scored_candidates if s.scored_candidates else 0.0
    ctx.metric("srpo/empty_candidate_rate", empty_rate)
    if s.empty_candidates:
        ctx.warn(
            "srpo/empty_candidate",
            f"{ctx.speaker('resets')}: {s.empty_candidates:.0f} of {s.scored_candidates:.0f} seed candidates were "
            "empty (0 "
            "tokens), so they have no thought to reset from and were not taken as seeds (srpo/empty_candidate_rate). "
            "HF generate and vLLM return the EOS token when the model stops at once; check a custom generation.",
        )
    base_size = args.num_base_generations
    if fallbacks == s.reset_groups:
        trained_as = "as GRPO on the base groups" if base_size else "nothing (this split has no base group)"
        ctx.warn(
            "srpo/no_seed",
            f"{ctx.speaker('resets')} found no incorrect seed for any prompt of a step, so it trained "
            f"{trained_as} "
            f"(srpo/fallback_rate = 1). A seed is a rollout whose `success_reward` function (reward "
            f"function {ctx.success_reward_name!r}) scores below success_threshold="
            f"{args.success_threshold}: check that this is the verifier (accuracy), not a format reward.",
        )
    if fallbacks and not base_size:
        # No base group to fall back to: a prompt without an incorrect seed has only masked rows.
        ctx.warn(
            "srpo/no_base_group_fallback",
            f"{ctx.speaker('resets')}: {fallbacks:.0f} of {s.reset_groups:.0f} reset groups found no incorrect "
            "seed "
            f"(srpo/fallback_rate), and the split num_generations={ctx.group_size} = reset_groups x "
            f"suffixes_per_reset ({args.reset_groups} x {args.suffixes_per_reset}) has no base group to fall back to, "
            "so those prompts add nothing to the loss (their rows are masked). Fix: num_generations >= 4 (the "
            "default split then keeps a base group of ceil(num_generations / 2)) or an explicit split with a base "
            "group; or more seed rounds (max_seed_rounds) if the verifier does fail sometimes.",
        )
    if s.seeds:
        ctx.metric("srpo/reset_position", s.position_sum / s.seeds)
        ctx.metric("srpo/reset_at_question_rate", s.at_question / s.seeds)
        ctx.metric("srpo/single_thought_rate", s.single_thought / s.seeds)
        ctx.metric("srpo/thoughts_per_seed", s.thoughts_sum / s.seeds)
        if s.single_thought / s.seeds > 0.5:
            ctx.warn(
                "srpo/single_thought",
                f"{ctx.speaker('resets')}: {s.single_thought:.0f} of {s.seeds:.0f} seeds have a single thought "
                f"(srpo/single_thought_rate), so they can only reset at the question and SRPO degenerates to "
                f"GRPO on two groups. Cause: the model does not write thought_delimiter={args.thought_delimiter!r}. "
                + ("Fix: the model writes its answers on one line although rollout_template='lines' asks for one step "
                   "per line: a larger max_completion_length, or a rollout_template the model follows."
                   if args.rollout_template == "lines" else
                   "Fix: rollout_template='lines' (one step per line; thoughts then end at '\\n'), or set "
                   "`thought_delimiter` to what the model writes between steps."),
            )
    _log_localization(ctx, s, log_sources, has_checker)
    generated = s.base_tokens + s.seed_tokens + s.localization_tokens + s.suffix_tokens
    if s.base_tokens:
        ctx.metric("srpo/tokens_vs_base", generated / s.base_tokens)
    iid_tokens = s.base_tokens + s.seed_tokens
    if iid_tokens:
        grpo_tokens = s.prompts * ctx.group_size * iid_tokens / s.iid_rollouts  # a GRPO step, same budget
        ctx.metric("srpo/tokens_vs_grpo", generated / grpo_tokens)
        ctx.metric("srpo/paper_tokens_vs_grpo", (s.base_tokens + s.suffix_tokens) / grpo_tokens)
        if s.localization_forward_tokens:
            ctx.metric("srpo/localization_forward_tokens_vs_grpo", s.localization_forward_tokens / grpo_tokens)


def _log_localization(ctx, s: StepStats, log_sources: bool, has_checker: bool) -> None:
    args = ctx.args
    if s.localization_attempts:
        ctx.metric("srpo/localization_parse_rate", s.localization_parsed / s.localization_attempts)
        if s.localization_parsed / s.localization_attempts < 0.5:
            fallback = (
                "drawn uniformly at random (RRPO)" if args.localization_fallback == "random"
                else "the policy's scored choice (localization_fallback='scored')"
            )
            ctx.warn(
                "srpo/localization_unparsed",
                f"{ctx.speaker('resets')}: {s.localization_attempts - s.localization_parsed:.0f} of "
                f"{s.localization_attempts:.0f} localization answers did not name a step as \\boxed{{N}} "
                f"(srpo/localization_parse_rate), so those resets were {fallback}. Fix: a `localization_template` "
                "the model follows, a larger `localization_max_tokens`, or localization='scored'.",
            )
    localized = s.generated + s.scored + s.random
    if log_sources and localized:
        for source in SOURCES:
            ctx.metric(f"srpo/localization_source/{source}", getattr(s, source) / localized)
    if s.oracle_attempts:
        ctx.metric("srpo/oracle_miss_rate", s.oracle_misses / s.oracle_attempts)
        if s.oracle_misses:
            ctx.warn(
                "srpo/oracle_miss",
                f"{ctx.speaker('resets')}: the step checker found no wrong thought in {s.oracle_misses:.0f} of "
                f"{s.oracle_attempts:.0f} failed seeds (srpo/oracle_miss_rate), so those resets were drawn uniformly "
                "at random (RRPO). The checker and the verifier disagree on them: check both.",
            )
    if has_checker:
        quality = LocalizationQuality.from_list([s.checked, s.unchecked, s.exact, s.clean, s.deviation_sum])
        for name, value in quality.rates().items():
            ctx.metric(f"srpo/localization_{name}", value)
        if s.checked + s.unchecked:
            ctx.metric("srpo/localization_checked_rate", s.checked / (s.checked + s.unchecked))
