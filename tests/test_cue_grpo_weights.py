"""Rarity weights (paper Eq. 3, 8, Algorithm 1 steps 6-12, Appendix B/G; docs/cue_grpo.md#weights, docs/cue_grpo.md#weighting-variants) worked by hand on the
paper's 4:2:1 illustration (cluster ids: 4 completions in cluster 0, 2 in cluster 1, 1 in cluster 2)."""

import math
import random

import pytest

from trl_credit.cue_grpo import (
    WEIGHTING_MODES,
    cluster_mass_slope,
    cluster_masses,
    compute_rarity_weights,
    rarity_weights,
    register_weighting,
)
from trl_credit.cue_grpo.weights import RarityWeights, inverse_size_multipliers

IDS_421 = [0, 0, 0, 0, 1, 1, 2]

# alpha = 0.8: s = 4^-0.8 = 0.329877, 2^-0.8 = 0.574349, 1^-0.8 = 1
# mean over P = (4*0.329877 + 2*0.574349 + 1) / 7 = 3.468206 / 7 = 0.495458
# normalized: 0.665802, 1.159228, 2.018334 (inside [0.3, 3])
S4, S2 = 4**-0.8, 2**-0.8
MEAN = (4 * S4 + 2 * S2 + 1) / 7
N4, N2, N1 = S4 / MEAN, S2 / MEAN, 1 / MEAN


def test_hand_numbers():
    assert (N4, N2, N1) == pytest.approx((0.665802, 1.159229, 2.018334), abs=1e-6)


def test_cr_421_with_floor():
    # floor: delta = 1.05 - min = 1.05 - 0.665802 = 0.384198 -> 1.05, 1.543427, 2.402533
    delta = 1.05 - N4
    expected = [N4 + delta] * 4 + [N2 + delta] * 2 + [N1 + delta]
    assert rarity_weights(IDS_421) == pytest.approx(expected, abs=1e-12)
    assert rarity_weights(IDS_421)[-1] == pytest.approx(2.402533, abs=3e-6)


def test_cr_421_singleton_reset():
    # lengths: median 3 -> low = max(2, 0.9) = 2, high = max(6, 9) = 9; the singleton has L = 1 < 2 -> reset to 1
    # then delta = 1.05 - 0.665802 -> singleton 1 + 0.384198 = 1.384198
    delta = 1.05 - N4
    got = rarity_weights(IDS_421, skeleton_lengths=[3, 3, 3, 3, 3, 3, 1])
    assert got == pytest.approx([N4 + delta] * 4 + [N2 + delta] * 2 + [1 + delta], abs=1e-12)
    # L = 2 is not < 2 and not > 9: kept
    assert rarity_weights(IDS_421, skeleton_lengths=[3] * 6 + [2]) == pytest.approx(rarity_weights(IDS_421))
    # L = 10 > 9: reset; only singletons are reset (the pairs have L = 10 too in the second call)
    assert rarity_weights(IDS_421, skeleton_lengths=[3] * 6 + [10])[-1] == pytest.approx(1 + delta)
    assert rarity_weights(IDS_421, skeleton_lengths=[3] * 4 + [10, 10, 3])[4] == pytest.approx(N2 + delta)


def test_singleton_reset_high_threshold_uses_max_with_6():
    # 1 cluster of 3 (L = 2 each) + singleton with L = 6: median of [2,2,2,6] = 2 -> high = max(6, 6) = 6, 6 > 6 false
    # -> not reset; L = 7 > 6 -> reset.
    ids = [0, 0, 0, 1]
    kept = rarity_weights(ids, skeleton_lengths=[2, 2, 2, 6], mode="mu_matched")
    reset = rarity_weights(ids, skeleton_lengths=[2, 2, 2, 7], mode="mu_matched")
    assert kept == pytest.approx(rarity_weights(ids, mode="mu_matched"))
    # reset: pre-renormalization [n3, n3, n3, 1] with n3 = 3^-0.8 / ((3*3^-0.8 + 1)/4)
    n3 = 3**-0.8 / ((3 * 3**-0.8 + 1) / 4)
    mean = (3 * n3 + 1) / 4
    assert reset == pytest.approx([n3 / mean] * 3 + [1 / mean])


def test_cr_clip():
    # 9:1, alpha 0.8: s = 9^-0.8 = 0.172427, 1; mean = (9*0.172427 + 1)/10 = 0.255185
    # normalized 0.675696 and 3.918732 -> clipped to 3.0; delta = 1.05 - 0.675696 = 0.374304
    ids = [0] * 9 + [1]
    s9 = 9**-0.8
    n9, n1 = s9 / ((9 * s9 + 1) / 10), 1 / ((9 * s9 + 1) / 10)
    assert (n9, n1) == pytest.approx((0.675696, 3.918732), abs=1e-6)
    delta = 1.05 - n9
    result = compute_rarity_weights(ids)
    assert result.weights == pytest.approx([n9 + delta] * 9 + [3.0 + delta])
    assert result.prefloor == pytest.approx([n9] * 9 + [3.0])  # after clip, before floor
    # a tighter clip range [0.7, 1.5]: both ends bite: 0.675696 -> 0.7, 3.918732 -> 1.5; delta = 0.35
    assert rarity_weights(ids, gamma_min=0.7, gamma_max=1.5) == pytest.approx([1.05] * 9 + [1.85])


