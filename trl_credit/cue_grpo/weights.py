r"""Rarity weights w'_i for the positive completions of one group (paper Eqs. 3 and 8, Algorithm 1 steps 6-12,
Appendix B/G; docs/cue_grpo.md#weights, docs/cue_grpo.md#weighting-variants) and the cluster-mass diagnostic of Fig. 2c (docs/cue_grpo.md#metrics).

Weighting modes are registered by name (verl ``core_algos`` style) and share one signature::

    mode(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max, tau) -> RarityWeights

How ``alpha`` applies per mode: ``cr`` and ``mu_matched`` use it as the rarity exponent (paper default 0.8);
``uarl`` uses it too but its paper default is 0.5 (pass ``alpha=None`` to get each mode's default);
``uniform_boost`` ignores it (every weight is τ).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from typing import NamedTuple

__all__ = [
    "RarityWeights",
    "WEIGHTING_MODES",
    "DEFAULT_ALPHA",
    "register_weighting",
    "get_weighting",
    "rarity_weights",
    "compute_rarity_weights",
    "inverse_size_multipliers",
    "reset_artifact_singletons",
    "cluster_masses",
    "cluster_mass_slope",
]


class RarityWeights(NamedTuple):
    """``weights``: the final multipliers w'_i over P. ``prefloor``: the multipliers before the additive shift
    floor (after clipping and the singleton reset), used by the Fig. 2c mass diagnostic."""

    weights: list[float]
    prefloor: list[float]


WeightingFn = Callable[[Sequence[int], "Sequence[int] | None", float, float, float, float], RarityWeights]
WEIGHTING_MODES: dict[str, WeightingFn] = {}
DEFAULT_ALPHA: dict[str, float | None] = {}


def register_weighting(name: str, default_alpha: float | None) -> Callable[[WeightingFn], WeightingFn]:
    """Register a weighting mode under ``name`` with its paper-default ``alpha`` (None when alpha is unused)."""

    def decorator(fn: WeightingFn) -> WeightingFn:
        if name in WEIGHTING_MODES:
            raise ValueError(f"weighting mode {name!r} is already registered")
        WEIGHTING_MODES[name] = fn
        DEFAULT_ALPHA[name] = default_alpha
        return fn

    return decorator


def get_weighting(name: str) -> WeightingFn:
    if name not in WEIGHTING_MODES:
        raise ValueError(f"Unknown weighting {name!r}; registered modes: {sorted(WEIGHTING_MODES)}")
    return WEIGHTING_MODES[name]


def inverse_size_multipliers(cluster_ids: Sequence[int], alpha: float) -> list[float]:
    """Core redistribution (paper Eq. 3; Algorithm 1 steps 6-9): s_i = |C_i|^-α, completion-normalized so that
    the mean over P is 1: ω_i = N·|C_i|^-α / Σ_j |C_j|^-α."""
    sizes = Counter(cluster_ids)
    raw = [sizes[c] ** -alpha for c in cluster_ids]
    mean = sum(raw) / len(raw)
    return [s / mean for s in raw]


def reset_artifact_singletons(
    weights: Sequence[float], cluster_ids: Sequence[int], skeleton_lengths: Sequence[int]
) -> list[float]:
    """Singleton artifact safeguard (Appendix B; docs/cue_grpo.md#weights): a cluster of size 1 whose cleaned skeleton length L
    satisfies L < max(2, 0.3·median) or L > max(6, 3.0·median) gets weight 1.0; median over the skeleton lengths
    of P (the mean of the two middle values when |P| is even)."""
    median = statistics.median(skeleton_lengths)
    low, high = max(2.0, 0.3 * median), max(6.0, 3.0 * median)
    sizes = Counter(cluster_ids)
    return [
        1.0 if sizes[c] == 1 and (length < low or length > high) else w
        for w, c, length in zip(weights, cluster_ids, skeleton_lengths, strict=True)
    ]


def _clip(weights: Sequence[float], gamma_min: float, gamma_max: float) -> list[float]:
    return [min(max(w, gamma_min), gamma_max) for w in weights]


def _clipped_and_reset(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max) -> list[float]:
    # Algorithm 1 step 10: clip, then reset artifact singletons to 1.0 (1.0 lies inside any valid clip range,
    # so the order of the two does not matter).
    weights = _clip(inverse_size_multipliers(cluster_ids, alpha), gamma_min, gamma_max)
    if skeleton_lengths is not None:
        weights = reset_artifact_singletons(weights, cluster_ids, skeleton_lengths)
    return weights


@register_weighting("cr", default_alpha=0.8)
def credit_redistribution(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max, tau) -> RarityWeights:
    """Cue-GRPO's CR rule (Algorithm 1 steps 6-12, Eq. 8): normalized |C|^-α, clip to [γmin, γmax], singleton
    reset (only when skeleton lengths are given), then the shift floor δ = max(0, τ − min_P w) added to all of P."""
    weights = _clipped_and_reset(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max)
    shift = max(0.0, tau - min(weights))
    return RarityWeights([w + shift for w in weights], weights)


@register_weighting("mu_matched", default_alpha=0.8)
def mean_matched(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max, tau) -> RarityWeights:
    """Cue-GRPO (μ-matched) ablation (Appendix G; docs/cue_grpo.md#weighting-variants): as ``cr`` up to clip + singleton reset, then no floor;
    the post-filter weights are renormalized to unit mean over P."""
    weights = _clipped_and_reset(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max)
    mean = sum(weights) / len(weights)
    weights = [w / mean for w in weights]
    return RarityWeights(weights, weights)


@register_weighting("uarl", default_alpha=0.5)
def uarl(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max, tau) -> RarityWeights:
    """UARL weighting (Appendix B; docs/cue_grpo.md#weighting-variants): w = |C|^-α normalized to unit mean over P; no clip, no floor, no
    singleton reset (UARL has no cue skeletons; ``skeleton_lengths``, γ and τ are ignored)."""
    weights = inverse_size_multipliers(cluster_ids, alpha)
    return RarityWeights(weights, weights)


@register_weighting("uniform_boost", default_alpha=None)
def uniform_boost(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max, tau) -> RarityWeights:
    """Uniform-Boost ablation (Appendix G; docs/cue_grpo.md#weighting-variants): every positive advantage × τ, no clustering. Its pre-floor
    multiplier is 1 (the boost plays the role of the floor)."""
    return RarityWeights([float(tau)] * len(cluster_ids), [1.0] * len(cluster_ids))


def compute_rarity_weights(
    cluster_ids: Sequence[int],
    skeleton_lengths: Sequence[int] | None = None,
    alpha: float | None = None,
    gamma_min: float = 0.3,
    gamma_max: float = 3.0,
    tau: float = 1.05,
    mode: str = "cr",
) -> RarityWeights:
    """:func:`rarity_weights` returning both the final and the pre-floor multipliers."""
    weighting = get_weighting(mode)
    if skeleton_lengths is not None and len(skeleton_lengths) != len(cluster_ids):
        raise ValueError(
            f"skeleton_lengths has {len(skeleton_lengths)} entries, cluster_ids {len(cluster_ids)}; need one per positive"
        )
    if len(cluster_ids) == 0:
        return RarityWeights([], [])
    if alpha is None:
        alpha = DEFAULT_ALPHA[mode] if DEFAULT_ALPHA[mode] is not None else 0.0
    return weighting(list(cluster_ids), skeleton_lengths, float(alpha), float(gamma_min), float(gamma_max), float(tau))


def rarity_weights(
    cluster_ids: Sequence[int],
    skeleton_lengths: Sequence[int] | None = None,
    alpha: float | None = None,
    gamma_min: float = 0.3,
    gamma_max: float = 3.0,
    tau: float = 1.05,
    mode: str = "cr",
) -> list[float]:
    """Multipliers w'_i for the positive completions P of one group, given their cluster ids (docs/cue_grpo.md#weights, docs/cue_grpo.md#weighting-variants).

    ``alpha=None`` takes the mode's paper default (0.8 for ``cr``/``mu_matched``, 0.5 for ``uarl``).
    ``skeleton_lengths`` (cleaned cue-skeleton lengths, one per completion of P) enable the singleton artifact
    reset of ``cr``/``mu_matched``; leave them None for partitions without cue skeletons (judge, user callable).
    Â_i = A_i·w'_i for i ∈ P; other advantages are unchanged (the caller applies this).
    """
    return compute_rarity_weights(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max, tau, mode).weights


def cluster_masses(cluster_ids: Sequence[int], multipliers: Sequence[float]) -> list[tuple[int, float]]:
    """(n_C, n_C·w̄_C) per cluster: size and positive coefficient mass per unit advantage (Fig. 2c's M_C when
    ``multipliers`` are the pre-floor weights)."""
    members: dict[int, list[float]] = {}
    for cluster, weight in zip(cluster_ids, multipliers, strict=True):
        members.setdefault(cluster, []).append(weight)
    return [(len(ws), float(sum(ws))) for ws in members.values()]


def cluster_mass_slope(sizes: Sequence[float], masses: Sequence[float]) -> float:
    """Least-squares slope of log M_C against log n_C over clusters (paper Fig. 2c; docs/cue_grpo.md#metrics). GRPO gives 1.0;
    rarity weighting lowers it. NaN when fewer than two distinct cluster sizes (the slope is undefined)."""
    points = [(math.log(n), math.log(m)) for n, m in zip(sizes, masses, strict=True) if n > 0 and m > 0]
    if len({x for x, _ in points}) < 2:
        return float("nan")
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return sxy / sxx
