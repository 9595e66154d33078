"""The tool grid's group-sequential plan (benchmarks/tools/sequential.py) and the claims table it gives
(tool_summary.sequential_table), on hand-made paired differences whose t-tests were worked out beside them."""

import math

import pytest

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)
import sequential
import tool_summary
from tests.test_tool_grid import _run  # a grid run as its JSON holds it


def test_the_error_spent_by_each_look_is_the_obrien_fleming_type_function():
    # alpha(t) = 2 - 2 Phi(z_0.975 / sqrt(t)) = erfc(z_0.975 / sqrt(2 t)), z_0.975 = 1.959963984540054
    def alpha(t):
        return math.erfc(1.959963984540054 / math.sqrt(2 * t))

    assert sequential.spent(4) == pytest.approx(alpha(0.25), rel=1e-9)  # 8.9e-5
    assert sequential.spent(8) == pytest.approx(alpha(0.5), rel=1e-9)  # 0.0056
    assert sequential.spent(16) == pytest.approx(0.05, rel=1e-12) and sequential.spent(0) == 0.0
    assert alpha(0.25) == pytest.approx(8.86e-5, rel=1e-2) and alpha(0.5) == pytest.approx(0.005575, rel=1e-3)
    # the looks' budgets add up to alpha; an interim look's is shared by the 18 planned comparisons
    assert sum(sequential.look_budget(k) for k in range(3)) == pytest.approx(0.05, rel=1e-12)
    assert sequential.FAMILY == 18
    assert sequential.interim_threshold(1) == pytest.approx((alpha(0.5) - alpha(0.25)) / 18, rel=1e-9)  # 3.0e-4


def test_the_plan_covers_every_method_the_grid_runs_against_grpo():
    from trl_credit.testbed.tool_runner import TOOL_METHODS

    grid = {m for m in TOOL_METHODS if m not in ("grpo", "rrpo")}  # tool_grid's default methods but GRPO
    assert set(sequential.PLANNED_METHODS) == grid
    with pytest.raises(ValueError, match="cue_grpo"):
        sequential.judge({("cue_grpo", "greedy"): [0.1] * 4})


def _runs(diffs_by_method: dict) -> dict:
    """GRPO at 0.5 on every metric of seeds 0-15; each method at 0.5 + its differences (greedy, T=1, pass@8)."""
    made = [_run("grpo", s, 3e-4, 0.5, 0.5, 0.5) for s in range(16)]
    for method, (greedy, t1, pass8) in diffs_by_method.items():
        made += [_run(method, s, 3e-4, 0.5 + g, 0.5 + t, 0.5 + p)
                 for s, (g, t, p) in enumerate(zip(greedy, t1, pass8))]
    return tool_summary.by_method(made)


def test_verdicts_are_read_at_the_looks_and_holm_runs_over_the_whole_family_at_the_last():
    alternating = [-0.2, -0.3] * 4  # 4 pairs: t -8.66, p 0.0032 (> 4.9e-6); 8 pairs: t -13.2, p 3.3e-6 (< 3.0e-4)
    greedy = [0.1, 0.0, 0.2, 0.1, 0.3, 0.0, 0.1, 0.1, 0.1, 0.2, 0.1, 0.0, 0.2, 0.1, 0.15, 0.1]
    # greedy: 8 pairs t 3.21, p 0.015 (no interim verdict); 16 pairs t 5.70, p 4.2e-5
    t1 = [0.1, 0.0, 0.2, -0.1, 0.15, 0.05, 0.1, 0.0] * 2  # 16 pairs: t 2.71, p 0.016 (< 0.05 alone)
    runs = _runs({"prime": ([-0.3] * 4,) * 3,  # no spread: p 0 at the first look
                  "oppo": (alternating,) * 3,
                  "process": (greedy, t1, [0.05, -0.05] * 8),  # pass@8: mean 0, p 1
                  "srpo": ([0.1, 0.2],) * 3})
    table, counts = tool_summary.sequential_table(tool_summary.claims(runs))
    lines = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in table.splitlines()
             if line.startswith("| ") and "---" not in line and "method" not in line}
    assert "lower than GRPO; shown at the look at 4 pairs (p 0 <" in lines["prime", "greedy"]
    assert "lower than GRPO; shown at the look at 8 pairs (p 3.3e-06 < 0.0003" in lines["oppo", "T=1"]
    # the last look: 6 comparisons shown before, then Holm over the 18: 4.2e-5 x (18 - 6) = 5.0e-4 <= 0.0444
    assert "higher than GRPO; survives Holm at the last look (adj. p 0.0005 <= 0.0444)" in lines["process", "greedy"]
    # next in Holm's order: 0.016 x 11 = 0.18 > 0.0444: significant alone, not in the family
    assert "higher than GRPO unadjusted only: not after Holm (adj. p 0.18 > 0.0444)" in lines["process", "T=1"]
    assert "not shown (MDE" in lines["process", "pass@8"]
    assert "before the first look (2 of 4 pairs)" in lines["srpo", "greedy"]
    assert counts == dict(comparisons=18, shown=7, shown_at_interim_look=6, stopped=["oppo", "prime"])
    assert table.startswith("18 planned comparisons (6 methods against GRPO on three metrics), looked at after 4 / 8 "
                            "/ 16 pairs: 7 shown, 6 of them at an interim look; oppo, prime need no more seeds.")


def test_a_method_between_looks_keeps_its_last_looks_verdict():
    # 6 pairs: the look at 4 (p 0.0032 on the alternating differences) did not show it; 6 is no look
    verdicts = sequential.judge({("oppo", "greedy"): [-0.2, -0.3] * 3})
    assert verdicts["oppo", "greedy"]["shown"] is False and verdicts["oppo", "greedy"]["look"] == 4
    assert verdicts["oppo", "greedy"]["p"] == pytest.approx(0.00324, rel=1e-2)


def test_the_last_look_adjusts_over_the_planned_family_not_the_rows_run():
    # p 0.016 alone on 16 pairs: a table of this one row would show it (p < 0.05); the plan's family is 18 comparisons,
    # whichever have run: 18 x 0.016 = 0.29 > 0.0444
    t1 = [0.1, 0.0, 0.2, -0.1, 0.15, 0.05, 0.1, 0.0] * 2
    verdicts = sequential.judge({("process", "T=1"): t1})
    assert verdicts["process", "T=1"]["adjusted"] == pytest.approx(18 * 0.01608, rel=1e-2)
    assert not verdicts["process", "T=1"]["shown"]


def test_the_table_names_the_one_method_that_needs_no_more_seeds():
    # PRIME's three comparisons at 8 pairs with no spread (p 0 < 3.0e-4 at the look at 8): it stops, the oracle runs on
    runs = _runs({"prime": ([-0.3] * 8,) * 3, "process": ([0.1, 0.2] * 3,) * 3})
    table, counts = tool_summary.sequential_table(tool_summary.claims(runs))
    assert counts["stopped"] == ["prime"]
    assert table.splitlines()[0].endswith("3 shown, 3 of them at an interim look; prime needs no more seeds.")
