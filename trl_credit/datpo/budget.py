"""Difficulty-adaptive tree budget (DATPO paper §3.1, Eq. 1-2; docs/datpo.md#budget)."""

from __future__ import annotations

import math

__all__ = ["adaptive_budget", "root_success_rate"]

# Budgets are ceilings of K_max·(1 − V_root). A product that is mathematically an integer can land a hair above
# it in floating point (3·(1 − 1/3) = 2.0000000000000004), and ceil would then add a whole extra fork. Products
# within this tolerance of an integer are treated as that integer.
_CEIL_TOLERANCE = 1e-9


def _ceil(x: float) -> int:
    return int(math.ceil(x - _CEIL_TOLERANCE))


def adaptive_budget(v_root: float, k_max: int, b_max: int) -> tuple[int, int]:
    """Forks per base rollout K̂ and branches per fork B̂ for a prompt whose N base rollouts scored ``v_root``.

    Paper Eq. 1-2 / docs/datpo.md#budget: ``K̂ = ceil(K_max·(1 − V_root))``, ``B̂ = ceil(B_max·(1 − V_root))``. ``V_root`` is the
    mean base reward, which lies in [0, 1] for the verifiable 0/1 rewards the paper uses; values outside are clamped
    to [0, 1] (a prompt with mean reward ≥ 1 is "solved" and does not branch, ≤ 0 gets the full budget).
    ``V_root = 1`` gives (0, 0): no branching. The trainer passes :func:`root_success_rate` (the verifier's 0/1
    verdicts), so the budget keeps the paper's meaning when a script adds reward functions.
    """
    if k_max < 0 or b_max < 0:
        raise ValueError(f"k_max and b_max must be >= 0, got k_max={k_max}, b_max={b_max}")
    if math.isnan(v_root):
        raise ValueError("v_root is NaN: the base rollouts of this prompt have no usable reward.")
    unsolved = 1.0 - min(1.0, max(0.0, float(v_root)))
    return _ceil(k_max * unsolved), _ceil(b_max * unsolved)


def root_success_rate(success: list[bool], unscorable: list[bool]) -> float:
    """V_root of Eq. 1-2: the fraction of the prompt's base rollouts that the verifier calls correct, i.e. the mean
    of the paper's 0/1 rewards. Unscorable rollouts (every reward function returned None) are neither correct nor
    wrong and are left out; NaN when no base rollout could be scored."""
    if len(success) != len(unscorable):
        raise ValueError(f"success and unscorable need one entry per rollout, got {len(success)} and {len(unscorable)}")
    scored = [bool(s) for s, u in zip(success, unscorable) if not u]
    return sum(scored) / len(scored) if scored else math.nan
