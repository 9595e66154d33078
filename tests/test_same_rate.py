"""benchmarks/tiny/same_rate.py and regime_claims' same-rate pairs: a claim whose two methods trained at different
rates, read with both at one rate, hand-worked."""

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)
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
    pairs = regime_claims.same_rate_claims(runs, added, dict(correct_per_problem=[0, 1]))
    # SRPO - RRPO on all and on the hard problem (problem 0), at 6e-4: SRPO's added runs against RRPO's grid runs
    assert [(c["claim"][:33], c["rate"], c["problems"]) for c in pairs] == [
        ("SRPO outperforms RRPO: localizati", 6e-4, "all"), ("... on the hard prompts", 6e-4, "hard")]
    # greedy, all problems: seed 0 0.5 - 0.0, seed 1 1.0 - 0.5; hard: seed 0 1 - 0, seed 1 1 - 0
    assert pairs[0]["diffs"]["greedy"] == [0.5, 0.5] and pairs[1]["diffs"]["greedy"] == [1.0, 1.0]
    table, family = regime_claims.same_rate_table(pairs)
    assert "| 0.0003 / 0.0006 | 0.0006 | 2 | +0.500 ± 0.000: holds" in table
    assert "**Comparisons: 6**" in table  # 2 pairs x greedy, pass@8, T=1
