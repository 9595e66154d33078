"""Sibling diversity and the annealed diversity bonus (DATPO paper §3.2 Eq. 4, App. E.1 Eq. 8; docs/datpo.md#sibling-diversity).

Siblings are the blocks that start at the same node (a fork, or the root: the first blocks of the N base
rollouts). ``Div(b) = 1 − mean_{b' sibling of b} cos(e_b, e_b')``, 0 for a block without siblings, and

    Â(b) = A_base(b) + 1[A_base(b) > 0] · α_t · Div(b)

with α_t linearly annealed from 0.2 to 0 over the optimizer steps (paper §4.4, App. F.2). Ablations (paper
Table 4): the bonus on all blocks, a constant α.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

__all__ = ["ALPHA_SCHEDULES", "POSITIVE_TOLERANCE", "sibling_diversity", "bonus_gate", "diversity_bonus", "annealed_alpha"]

ALPHA_SCHEDULES = ("linear", "constant")

# A_base is a difference of means of leaf rewards, so a block whose advantage is exactly 0 (its leaf reward equals
# its node's value, e.g. three leaves 0.7, 0.7, 0.7) can come out as +1.1e-16 in floating point. The indicator
# 1[A_base > 0] must not hand such a block the full bonus: "positive" means above this tolerance (relative to the
# reward scale: the trainer passes tolerance·max(1, max |leaf reward|)).
POSITIVE_TOLERANCE = 1e-9


def sibling_diversity(embeddings: torch.Tensor, block_start: Sequence[Hashable | None]) -> torch.Tensor:
    """Div(b) for every block (paper Eq. 8), shape (num_blocks,).

    ``embeddings`` (num_blocks, dim) need not be normalized (cosine similarity normalizes them). Blocks with the
    same ``block_start`` key are siblings; a key of ``None`` means "no siblings" (e.g. a block with no text) and
    such blocks neither get nor give diversity.
    """
    if embeddings.dim() != 2 or embeddings.size(0) != len(block_start):
        raise ValueError(
            f"embeddings must be (num_blocks, dim) with num_blocks = len(block_start) = {len(block_start)}, "
            f"got shape {tuple(embeddings.shape)}"
        )
    unit = torch.nn.functional.normalize(embeddings.double(), dim=-1)
    diversity = torch.zeros(len(block_start), dtype=torch.float64, device=embeddings.device)
    groups: dict[Hashable, list[int]] = defaultdict(list)
    for b, key in enumerate(block_start):
        if key is not None:
            groups[key].append(b)
    for members in groups.values():
        if len(members) < 2:
            continue
        index = torch.tensor(members, device=embeddings.device)
        cosine = unit[index] @ unit[index].T
        # mean over the other siblings: drop the diagonal (self-similarity)
        mean_other = (cosine.sum(dim=1) - cosine.diagonal()) / (len(members) - 1)
        diversity[index] = 1.0 - mean_other
    return diversity


def bonus_gate(
    base_advantages: torch.Tensor, *, on_all_blocks: bool = False, tolerance: float = POSITIVE_TOLERANCE
) -> torch.Tensor:
    """1[A_base(b) > 0] of paper Eq. 4 as 0/1 in the dtype of ``base_advantages``, with "> 0" meaning
    "> ``tolerance``" (rounding noise is not a positive advantage); all ones with ``on_all_blocks``."""
    if on_all_blocks:
        return torch.ones_like(base_advantages)
    return (base_advantages > tolerance).to(base_advantages.dtype)


def diversity_bonus(
    base_advantages: torch.Tensor,
    diversity: torch.Tensor,
    alpha: float,
    *,
    on_all_blocks: bool = False,
    tolerance: float = POSITIVE_TOLERANCE,
) -> torch.Tensor:
    """Â(b) = A_base(b) + 1[A_base(b) > 0]·α·Div(b) (paper Eq. 4); ``on_all_blocks`` drops the indicator.
    See :func:`bonus_gate` for the tolerance."""
    if base_advantages.shape != diversity.shape:
        raise ValueError(f"shape mismatch: base_advantages {tuple(base_advantages.shape)} vs diversity {tuple(diversity.shape)}")
    gate = bonus_gate(base_advantages, on_all_blocks=on_all_blocks, tolerance=tolerance)
    return base_advantages + gate * float(alpha) * diversity.to(base_advantages.dtype)


def annealed_alpha(
    step: int, total_steps: int, start: float = 0.2, end: float = 0.0, schedule: str = "linear"
) -> float:
    """α at optimizer step ``step`` (0-based) of a ``total_steps`` run.

    ``linear``: α = start + (end − start)·step/(total_steps − 1), so the first step uses ``start`` and the last
    uses ``end`` (a 1-step run uses ``start``); steps past the end stay at ``end``. ``constant``: always ``start``.
    """
    if schedule not in ALPHA_SCHEDULES:
        raise ValueError(f"schedule must be one of {ALPHA_SCHEDULES}, got {schedule!r}")
    if schedule == "constant" or total_steps <= 1:
        return float(start)
    progress = min(1.0, max(0.0, step / (total_steps - 1)))
    return float(start + (end - start) * progress)
