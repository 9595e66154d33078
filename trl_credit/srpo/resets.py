"""Seeds, reset indices and training rows of SRPO/RRPO (docs/srpo.md#algorithm, paper §4.2, Algorithm 2). Only stdlib
(and the row kinds of :mod:`trl_credit.core.batch`).

- :func:`incorrect_indices`: the seed is the *first* incorrect rollout in sampling order (docs/srpo.md#seeds).
- :func:`random_reset_step` (RRPO) and :func:`choose_reset_step` (SRPO with the random fallback of docs/srpo.md#reset-index).
- :func:`prompt_rows`: all training rows of one prompt (base rows, then each reset group's rows).
- :func:`suffix_row` / :func:`fallback_row`: one training row with its loss mask (TRL's ``tool_mask``/``env_mask``):
  a shared-prefix row carries prefix + suffix as its completion with the prefix masked out (docs/srpo.md#suffix-rows), so reward
  functions see the whole response while the loss is the mean over suffix tokens (L_SP of the paper).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

# Row kinds of the training batch (base rollout, shared-prefix (suffix) row, fallback row): the credit core's.
from trl_credit.core.batch import ROW_BASE, ROW_FALLBACK, ROW_SUFFIX

__all__ = [
    "Reset",
    "incorrect_indices",
    "random_reset_step",
    "choose_reset_step",
    "suffix_row",
    "fallback_row",
    "prompt_rows",
    "ROW_BASE",
    "ROW_SUFFIX",
    "ROW_FALLBACK",
]


@dataclass
class Reset:
    """One incorrect seed of a prompt and its reset (paper §4.2): ``step`` is h*, the 1-indexed thought to resample
    (thought ``k`` ends at token ``ends[k - 1]``); ``source`` says who chose it ("generated", "scored", "random",
    "oracle"; None for a one-thought seed, whose only reset is h* = 1); ``oracle`` is the step checker's first wrong
    thought when a checker is given."""

    group: int
    ids: list[int]
    logprobs: list[float] | None
    ends: list[int]
    texts: list[str] | None = None
    step: int | None = None
    source: str | None = None
    oracle: int | None = None
    slot: int = 0
    """Which of the prompt's reset groups this seed's suffixes fill (0-indexed, in seed order)."""
    starts: list[int] | None = None
    """Multi-turn seeds: where each step starts (steps are not contiguous: tool results lie between turns); None for
    a single-turn seed, whose thought ``k`` starts where thought ``k - 1`` ends."""
    skipped: bool = False
    """The reset state could not be rebuilt (an environment's replay differed): the reset group trains as fallback
    rows."""

    def prefix_length(self) -> int:
        """Tokens of the seed kept in the reset state x* (everything before step h*)."""
        if self.starts is not None:
            return int(self.starts[self.step - 1])
        from trl_credit.core.steps import reset_prefix_length

        return reset_prefix_length(self.ends, self.step)


def incorrect_indices(rewards: Sequence[float], success_threshold: float, limit: int) -> list[int]:
    """Indices of the first ``limit`` incorrect rollouts, in order: the verifier's reward ``< success_threshold``.

    ``rewards`` is the raw reward of the verifier (the config's ``success_reward`` function), not TRL's weighted
    total. A NaN/None reward (the verifier could not judge the rollout) is neither correct nor incorrect: never a
    seed.
    """
    found = []
    for index, reward in enumerate(rewards):
        if len(found) >= limit:
            break
        if reward is None or (isinstance(reward, float) and math.isnan(reward)):
            continue
        if reward < success_threshold:
            found.append(index)
    return found


def random_reset_step(num_steps: int, rng: random.Random) -> int:
    """RRPO: h* ~ Uniform{1, ..., H_s} (paper §4.2)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}.")
    return rng.randint(1, num_steps)


def choose_reset_step(parsed_step: int | None, num_steps: int, rng: random.Random) -> tuple[int, bool]:
    """SRPO: the self-localized step when it parsed to a valid index, else a uniform random one (docs/srpo.md#reset-index).

    Returns ``(h*, localized)``; ``localized`` is False when the random fallback was used.
    """
    if parsed_step is not None and 1 <= parsed_step <= num_steps:
        return int(parsed_step), True
    return random_reset_step(num_steps, rng), False


def suffix_row(
    prefix_ids: Sequence[int],
    suffix_ids: Sequence[int],
    max_completion_length: int | None = None,
    prefix_logprobs: Sequence[float] | None = None,
    suffix_logprobs: Sequence[float] | None = None,
) -> tuple[list[int], list[int], list[float] | None]:
    """``(completion_ids, loss_mask, sampling_logprobs)`` of a shared-prefix row (docs/srpo.md#suffix-rows).

    completion = prefix + suffix, mask 0 on the prefix and 1 on the suffix. With ``max_completion_length`` the
    suffix is cut so the whole response fits it, as every other row of the batch does (cutting a sample after k
    tokens is distributed as sampling with a k-token budget). Log-probs (vLLM importance sampling) are the
    prefix's own sampling log-probs from the seed call followed by the suffix's; None when either is missing.
    """
    prefix = [int(t) for t in prefix_ids]
    suffix = [int(t) for t in suffix_ids]
    if max_completion_length is not None:
        suffix = suffix[: max(0, int(max_completion_length) - len(prefix))]
    if not suffix:
        raise ValueError(
            f"The reset prefix ({len(prefix)} tokens) leaves no room for a suffix within max_completion_length "
            f"({max_completion_length})."
        )
    completion = prefix + suffix
    mask = [0] * len(prefix) + [1] * len(suffix)
    logprobs = None
    if prefix_logprobs is not None and suffix_logprobs is not None:
        logprobs = [_logprob(x) for x in prefix_logprobs[: len(prefix)]]
        logprobs += [_logprob(x) for x in suffix_logprobs[: len(suffix)]]
        if len(logprobs) != len(completion):
            raise ValueError("sampling log-probs must cover every prefix and suffix token.")
    return completion, mask, logprobs


def fallback_row(
    filler_ids: Sequence[int], filler_logprobs: Sequence[float] | None = None
) -> tuple[list[int], list[int], list[float] | None]:
    """A row kept only to hold TRL's fixed group size when a reset group has no incorrect seed (docs/srpo.md#seeds): its
    completion is a rollout already sampled (a correct seed candidate), fully masked (mask 0 everywhere) and its
    advantage is set to 0 by the trainer, so the prompt trains as GRPO on its base group alone."""
    completion = [int(t) for t in filler_ids]
    if not completion:
        raise ValueError("fallback rows need a non-empty filler completion.")
    logprobs = [_logprob(x) for x in filler_logprobs] if filler_logprobs is not None else None
    return completion, [0] * len(completion), logprobs


def _logprob(value) -> float | None:
    # vLLM reports a NaN log-prob as None; keep it None so TRL maps it to NaN and leaves that token uncorrected.
    return None if value is None else float(value)


Rollout = tuple[Sequence[int], Sequence[float] | None]


def prompt_rows(
    base: Sequence[Rollout],
    reset_slots: Sequence[tuple[Sequence[int], Sequence[float] | None, Sequence[Rollout]] | None],
    num_suffixes: int,
    filler: Rollout,
    max_completion_length: int | None = None,
) -> list[tuple[list[int], list[int], list[float] | None, int]]:
    """The training rows of one prompt, in the trainer's layout (paper Figure 2, docs/srpo.md#algorithm).

    ``base`` rollouts first (mask 1 everywhere), then for every reset slot either its ``num_suffixes``
    shared-prefix rows (:func:`suffix_row`; the slot is ``(prefix_ids, prefix_logprobs, suffixes)``) or, when the
    slot has no incorrect seed (None), ``num_suffixes`` fully masked :func:`fallback_row` copies of ``filler``.
    Returns ``[(completion_ids, loss_mask, sampling_logprobs, kind)]`` with kind ROW_BASE/ROW_SUFFIX/ROW_FALLBACK.
    """
    rows = []
    for ids, logprobs in base:
        rows.append(([int(t) for t in ids], [1] * len(ids), None if logprobs is None else list(logprobs), ROW_BASE))
    for slot in reset_slots:
        if slot is None:
            for _ in range(num_suffixes):
                rows.append((*fallback_row(*filler), ROW_FALLBACK))
            continue
        prefix_ids, prefix_logprobs, suffixes = slot
        if len(suffixes) != num_suffixes:
            raise ValueError(f"a reset slot needs {num_suffixes} suffixes, got {len(suffixes)}.")
        for suffix_ids, suffix_logprobs in suffixes:
            rows.append(
                (*suffix_row(prefix_ids, suffix_ids, max_completion_length, prefix_logprobs, suffix_logprobs), ROW_SUFFIX)
            )
    return rows
