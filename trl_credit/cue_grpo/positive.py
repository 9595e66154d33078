"""Cue-GRPO's positive set P and the checks on what a user partition gives (docs/cue_grpo.md#positive-set), and the
leaf outcomes of DATPO's trees re-weighted by rarity (docs/composition.md). Pure functions over tensors and lists."""

from __future__ import annotations

import math

import torch

from trl_credit.core.batch import RowBatch
from trl_credit.core.success import groups_with_reward_variance

__all__ = [
    "positive_sets", "varied_groups", "checked_partition_labels", "leaf_advantages", "reweighted_leaves",
    "reweighted_rows",
]


def positive_sets(
    advantages: torch.Tensor,
    correct: torch.Tensor,
    in_loss: torch.Tensor,
    varied: dict[int, bool],
    groups: dict[int, list[int]],
) -> tuple[dict[int, list[int]], float]:
    """The positive set P of every group that redistribution touches (``groups``: group id -> its rows in the global
    batch, :meth:`RowBatch.groups`): P = {i : correct_i and A_i > 0 and i reaches the loss}, in groups whose rewards
    vary (``varied``). The paper's P = {A_i > 0} assumes a 0/1 verifier as the only reward, where the two agree; with
    several reward functions a wrong but well-formatted answer can have A_i > 0, and boosting its "rare strategy"
    would reward being wrong. A completion whose loss TRL masks (``mask_truncated_completions``) gets no gradient, so
    it must not occupy a cluster either. Returns ``(positives, excluded)``: groups with a non-empty P, and the
    fraction of A_i > 0 rows of varied groups left out of P (0 when there are none)."""
    values = advantages.tolist()
    correct, in_loss = correct.tolist(), in_loss.tolist()
    positives: dict[int, list[int]] = {}
    candidates = kept = 0
    for group, rows in groups.items():
        if not varied[group]:
            continue
        rows = [row for row in rows if values[row] > 0]
        members = [row for row in rows if correct[row] and in_loss[row]]
        candidates += len(rows)
        kept += len(members)
        if members:
            positives[group] = members
    return positives, (candidates - kept) / candidates if candidates else 0.0


def varied_groups(batch: RowBatch, reward_weights: torch.Tensor, aggregation: str) -> dict[int, bool]:
    """Group id -> whether its TRL advantages carry a signal (``success.groups_with_reward_variance`` per group)."""
    return {
        group: bool(groups_with_reward_variance(batch.rewards_per_func[rows], reward_weights, len(rows), aggregation)[0])
        for group, rows in batch.groups().items()
    }


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


def leaf_advantages(rewards: torch.Tensor, groups: dict[int, list[int]]) -> tuple[torch.Tensor, dict[int, bool]]:
    """Each outcome's advantage over its group's mean, r_l − m_g (m_g: the mean over the group's scorable outcomes;
    NaN for an unscorable outcome, and in a group without a finite mean), and whether each group's outcomes vary
    (two or more scorable, all finite, not all equal: the test of ``success.groups_with_reward_variance``)."""
    advantages = torch.full_like(rewards, math.nan, dtype=torch.float64)
    varied = {}
    for group, rows in groups.items():
        values = rewards[rows].double()
        scored = values[~torch.isnan(values)]
        finite = bool(torch.isfinite(scored).all())
        varied[group] = len(scored) >= 2 and finite and not bool(
            torch.isclose(scored.std(), torch.zeros((), dtype=torch.float64)))
        if len(scored) and finite:
            advantages[rows] = values - scored.mean()
    return advantages, varied


def reweighted_leaves(rewards: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """r'_l = m + w_l (r_l − m) = r_l + (w_l − 1)·A_l where w_l != 1 (the rarity weight scales the outcome's
    advantage A_l = r_l − m over its group's mean m); r_l itself (to the bit) where w_l = 1."""
    scaled = rewards.double() + (weights.double() - 1.0) * advantages.double()
    return torch.where(weights != 1.0, scaled, rewards.double())


def reweighted_rows(block_advantages: torch.Tensor, block_rows: list, row_weights: dict) -> torch.Tensor:
    """Cue-GRPO's rule on DATPO's blocks (``cue_tree_credit="rows"``, docs/composition.md): A_b -> w A_b where
    A_b > 0 and block b's tokens belong to a row (``block_rows[b]``: the rollout the block is trained on) whose leaf
    is in P with weight w (``row_weights``: row -> w); every other block keeps A_b to the bit, as Cue-GRPO leaves the
    advantages of incorrect completions, and the non-positive ones of correct completions, unchanged."""
    weights = torch.tensor([row_weights.get(row, 1.0) for row in block_rows], dtype=torch.float64)
    scaled = block_advantages.double() * weights
    return torch.where((block_advantages > 0) & (weights != 1.0), scaled, block_advantages.double())
