"""benchmarks/tiny/multiplicity.py: the paired t-test over seeds and Holm's step-down correction, hand-worked; and the
claims tables that count their comparisons and mark which verdicts survive."""

import math

import pytest

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)
import multiplicity
import regime_claims
import tiny_report


def test_paired_t_pvalue_by_hand():
    # diffs 1, 2, 3: mean 2, sd 1, se 1/sqrt(3), t = 2 sqrt(3) = 3.4641, 2 degrees of freedom. With 2 degrees of
    # freedom P(|T| > t) = 1 - t / sqrt(2 + t^2) = 1 - 3.4641 / sqrt(14) = 1 - 0.92582 = 0.07418
    assert multiplicity.paired_t_pvalue([1.0, 2.0, 3.0]) == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14))
    # the sign does not matter (two-sided)
    assert multiplicity.paired_t_pvalue([-1.0, -2.0, -3.0]) == pytest.approx(0.07418, abs=1e-5)
    assert multiplicity.paired_t_pvalue([0.5]) is None
    assert multiplicity.paired_t_pvalue([0.0, 0.0, 0.0]) == 1.0  # no spread, no difference
    assert multiplicity.paired_t_pvalue([0.25, 0.25]) == 0.0  # no spread, every seed the same way


def test_p_below_005_exactly_when_the_95_interval_excludes_0():
    # t-interval half-width = t_0.975 * se: it excludes 0 iff |t| > t_0.975 iff p < 0.05
    for diffs in ([0.1, 0.2, 0.15, 0.05], [0.1, -0.2, 0.15, 0.05], [0.02, 0.03, -0.01, 0.04, 0.05]):
        mean, half = tiny_report.interval(diffs)
        assert (multiplicity.paired_t_pvalue(diffs) < 0.05) == (abs(mean) > half)


def test_holm_by_hand():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, raised to the running max 0.06)
    assert multiplicity.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # capped at 1: 0.5 x 2 = 1.0, 0.6 x 1 -> max(1.0, 0.6)
    assert multiplicity.holm([0.6, 0.5]) == pytest.approx([1.0, 1.0])
    assert multiplicity.holm([]) == []


def test_holm_note_says_whether_a_significant_verdict_survives():
    assert multiplicity.holm_note(0.01, 0.03) == "survives Holm (adj. p 0.03)"
    assert multiplicity.holm_note(0.02, 0.06) == "unadjusted only: not after Holm (adj. p 0.06)"
    assert multiplicity.holm_note(0.2, 0.6) == ""  # not significant unadjusted: nothing to survive
    assert multiplicity.holm_note(None, None) == ""


def test_adjust_family_counts_only_entries_with_two_seeds():
    family = multiplicity.adjust_family({"a": [1.0, 2.0, 3.0], "b": [1.0], "c": [-1.0, -2.0, -3.0]})
    p = 1 - 2 * math.sqrt(3) / math.sqrt(14)  # 0.07418 each (test above); family of 2: both x2 -> 0.14836
    assert family["b"] == (None, None)
    assert family["a"] == pytest.approx((p, 2 * p)) and family["c"] == pytest.approx((p, 2 * p))


def _run(greedy, correct):
    last = dict(step=20, greedy_correct=greedy, correct_per_problem=correct, pass_at_k={str(k): 0 for k in (1, 2)},
                passk_correct_per_problem=None)
    return dict(settings=dict(eval_samples=2), curve=[last])


def test_regime_claims_table_states_its_comparison_count_and_marks_holm():
    # 4 problems, 3 seeds; SRPO - GRPO greedy per seed: 0.5, 0.5, 0.75 (all problems), T=1 per seed 0, 0, 0
    runs = {"grpo": {s: _run([0, 0, 0, 0], [1, 1, 1, 1]) for s in range(3)},
            "srpo": {0: _run([1, 1, 0, 0], [1, 1, 1, 1]), 1: _run([0, 1, 1, 0], [1, 1, 1, 1]),
                     2: _run([1, 1, 1, 0], [1, 1, 1, 1])}}
    base = dict(correct_per_problem=[0, 1, 1, 1])  # problem 0 is hard
    table = regime_claims.claims_table(runs, base)
    # 2 claims ran (SRPO - GRPO on hard and on all problems) x greedy, pass@8 and T=1 = 6 (pass@64 is no claim)
    assert "**Comparisons: 6**" in table
    # all problems, greedy: diffs 0.5, 0.5, 0.75: mean 0.5833, sd 0.1443, se 0.0833, t = 7.0, df 2:
    # p = 1 - 7 / sqrt(51) = 0.019787; the smallest of the 6 (pass@8 and T=1 diffs are 0: p = 1; hard greedy
    # diffs 1, 0, 1: t = 2.0, p = 1 - 2 / sqrt(6) = 0.1835) -> adjusted 6 x 0.019787 = 0.119: unadjusted only
    assert "+0.583 ± 0.359: holds; unadjusted only: not after Holm (adj. p 0.12)" in table