def test_uarl_421():
    # alpha 0.5, no clip/floor: s = 0.5, 0.707107, 1; mean = (2 + 1.414214 + 1)/7 = 0.630602
    s2 = 2**-0.5
    mean = (4 * 0.5 + 2 * s2 + 1) / 7
    expected = [0.5 / mean] * 4 + [s2 / mean] * 2 + [1 / mean]
    assert rarity_weights(IDS_421, mode="uarl") == pytest.approx(expected)
    assert rarity_weights(IDS_421, mode="uarl")[-1] == pytest.approx(1.585786, abs=1e-6)
    # skeleton lengths are ignored (no singleton reset), and so are clip bounds
    assert rarity_weights(IDS_421, [3] * 6 + [1], mode="uarl", gamma_max=1.0) == pytest.approx(expected)


def test_mu_matched_421():
    # no reset: normalized weights already have mean 1 -> unchanged, no floor
    assert rarity_weights(IDS_421, mode="mu_matched") == pytest.approx([N4] * 4 + [N2] * 2 + [N1])
    # with the singleton reset: [N4 x4, N2 x2, 1], mean = (4*0.665802 + 2*1.159228 + 1)/7 = 0.854523
    mean = (4 * N4 + 2 * N2 + 1) / 7
    got = rarity_weights(IDS_421, [3] * 6 + [1], mode="mu_matched")
    assert got == pytest.approx([N4 / mean] * 4 + [N2 / mean] * 2 + [1 / mean])
    assert sum(got) / 7 == pytest.approx(1.0)


def test_uniform_boost():
    result = compute_rarity_weights(IDS_421, mode="uniform_boost", alpha=0.3)
    assert result == RarityWeights([1.05] * 7, [1.0] * 7)


def test_alpha_zero_is_grpo_up_to_the_floor():
    # alpha = 0: every s_C = 1 -> normalized 1 for everyone. cr then adds delta = tau - 1 to all: uniform tau
    # (= uniform_boost); with tau <= 1 the floor is inactive and cr is exactly GRPO (all 1). mu_matched and uarl
    # have no floor: exactly GRPO.
    assert rarity_weights(IDS_421, alpha=0.0) == pytest.approx([1.05] * 7)
    assert rarity_weights(IDS_421, alpha=0.0, tau=1.0) == pytest.approx([1.0] * 7)
    assert rarity_weights(IDS_421, alpha=0.0, mode="mu_matched") == pytest.approx([1.0] * 7)
    assert rarity_weights(IDS_421, alpha=0.0, mode="uarl") == pytest.approx([1.0] * 7)


def test_core_multipliers_have_unit_mean_over_p():
    rng = random.Random(0)
    for _ in range(100):
        ids = [rng.randint(0, 5) for _ in range(rng.randint(1, 64))]
        alpha = rng.random()
        assert sum(inverse_size_multipliers(ids, alpha)) / len(ids) == pytest.approx(1.0)


def test_single_positive_and_empty():
    # |P| = 1: weight 1, floor -> 1.05 (cr); uarl -> 1
    assert rarity_weights([0]) == pytest.approx([1.05])
    assert rarity_weights([0], mode="uarl") == pytest.approx([1.0])
    assert rarity_weights([]) == []


def test_default_alpha_per_mode():
    assert rarity_weights(IDS_421, mode="uarl") == rarity_weights(IDS_421, mode="uarl", alpha=0.5)
    assert rarity_weights(IDS_421) == rarity_weights(IDS_421, alpha=0.8)


def test_registry():
    assert {"cr", "uarl", "mu_matched", "uniform_boost"} <= set(WEIGHTING_MODES)
    with pytest.raises(ValueError, match="Unknown weighting 'nope'"):
        rarity_weights(IDS_421, mode="nope")

    @register_weighting("test_half", default_alpha=None)
    def half(cluster_ids, skeleton_lengths, alpha, gamma_min, gamma_max, tau):
        return RarityWeights([0.5] * len(cluster_ids), [0.5] * len(cluster_ids))

    try:
        assert rarity_weights([0, 1], mode="test_half") == [0.5, 0.5]
        with pytest.raises(ValueError, match="already registered"):
            register_weighting("test_half", None)(half)
    finally:
        WEIGHTING_MODES.pop("test_half")


def test_cluster_mass_slope():
    # GRPO (all multipliers 1): M_C = n_C -> slope 1
    sizes_masses = cluster_masses(IDS_421, [1.0] * 7)
    assert sorted(sizes_masses) == [(1, 1.0), (2, 2.0), (4, 4.0)]
    assert cluster_mass_slope(*zip(*sizes_masses)) == pytest.approx(1.0)
    # uarl with alpha = 1: w = (1/n) * 7/3 -> M_C = 7/3 for every cluster -> slope 0
    w = rarity_weights(IDS_421, mode="uarl", alpha=1.0)
    assert cluster_mass_slope(*zip(*cluster_masses(IDS_421, w))) == pytest.approx(0.0, abs=1e-12)
    # two points (n, M) = (1, 2), (4, 4): slope = (ln 4 - ln 2) / (ln 4 - ln 1) = 0.5
    assert cluster_mass_slope([1, 4], [2, 4]) == pytest.approx(0.5)
    assert math.isnan(cluster_mass_slope([2, 2], [1, 3]))  # one distinct size: undefined
