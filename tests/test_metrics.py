"""Repeated-sampling metrics (docs/design.md#answer-checking; Cue-GRPO Eq. 9, Eq. 10, Tables 2-5 and 7-10)."""

from fractions import Fraction
from math import comb

import pytest

from trl_credit.evaluation.metrics import (
    AUC_BUDGETS,
    auc_at_k,
    auc_budgets,
    avg_at_k,
    maj_at_k,
    maj_at_ks,
    majority_answer,
    mean_pass_at_k,
    pass_at_k,
)


def reference_pass_at_k(n, c, k):
    """Chen et al. 2021 with exact integer binomials (C(a, b) = 0 for a < b), as an exact fraction."""
    numerator = comb(n - c, k) if n - c >= k else 0
    return 1 - Fraction(numerator, comb(n, k))


# ---------------------------------------------------------------------------------------------------- pass@k


def test_pass_at_k_hand_worked():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-15)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    # k=1 is the plain fraction correct: n=8, c=3 -> 3/8
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8, abs=1e-15)


def test_pass_at_k_matches_exact_binomials_for_all_small_cases():
    for n in range(1, 16):
        for c in range(0, n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(reference_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


@pytest.mark.parametrize("n,c,k", [(256, 3, 128), (256, 1, 255), (256, 100, 4), (2000, 7, 1000), (2000, 1990, 5)])
def test_pass_at_k_exact_for_large_n(n, c, k):
    # Factorial-based formulas overflow floats here (C(2000, 1000) ~ 1e600); the product form must stay exact.
    assert pass_at_k(n, c, k) == pytest.approx(float(reference_pass_at_k(n, c, k)), rel=1e-12, abs=1e-15)


def test_pass_at_k_accepts_numpy_integers():
    import numpy as np

    assert pass_at_k(np.int64(4), np.int64(1), np.int32(2)) == pytest.approx(0.5)  # as the hand-worked case
    assert mean_pass_at_k(np.int64(4), np.array([1, 0, 4]), 2) == pytest.approx(0.5)


def test_pass_at_k_edge_cases():
    assert pass_at_k(10, 0, 5) == 0.0  # no correct sample: never passes
    assert pass_at_k(10, 6, 5) == 1.0  # n - c = 4 < k = 5: every 5-subset holds a correct sample
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 1, 10) == 1.0  # k = n: any correct sample counts
    assert pass_at_k(1, 0, 1) == 0.0 and pass_at_k(1, 1, 1) == 1.0


@pytest.mark.parametrize(
    "n,c,k,message",
    [(4, 1, 0, "k must be"), (4, 1, 5, "k must satisfy"), (4, 5, 2, "c .correct samples."), (4, -1, 2, "c must be"),
     (0, 0, 1, "n must be"), (4.0, 1, 2, "n must be"), (4, 1, 1.5, "k must be"), (True, 1, 1, "n must be")],
)
def test_pass_at_k_rejects_bad_arguments(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def test_mean_pass_at_k_averages_problems():
    # n=4: c=1 -> pass@2 = 0.5 (above); c=0 -> 0; c=4 -> 1. Mean = 1.5/3 = 0.5
    assert mean_pass_at_k(4, [1, 0, 4], 2) == pytest.approx(0.5)
    # per-problem n: (n=4,c=1,k=2) 0.5 and (n=5,c=2,k=2) 0.7 -> 0.6
    assert mean_pass_at_k([4, 5], [1, 2], 2) == pytest.approx(0.6)
    with pytest.raises(ValueError, match="one per problem"):
        mean_pass_at_k([4, 5], [1], 2)
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k(4, [], 1)


# ---------------------------------------------------------------------------------------------------- AUC@K


def test_auc_budgets():
    assert AUC_BUDGETS == (1, 4, 8, 16, 32, 64, 128, 256)
    assert auc_budgets(32) == [1, 4, 8, 16, 32]
    assert auc_budgets(100) == [1, 4, 8, 16, 32, 64]
    assert auc_budgets(1000) == list(AUC_BUDGETS)


def test_auc_at_k_hand_worked():
    # budgets 1, 4, 8 with p = 0.2, 0.5, 0.6:
    # (3 * (0.2 + 0.5) / 2 + 4 * (0.5 + 0.6) / 2) / (8 - 1) = (1.05 + 2.2) / 7 = 0.4642857...
    assert auc_at_k({1: 0.2, 4: 0.5, 8: 0.6}, 8) == pytest.approx(3.25 / 7)
    # AUC@4 uses only k = 1, 4: (0.2 + 0.5) / 2 = 0.35; keys above K are ignored
    assert auc_at_k({1: 0.2, 4: 0.5, 8: 0.6}, 4) == pytest.approx(0.35)


def test_auc_of_constant_curve_is_the_constant():
    assert auc_at_k({k: 0.37 for k in AUC_BUDGETS}, 256) == pytest.approx(0.37)


def test_auc_with_cap_between_budgets_normalizes_by_integrated_span():
    # K = 10: budgets 1, 4, 8; normalizer 8 - 1 = 7 (Eq. 9's K - 1 = 9 would shrink a constant curve to 7/9).
    assert auc_at_k({1: 0.5, 4: 0.5, 8: 0.5}, 10) == pytest.approx(0.5)


def test_auc_at_k_errors():
    with pytest.raises(ValueError, match="K >= 4"):
        auc_at_k({1: 0.5}, 3)
    with pytest.raises(ValueError, match=r"lacks pass@k for k=\[8\]"):
        auc_at_k({1: 0.2, 4: 0.5}, 8)
    with pytest.raises(ValueError, match="K must be"):
        auc_at_k({1: 0.2, 4: 0.5}, 0)


# Cue-GRPO Appendix D, Table 7 (pass@k %, Qwen2.5-Math-7B) and main-text Table 2 (AUC@K %), transcribed.
# Each row: pass@1, 4, 8, 16, 32, 64, 128, 256 (as far as the table has them) and {K: AUC@K}.
TABLE7_VS_TABLE2 = {
    ("AIME", "Base"): ([6.3, 15.2, 20.5, 25.3, 29.6, 33.6, 38.0, 43.3], {64: 27.58, 128: 31.72, 256: 36.20}),
    ("AIME", "GRPO"): ([7.6, 17.6, 23.1, 28.3, 32.8, 36.9, 41.7, 47.8], {64: 30.62, 128: 34.99, 256: 39.89}),
    ("AIME", "UARL"): ([8.4, 18.3, 23.5, 28.3, 32.6, 36.3, 39.9, 44.4], {64: 30.48, 128: 34.32, 256: 38.25}),
    ("AIME", "CR-JP"): ([8.8, 19.1, 24.4, 29.1, 33.1, 36.8, 41.3, 47.8], {64: 31.09, 128: 35.10, 256: 39.84}),
    ("AIME", "Cue-GRPO"): ([8.6, 18.9, 24.3, 29.4, 34.1, 39.0, 44.7, 52.2], {64: 32.06, 128: 37.00, 256: 42.75}),
    ("HLE", "Base"): ([1.1, 4.0, 7.0, 11.4, 17.2, 23.8, 30.4, 36.5], {64: 15.68, 128: 21.44, 256: 27.47}),
    ("HLE", "GRPO"): ([1.2, 4.4, 7.7, 12.3, 18.1, 24.6, 31.3, 37.5], {64: 16.49, 128: 22.27, 256: 28.36}),
    ("HLE", "UARL"): ([1.4, 5.1, 8.8, 13.9, 20.2, 27.1, 33.6, 39.5], {64: 18.38, 128: 24.41, 256: 30.50}),
    ("HLE", "CR-JP"): ([1.4, 4.7, 8.2, 13.1, 19.2, 26.1, 33.5, 40.5], {64: 17.51, 128: 23.71, 256: 30.38}),
    ("HLE", "Cue-GRPO"): ([1.3, 4.6, 8.0, 12.7, 18.8, 25.6, 32.2, 37.5], {64: 17.13, 128: 23.06, 256: 28.98}),
    ("MATH500", "Base"): ([39.5, 66.4, 74.1, 79.1, 82.6, 85.1, 87.0], {32: 75.69, 64: 79.83, 128: 82.97}),
    ("MATH500", "GRPO"): ([46.7, 69.7, 75.4, 79.2, 82.1, 84.4, 86.0], {32: 76.57, 64: 79.96, 128: 82.60}),
    ("MATH500", "UARL"): ([47.2, 69.8, 75.5, 79.5, 82.8, 85.5, 88.0], {32: 76.92, 64: 80.59, 128: 83.70}),
    ("MATH500", "CR-JP"): ([44.7, 70.1, 76.2, 80.1, 83.1, 85.5, 87.6], {32: 77.28, 64: 80.84, 128: 83.72}),
    ("MATH500", "Cue-GRPO"): ([47.0, 69.7, 75.6, 79.8, 83.0, 85.6, 87.8], {32: 77.09, 64: 80.75, 128: 83.75}),
    ("GSM8K", "Base"): ([45.1, 80.7, 90.5, 95.4, 97.0], {32: 90.77}),
    ("GSM8K", "GRPO"): ([54.2, 84.0, 91.0, 95.1, 97.5], {32: 91.68}),
    ("GSM8K", "UARL"): ([57.1, 85.0, 91.3, 95.1, 97.0], {32: 91.88}),
    ("GSM8K", "CR-JP"): ([53.9, 84.0, 91.3, 95.3, 97.5], {32: 91.81}),
    ("GSM8K", "Cue-GRPO"): ([54.9, 86.1, 92.8, 96.0, 97.5], {32: 92.66}),
}

# Table 8 (Llama-3.1-8B-Instruct pass@k) vs Table 3 (AUC@K).
TABLE8_VS_TABLE3 = {
    ("AIME", "Base"): ([1.1, 3.7, 6.2, 9.4, 13.3, 18.5, 25.1, 32.5], {128: 17.13, 256: 22.99}),
    ("AIME", "GRPO"): ([1.9, 5.9, 8.9, 12.2, 15.8, 20.2, 25.7, 32.2], {128: 18.85, 256: 23.92}),
    ("AIME", "UARL"): ([1.9, 5.8, 8.8, 11.9, 15.2, 19.1, 24.3, 32.2], {128: 17.94, 256: 23.11}),
    ("AIME", "Cue-GRPO"): ([1.8, 5.7, 8.7, 12.2, 16.2, 21.2, 27.6, 35.6], {128: 19.77, 256: 25.71}),
    ("MATH500", "Base"): ([26.1, 48.9, 58.7, 67.0, 73.8, 79.2], {64: 69.91}),
    ("MATH500", "GRPO"): ([32.1, 54.0, 62.8, 70.1, 76.1, 80.8], {64: 72.61}),
    ("MATH500", "UARL"): ([32.0, 53.5, 62.2, 69.3, 74.8, 78.6], {64: 71.32}),
    ("MATH500", "Cue-GRPO"): ([31.4, 53.6, 62.7, 70.2, 76.1, 80.6], {64: 72.53}),
    ("GSM8K", "Base"): ([43.4, 80.6, 90.9, 96.1, 98.5], {32: 91.41}),
    ("GSM8K", "GRPO"): ([56.8, 86.7, 92.8, 96.0, 98.0], {32: 92.95}),
    ("GSM8K", "UARL"): ([55.9, 86.7, 92.9, 96.2, 98.0], {32: 93.00}),
    ("GSM8K", "Cue-GRPO"): ([55.1, 85.5, 91.7, 94.9, 97.5], {32: 91.96}),
}

# Table 9 (ablation pass@k, AIME, K=128) vs Table 4 (AUC@64/128).
TABLE9_VS_TABLE4 = {
    "GRPO": ([7.7, 17.4, 22.8, 27.5, 31.2, 34.3, 37.8], {64: 29.18, 128: 32.64}),
    "Uniform-Boost": ([8.7, 18.5, 23.4, 27.7, 31.3, 34.6, 38.9], {64: 29.45, 128: 33.13}),
    "Random-Cluster": ([7.9, 17.8, 23.1, 27.9, 32.2, 36.0, 40.0], {64: 30.10, 128: 34.09}),
    "mu-matched": ([8.4, 18.4, 23.9, 28.9, 33.1, 37.0, 41.1], {64: 31.00, 128: 35.05}),
    "alpha=0.5": ([8.5, 18.6, 23.8, 28.6, 33.2, 37.9, 43.3], {64: 31.22, 128: 35.96}),
    "alpha=0.8": ([8.1, 18.3, 23.8, 28.9, 33.6, 38.3, 43.3], {64: 31.51, 128: 36.19}),
    "alpha=1.0": ([8.3, 18.0, 23.1, 27.8, 32.3, 36.9, 43.3], {64: 30.36, 128: 35.28}),
}

# Table 10 (multi-seed pass@k, AIME) vs Table 5 (AUC@64/128/256).
TABLE10_VS_TABLE5 = {
    (7, "Cue-GRPO"): ([8.3, 18.5, 23.9, 28.8, 33.0, 36.8, 41.2, 46.7], {64: 30.90, 128: 34.98, 256: 39.48}),
    (7, "GRPO"): ([8.4, 18.5, 23.7, 28.4, 32.4, 35.7, 39.1, 43.3], {64: 30.31, 128: 33.90, 256: 37.58}),
    (42, "Cue-GRPO"): ([8.6, 18.9, 24.3, 29.4, 34.1, 39.0, 44.7, 52.2], {64: 32.06, 128: 37.00, 256: 42.75}),
    (42, "GRPO"): ([7.6, 17.6, 23.1, 28.3, 32.8, 36.9, 41.7, 47.8], {64: 30.62, 128: 34.99, 256: 39.89}),
    (123, "Cue-GRPO"): ([8.2, 17.9, 23.1, 27.9, 31.9, 35.7, 40.1, 46.7], {64: 29.92, 128: 33.92, 256: 38.66}),
    (123, "GRPO"): ([8.7, 18.9, 24.1, 28.5, 32.3, 35.8, 39.5, 44.4], {64: 30.37, 128: 34.04, 256: 38.03}),
}

# The pass@k values are printed to 0.1, i.e. each is off by at most 0.05; AUC@K is a weighted average of them
# with weights summing to 1, so the recomputed AUC is off by at most 0.05, and the printed AUC (to 0.01) by at
# most 0.005 more. Every row must agree to within 0.055. (Measured: Table 7 rows agree to 0.005 except
# GSM8K/GRPO at 0.0135; the largest gap over all four tables is 0.03.)
ROUNDING_TOLERANCE = 0.05 + 0.005


def _check_rows(rows):
    worst = 0.0
    for name, (pass_row, reported) in rows.items():
        pass_by_k = dict(zip(AUC_BUDGETS, pass_row))
        for K, expected in reported.items():
            got = auc_at_k(pass_by_k, K)
            assert abs(got - expected) <= ROUNDING_TOLERANCE, f"{name} AUC@{K}: recomputed {got:.4f}, paper {expected}"
            worst = max(worst, abs(got - expected))
    return worst


@pytest.mark.parametrize(
    "rows", [TABLE7_VS_TABLE2, TABLE8_VS_TABLE3, TABLE9_VS_TABLE4, TABLE10_VS_TABLE5],
    ids=["table7_vs_table2", "table8_vs_table3", "table9_vs_table4", "table10_vs_table5"],
)
def test_auc_recomputed_from_paper_pass_at_k_matches_paper_auc(rows):
    _check_rows(rows)


def test_paper_auc_agreement_is_tight_not_just_within_tolerance():
    # A wrong normalizer or budget set would be off by whole points; the real one is within print rounding.
    assert _check_rows(TABLE7_VS_TABLE2) < 0.02
    # Dividing by K instead of K - 1 (a plausible bug) would miss AIME/Base AUC@64 by about 0.43 points.
    pass_by_k = dict(zip(AUC_BUDGETS, TABLE7_VS_TABLE2[("AIME", "Base")][0]))
    assert abs(auc_at_k(pass_by_k, 64) * 63 / 64 - 27.58) > 0.4


# ---------------------------------------------------------------------------------------------------- avg@k, maj@k


def test_avg_at_k_is_the_mean_over_all_samples_for_every_k():
    # Unbiased over random k-subsets: E[mean of k samples] = c/n for every k, not the first k samples' mean
    # (which gave avg@1 = 0 next to pass@1 = 23.4 when the first sample happened to be wrong).
    assert avg_at_k([False, True, True, True], 1) == 0.75  # first sample wrong; 3 of 4 correct
    assert avg_at_k([True, False, True, True], 2) == 0.75
    assert avg_at_k([True, False, True, True]) == 0.75  # k defaults to n
    assert avg_at_k([1.0, 0.0, 0.0], 3) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="k must satisfy"):
        avg_at_k([True], 2)
    with pytest.raises(ValueError, match="k must be"):
        avg_at_k([True], 0)


def test_majority_answer_tie_rule_is_earliest_first_occurrence():
    assert majority_answer(["3", "4", "4", "3"]) == 0  # 2-2 tie: "3" first appears at index 0
    assert majority_answer(["4", "3", "3", "4"]) == 0
    assert majority_answer(["5", "3", "4", "4"]) == 2  # "4" wins 2-1-1, first seen at index 2
    assert majority_answer([None, "", "7", None]) == 2  # unparseable samples do not vote
    assert majority_answer([None, ""]) is None


def reference_maj_at_k(answers, correct, k):
    """Slow exact reference: the mean over every k-subset of the samples of the majority vote's credit, a tie among
    t answers giving (correct ones among them) / t; samples without an answer do not vote (none at all: 0)."""
    from itertools import combinations

    total = Fraction(0)
    for subset in combinations(range(len(answers)), k):
        votes = {}
        for i in subset:
            if answers[i] not in (None, ""):
                votes[answers[i]] = votes.get(answers[i], 0) + 1
        if votes:
            best = [a for a, v in votes.items() if v == max(votes.values())]
            verdict = {answers[i]: bool(correct[i]) for i in subset if answers[i] in best}
            total += Fraction(sum(verdict.values()), len(best))
    return total / comb(len(answers), k)


def test_maj_at_k_hand_worked_over_all_subsets():
    # n = 4: [a, a, b, c], a correct. Ties are broken uniformly at random (fractional credit).
    # k=1: P(draw an a) = 2/4. k=2, 6 subsets: {a,a} 1, four {a,b}/{a,c} ties 1/2, {b,c} 0 -> 3/6.
    # k=3, 4 subsets: {a,a,b} 1, {a,a,c} 1, two {a,b,c} 3-way ties 1/3 -> (2 + 2/3)/4 = 2/3. k=4: a wins 2-1-1.
    answers, correct = ["a", "a", "b", "c"], [True, True, False, False]
    assert [maj_at_k(answers, correct, k) for k in (1, 2, 3, 4)] == pytest.approx([1 / 2, 1 / 2, 2 / 3, 1.0])
    # n = 5: [x, x, y, None, z], y and z both correct (two spellings of one value), x wrong, None does not vote.
    # k=1: y or z -> 2/5. k=2, 10 subsets: {x,y} {x,z} (x2 each) 1/2 -> 2; {y,-} {y,z} {-,z} 1; {x,x} {x,-} 0
    #   -> 5/10. k=3, complements of the 2-subsets: {y,-,z} 1; {x,-,z} {x,y,-} (x2 each) 1/2 -> 2;
    #   {x,y,z} (x2) 2/3; {x,x,*} (x3) 0 -> (1 + 2 + 4/3)/10 = 13/30.
    # k=4: omit an x: {x,y,-,z} 3-way tie 2/3 (x2); omit y, - or z: x wins -> (4/3)/5 = 4/15. k=5: x wins 2-1-1.
    answers, correct = ["x", "x", "y", None, "z"], [False, False, True, False, True]
    assert [maj_at_k(answers, correct, k) for k in range(1, 6)] == pytest.approx([2 / 5, 1 / 2, 13 / 30, 4 / 15, 0])
    # maj@n is the plain majority vote of all n samples (a t-way tie: correct ones / t)
    assert maj_at_k(["3", "4", "4", "3"], [False, True, True, False]) == 0.5  # k defaults to n; 2-2 tie
    assert maj_at_k(["5", "3", "4", "4"], [False, False, True, True]) == 1.0
    assert maj_at_k([None, None, "5"], [False, False, True], 3) == 1.0  # unparseable don't outvote the one answer
    assert maj_at_k([None, None, "5"], [False, False, True], 1) == pytest.approx(1 / 3)  # a subset with no answer: 0
    assert maj_at_k([None, ""], [False, False]) == 0.0
    with pytest.raises(ValueError, match="one entry per sample"):
        maj_at_k(["1"], [True, False])
    with pytest.raises(ValueError, match="k must satisfy"):
        maj_at_k(["1"], [True], 2)
    with pytest.raises(ValueError, match="'7'.*same correctness"):
        maj_at_k(["7", "7"], [True, False])


def test_maj_at_k_matches_the_subset_enumeration():
    import random

    rng = random.Random(0)
    for _ in range(40):
        n = rng.randint(1, 9)
        values = rng.sample(["1", "2", "3", "4", None], rng.randint(1, 4))
        answers = [rng.choice(values) for _ in range(n)]
        right = {a: rng.random() < 0.5 for a in set(answers)}
        correct = [a is not None and right[a] for a in answers]
        for k in range(1, n + 1):
            assert maj_at_k(answers, correct, k) == pytest.approx(float(reference_maj_at_k(answers, correct, k)),
                                                                  abs=1e-12), (answers, correct, k)


def test_maj_at_k_is_fast_and_bounded_for_many_samples():
    import time

    # n = 256 with a handful of distinct answers, every report budget
    answers = ["1"] * 100 + ["2"] * 80 + ["3"] * 50 + [None] * 20 + ["4"] * 6
    correct = [a == "2" for a in answers]
    start = time.perf_counter()
    values = [maj_at_k(answers, correct, k) for k in (1, 4, 8, 16, 32, 64, 128, 256)]
    assert time.perf_counter() - start < 5.0
    assert values[0] == pytest.approx(80 / 256)
    assert values[-1] == 0.0  # "1" wins 100-80 with all samples
    assert all(0.0 <= v <= 1.0 for v in values)
    # k = 2 by hand: both "2" (C(80,2)) or one "2" with a None (80*20); a 1-1 tie of "2" with "1", "3" or "4"
    # (80*156) earns 1/2
    assert values[:1] + [maj_at_ks(answers, correct)[1]] == pytest.approx(
        [80 / 256, (comb(80, 2) + 80 * 20 + 80 * 156 / 2) / comb(256, 2)])
    # the largest n computed: 1000 samples, 997 without an answer (C(1000, 500) ~ 2.7e299 stays finite).
    # k = 2 by hand: {1,1} 1 + two {1,2} ties 1/2 + 2*997 {1,-} 1 ({2,-} and {-,-}: 0) -> 1996 / C(1000, 2)
    sparse = ["1", "1", "2"] + [None] * 997
    curve = maj_at_ks(sparse, [a == "1" for a in sparse])
    assert curve[:2] == pytest.approx([2 / 1000, 1996 / comb(1000, 2)])
    assert curve[-1] == 1.0 and all(0.0 <= v <= 1.0 for v in curve)
    with pytest.raises(ValueError, match="up to 1000 samples"):
        maj_at_k(["1"] * 1001, [True] * 1001, 1)