def test_all_fail_share_against_grpo_is_paired_per_seed_and_step():
    def run(at10, at20):  # all-fail = correct 0 of the samples, 4 problems
        return dict(curve=[dict(step=0, correct_per_problem=[0, 0, 1, 1]), dict(step=10, correct_per_problem=at10),
                           dict(step=20, correct_per_problem=at20)])
    runs = {"grpo": {0: run([0, 0, 1, 1], [0, 1, 1, 1]), 1: run([0, 1, 1, 1], [0, 1, 1, 1])},
            "srpo": {0: run([0, 1, 1, 1], [1, 1, 1, 1]), 1: run([1, 1, 1, 1], [0, 1, 1, 1]), 5: run([0] * 4, [0] * 4)}}
    paired = regime_claims.all_fail_vs_grpo(runs)
    # step 10: seed 0 0.25 - 0.5, seed 1 0.0 - 0.25; step 20: seed 0 0.0 - 0.25, seed 1 0.25 - 0.25; seed 5 unpaired
    assert paired == {"srpo": {10: [-0.25, -0.25], 20: [-0.25, 0.0]}}
    table, family = regime_claims.all_fail_vs_grpo_table(paired)
    # step 10: no spread, every seed fewer -> p 0 (adjusted 0): fewer, survives; step 20: mean -0.125, sd 0.1768,
    # se 0.125, t = -1, df 1: p = 0.5 -> adjusted max(0, 1 x 0.5) = 0.5
    assert family[("srpo", 10)] == (0.0, 0.0) and family[("srpo", 20)] == pytest.approx((0.5, 0.5))
    assert "**Comparisons: 2**" in table and "-0.250 ± 0.000: fewer; survives Holm (adj. p 0)" in table


def test_tiny_claims_table_counts_the_tested_rows_and_gives_tokens_a_over_b():
    import tiny_claims

    def run(final):
        return dict(curve=[dict(accuracy=final, pass_at_k={"2": 0.0}, structures={})])

    runs = {"grpo": {s: run(0.0) for s in range(3)}, "oppo": {0: run(0.5), 1: run(0.5), 2: run(0.75)}}
    summary = {"grpo": dict(tokens_per_step=100.0), "oppo": dict(tokens_per_step=200.0)}
    table = tiny_claims.claims_table(runs, summary, {}, None)
    # one row read from paired seeds (OPPO - GRPO; every other pair did not run): diffs 0.5, 0.5, 0.75, p = 0.019787
    # (test above), the family of 1 leaves it unadjusted: 0.0198 <= 0.05 survives; tokens 200 / 100 per step
    assert "**Comparisons: 1**" in table
    assert "| +0.583 ± 0.359 | holds (3 seeds; preliminary); survives Holm (adj. p 0.02) | 2.00x |" in table


def test_family_counts_counts_tested_entries_and_both_thresholds():
    # (p, Holm p) by hand: an untested entry (one seed) is no comparison; 0.01/0.03 significant unadjusted, of which
    # only Holm p 0.03 <= 0.05 survives; 0.05 is not below 0.05 unadjusted, and its Holm p 0.05 would survive alone
    family = {"a": (0.01, 0.03), "b": (0.03, 0.06), "c": (0.2, 0.2), "d": (None, None)}
    assert multiplicity.family_counts(family) == (3, 2, 1)
    assert multiplicity.family_counts({"e": (0.05, 0.05)}) == (1, 0, 1)
