"""benchmarks/tiny/regime_claims.py: the trap grid's claims by greedy accuracy, pass@64 and T=1, on hand-worked runs."""

import pytest

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)
import regime_claims


def _run(greedy, correct, passk, curve_correct=()):
    """A run whose last evaluation has these per-problem greedy verdicts, correct-of-4 counts and correct-of-64."""
    points = [dict(step=s, correct_per_problem=c) for s, c in curve_correct]
    last = dict(step=20, greedy_correct=greedy, correct_per_problem=correct, pass_at_k={str(k): 0 for k in (1, 2, 3, 4)},
                passk_correct_per_problem=passk)
    return dict(settings=dict(eval_samples=4), curve=points + [last])


BASE = dict(correct_per_problem=[0, 2, 0, 4])  # problems 0 and 2 are all-fail for the untrained model


def test_hard_problems_are_the_base_all_fail_ones():
    assert regime_claims.hard_problems(BASE) == [0, 2]


def test_metrics_on_all_and_on_hard_problems():
    run = _run(greedy=[1, 0, 0, 1], correct=[2, 4, 1, 0], passk=[3, 0])  # pass@64 drawn on the first 2 problems only
    assert regime_claims.metric(run, "greedy", None) == 0.5
    assert regime_claims.metric(run, "greedy", [0, 2]) == 0.5
    assert regime_claims.metric(run, "t1", None) == pytest.approx(7 / 16)
    assert regime_claims.metric(run, "t1", [0, 2]) == pytest.approx(3 / 8)
    assert regime_claims.metric(run, "pass64", None) == 0.5
    assert regime_claims.metric(run, "pass64", [0, 2]) == 1.0  # problem 2 lies outside the pass@64 sample


def test_paired_differences_pair_by_seed_and_the_table_reads_them():
    runs = {"grpo": {0: _run([0, 0, 0, 0], [0, 0, 0, 0], [0, 0]), 1: _run([1, 0, 0, 0], [0, 0, 0, 0], [0, 0])},
            "srpo": {0: _run([1, 0, 1, 0], [4, 0, 4, 0], [1, 1]), 1: _run([1, 0, 1, 1], [4, 0, 0, 0], [1, 1]),
                     7: _run([1, 1, 1, 1], [4, 4, 4, 4], [1, 1])}}  # seed 7 has no GRPO partner
    # hard problems 0, 2: seed 0 greedy 1.0 - 0.0, seed 1 1.0 - 0.5
    assert regime_claims.paired_diffs(runs, "srpo", "grpo", "greedy", [0, 2]) == [1.0, 0.5]
    table = regime_claims.claims_table(runs, BASE)
    assert "| SRPO (self) - GRPO (hard) | 2 | +0.750 ±" in table
    assert "RRPO (all) | 0 | not run" in table


def test_all_fail_share_over_training_is_the_mean_over_seeds_per_step():
    runs = {"grpo": {0: _run([0] * 4, [0, 1, 1, 1], [0], curve_correct=[(0, [0, 0, 1, 1])]),
                     1: _run([0] * 4, [1, 1, 1, 1], [0], curve_correct=[(0, [0, 0, 0, 1])])}}
    assert regime_claims.all_fail_over_training(runs) == {"grpo": {0: pytest.approx(0.625), 20: pytest.approx(0.125)}}


def test_share_of_the_oracle_gain_is_the_ratio_of_mean_paired_gains_with_a_bootstrap_interval():
    runs = {m: {} for m in ("grpo", "process", "prime")}
    for seed, (g, o, p) in enumerate(((0.50, 0.75, 0.625), (0.25, 0.50, 0.375), (0.0, 0.25, 0.125))):
        for method, value in (("grpo", g), ("process", o), ("prime", p)):
            runs[method][seed] = _run([1] * int(value * 8) + [0] * (8 - int(value * 8)), [0] * 8, [0])
    share = regime_claims.share_of_gain(runs, "greedy", resamples=200)
    # every seed: PRIME gains 0.125, the oracle 0.25 -> 0.5, and every resample gives 0.5
    assert share["share"] == pytest.approx(0.5) and share["low"] == pytest.approx(0.5)
    assert share["high"] == pytest.approx(0.5) and share["seeds"] == 3
    assert regime_claims.share_of_gain({"grpo": runs["grpo"]}, "greedy") is None


def test_resets_landing_splits_by_exact_and_clean_rates():
    summary = {"srpo": {"srpo/localization_exact_rate": 0.5, "srpo/localization_clean_rate": 0.75}}
    assert "| SRPO (self) | 0.50 | 0.25 | 0.25 |" in regime_claims.resets_landing(summary)


def test_levels_table_has_the_untrained_row_and_each_method_on_all_and_hard_problems():
    base = dict(BASE, greedy_correct=[0, 1, 0, 1], pass_at_k={"1": 0, "2": 0, "3": 0, "4": 0})
    runs = {"grpo": {0: _run([1, 1, 0, 1], [4, 4, 0, 4], [1, 1]), 1: _run([0, 1, 0, 1], [2, 4, 0, 4], [1, 0])}}
    table = regime_claims.levels_table(runs, base)
    assert "| untrained | 0.500 / 0.000 | - / - | 0.375 / 0.000 |" in table
    # greedy: seed 0 0.75 / 0.5, seed 1 0.5 / 0.0; pass@64 on the first two problems (hard: problem 0 only):
    # 1.0 / 1.0 and 0.5 / 1.0; T=1: seed 0 12/16 / 4/8, seed 1 10/16 / 2/8
    assert "| GRPO | 0.625 / 0.250 | 0.750 / 1.000 | 0.688 / 0.375 |" in table
