"""benchmarks/tiny/same_rate.py and claims_controls.py: a claim whose two methods trained at different
rates, read with both at one rate, and DATPO's claims at equal generated tokens, hand-worked."""

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)
import claims_controls
import regime_claims
import same_rate


def test_common_rate_is_the_best_mean_of_the_two_aucs_among_rates_swept_on_enough_seeds():
    choices = {"srpo": dict(sweep_auc={"0.0003": 0.76, "0.0006": 0.73, "0.001": 0.9},
                            sweep_runs={"0.0003": 4, "0.0006": 4, "0.001": 2}),
               "rrpo": dict(sweep_auc={"0.0003": 0.67, "0.0006": 0.78, "0.001": 0.9},
                            sweep_runs={"0.0003": 4, "0.0006": 4, "0.001": 4})}
    # 3e-4: (0.76 + 0.67) / 2 = 0.715; 6e-4: (0.73 + 0.78) / 2 = 0.755; 1e-3 has 2 SRPO seeds only: left out
    assert same_rate.common_rate(choices, "srpo", "rrpo", 4) == 0.0006
    assert same_rate.common_rate(choices, "srpo", "rrpo", 2) == 0.001
    assert same_rate.common_rate(choices, "srpo", "grpo", 4) is None


def _run(lr, greedy):
    last = dict(step=20, greedy_correct=greedy, correct_per_problem=[1] * len(greedy),
                pass_at_k={"1": 0, "2": 0}, passk_correct_per_problem=None)
    return dict(learning_rate=lr, settings=dict(eval_samples=2), curve=[last])


def test_same_rate_claims_pair_the_grid_run_at_its_rate_with_the_added_run():
    runs = {"srpo": {0: _run(3e-4, [1, 1]), 1: _run(3e-4, [1, 0])},
            "rrpo": {0: _run(6e-4, [0, 0]), 1: _run(6e-4, [0, 1])},
            "srpo_oracle": {0: _run(6e-4, [1, 1]), 1: _run(6e-4, [1, 1])}}  # same rate as RRPO: not re-paired
    added = {("srpo", 6e-4): {0: _run(6e-4, [1, 0]), 1: _run(6e-4, [1, 1])}}
    pairs = claims_controls.same_rate_claims(runs, added, dict(correct_per_problem=[0, 1]))
    # SRPO - RRPO on all and on the hard problem (problem 0), at 6e-4: SRPO's added runs against RRPO's grid runs
    assert [(c["claim"][:33], c["rate"], c["problems"]) for c in pairs] == [
        ("SRPO outperforms RRPO: localizati", 6e-4, "all"), ("... on the hard prompts", 6e-4, "hard")]
    # greedy, all problems: seed 0 0.5 - 0.0, seed 1 1.0 - 0.5; hard: seed 0 1 - 0, seed 1 1 - 0
    assert pairs[0]["diffs"]["greedy"] == [0.5, 0.5] and pairs[1]["diffs"]["greedy"] == [1.0, 1.0]
    table, family = claims_controls.same_rate_table(pairs)
    assert "| 0.0003 / 0.0006 | 0.0006 | 2 | +0.500 ± 0.000: holds" in table
    assert "**Comparisons: 6**" in table  # 2 pairs x greedy, pass@8, T=1


def _curve_run(points):
    """A run evaluated at (step, generated tokens, greedy verdicts on 2 problems)."""
    return dict(settings=dict(eval_samples=2), curve=[
        dict(step=s, generated_tokens=t, greedy_correct=g, correct_per_problem=[2 * x for x in g],
             pass_at_k={"1": 0, "2": 0}) for s, t, g in points])


def test_metric_at_tokens_is_linear_between_the_evaluations_around_the_count():
    run = _curve_run([(0, 0, [0, 0]), (10, 100, [1, 0]), (20, 300, [1, 1])])
    # greedy 0.0 at 0 tokens, 0.5 at 100, 1.0 at 300: at 200 tokens 0.5 + 0.5 x (100 / 200) = 0.75
    assert claims_controls.metric_at_tokens(run, "greedy", None, 200) == 0.75
    assert claims_controls.metric_at_tokens(run, "greedy", None, 50) == 0.25
    assert claims_controls.metric_at_tokens(run, "greedy", None, 300) == 1.0
    assert claims_controls.metric_at_tokens(run, "greedy", None, 301) is None  # past the run: no extrapolation


def test_token_matched_diffs_read_the_larger_run_at_the_smaller_runs_budget():
    runs = {"datpo": {0: _curve_run([(0, 0, [0, 0]), (10, 400, [1, 0]), (20, 800, [1, 1])])},
            "grpo": {0: _curve_run([(0, 0, [0, 0]), (10, 200, [0, 0]), (20, 600, [1, 0])])}}
    # budget min(800, 600) = 600: DATPO at 600 tokens 0.5 + 0.5 x (200 / 400) = 0.75, GRPO at its end 0.5
    diffs, budgets = claims_controls.token_matched_diffs(runs, "datpo", "grpo", "greedy", None)
    assert diffs == [0.25] and budgets == [600]
    assert regime_claims.token_ratio(runs, "datpo", "grpo") == "1.33x"  # 800 / 600


def test_token_matched_a_at_least_reading_gives_a_at_least_bs_tokens():
    datpo = _curve_run([(0, 0, [0, 0]), (10, 400, [1, 0]), (20, 800, [1, 1])])
    grpo = _curve_run([(0, 0, [0, 0]), (10, 200, [0, 0]), (20, 600, [1, 0])])
    # A larger: budget 600, DATPO at its first evaluation at or past 600 tokens (step 20, 1.0) - GRPO's end 0.5
    runs = {"datpo": {0: datpo}, "grpo": {0: grpo}}
    assert claims_controls.token_matched_diffs(runs, "datpo", "grpo", "greedy", None, "a_at_least")[0] == [0.5]
    # B larger: A = GRPO (600 tokens) against B = DATPO read at its last evaluation at or before 600 (step 10, 0.5)
    assert claims_controls.token_matched_diffs(runs, "grpo", "datpo", "greedy", None, "a_at_least")[0] == [0.0]


def test_sweep_table_compares_rates_only_on_equal_seeds():
    two = {"srpo": dict(learning_rate=3e-4), "oppo": dict(learning_rate=3e-4)}
    every = {"srpo": dict(learning_rate=6e-4, sweep_auc={"0.0003": 0.75, "0.0006": 0.76},
                          sweep_runs={"0.0003": 4, "0.0006": 4}),
             "oppo": dict(learning_rate=1e-3, sweep_auc={"0.0003": 0.75, "0.001": 0.77},
                          sweep_runs={"0.0003": 3, "0.001": 2})}
    table = claims_controls.sweep_seeds_table(two, every)
    assert "| SRPO (self) | 0.0003 | 0.0006 (changed) | 4 |" in table
    # OPPO: 0.0003 ran on 3 seeds, 0.001 on 2: only 0.0003 competes, though 0.001's mean over fewer seeds is higher
    assert "| OPPO (self) | 0.0003 | 0.0003 (among the rates on 3 seeds) | 2/3 |" in table
