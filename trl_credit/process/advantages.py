"""Process-supervision advantages of GRPO (DeepSeekMath, Shao et al. 2024, §4.1.3; docs/process.md). Stdlib only.

A group of G completions, each split into steps; step ``j`` of completion ``i`` ends at token ``index(j)`` and has
the step reward ``r_i^index(j)``. With ``R`` every step reward of the group, the paper normalizes

    r~_i^index(j) = (r_i^index(j) - mean(R)) / std(R)

and gives token ``t`` of completion ``i`` the sum of the normalized rewards of the steps that end at or after it:

    Â_i,t = sum over index(j) >= t of r~_i^index(j).

Choices the paper leaves open (docs/process.md#what-is-the-papers-and-what-is-chosen): a step without a reward
(None) is out of ``R`` and adds nothing to any token; ``std`` is the unbiased standard deviation plus ``1e-4``, as
TRL's GRPO normalizes outcome rewards (``scale_rewards``: ``"group"`` the group's std, ``"batch"`` the std of every
step reward of the batch, ``"none"`` no division); a group whose step rewards are all equal (or hold fewer than two)
gets exactly 0, as GRPO gives a group whose rewards are all equal; a row in no group gets 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["STD_EPS", "SCALES", "normalized_step_rewards", "token_advantages"]

#: Added to the standard deviation, as TRL's GRPO does for outcome rewards (``std + 1e-4``).
STD_EPS = 1e-4
#: TRL's ``scale_rewards`` values, with the same meaning for the step rewards.
SCALES = ("group", "batch", "none")

NO_GROUP = -1  # trl_credit.core.batch.NO_GROUP, repeated so this module needs no torch


def _unbiased_std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def normalized_step_rewards(
    step_rewards: Sequence[Sequence[float | None] | None],
    group_ids: Sequence[int],
    scale: str = "group",
    eps: float = STD_EPS,
) -> list[list[float]]:
    """r~ for every step of every row (paper §4.1.3, module docstring).

    ``step_rewards``: per row (the batch's rows, any group layout), its step rewards in step order, None for a step
    without a reward; a row given as None (not credited: unscorable, in no group) gets an empty list. ``group_ids``:
    each row's group (:data:`NO_GROUP` for none). Returns, per row, one normalized reward per step (0.0 for a step
    without a reward)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}.")
    if len(step_rewards) != len(group_ids):
        raise ValueError(f"{len(step_rewards)} rows of step rewards for {len(group_ids)} group ids.")
    pooled: dict[int, list[float]] = {}  # R of each group
    for rewards, group in zip(step_rewards, group_ids):
        if rewards is None or group == NO_GROUP:
            continue
        pooled.setdefault(group, []).extend(r for r in rewards if r is not None)
    batch_std = _unbiased_std([r for values in pooled.values() for r in values])
    statistics = {}
    for group, values in pooled.items():
        if not values or max(values) == min(values):
            statistics[group] = None  # no spread: every normalized reward of the group is 0
            continue
        std = {"group": _unbiased_std(values), "batch": batch_std, "none": None}[scale]
        statistics[group] = (sum(values) / len(values), 1.0 if std is None else std + eps)
    result = []
    for rewards, group in zip(step_rewards, group_ids):
        if rewards is None or group == NO_GROUP:
            result.append([] if rewards is None else [0.0] * len(rewards))
            continue
        moments = statistics.get(group)
        result.append([
            0.0 if r is None or moments is None else (r - moments[0]) / moments[1] for r in rewards
        ])
    return result


def token_advantages(step_ends: Sequence[int], step_advantages: Sequence[float], num_tokens: int) -> list[float]:
    """Â_t for ``t`` in ``0 .. num_tokens - 1``: the sum of ``step_advantages[j]`` over the steps with
    ``step_ends[j] > t`` (``step_ends`` exclusive, so ``index(j) = step_ends[j] - 1`` and the paper's
    ``index(j) >= t``). Several steps may end at the same token (their rewards add up there); a token after the last
    step's end gets 0."""
    if len(step_ends) != len(step_advantages):
        raise ValueError(f"{len(step_ends)} step ends for {len(step_advantages)} step advantages.")
    ending_after = [0.0] * (num_tokens + 1)  # ending_after[e]: the rewards of the steps that end (exclusive) at e
    for end, advantage in zip(step_ends, step_advantages):
        if not 0 <= end <= num_tokens:
            raise ValueError(f"step end {end} outside the completion's {num_tokens} tokens.")
        ending_after[end] += advantage
    advantages = [0.0] * num_tokens
    running = 0.0
    for t in reversed(range(num_tokens)):
        running += ending_after[t + 1]  # the steps ending at t (inclusive), i.e. exclusive end t + 1
        advantages[t] = running
    return advantages
