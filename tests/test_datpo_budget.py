"""adaptive_budget: K̂ = ceil(K_max·(1 − V_root)), B̂ = ceil(B_max·(1 − V_root)) (paper Eq. 1-2, docs/datpo.md#budget)."""

import math

import pytest

from trl_credit.datpo import adaptive_budget


@pytest.mark.parametrize(
    "v_root, expected",
    [
        (0.0, (3, 4)),  # ceil(3·1) = 3, ceil(4·1) = 4: the full paper budget, N(1 + K̂B̂) = 4·13 = 52 leaves
        (0.25, (3, 3)),  # ceil(3·0.75) = ceil(2.25) = 3, ceil(4·0.75) = ceil(3) = 3
        (0.5, (2, 2)),  # ceil(3·0.5) = ceil(1.5) = 2, ceil(4·0.5) = 2
        (0.75, (1, 1)),  # ceil(0.75) = 1, ceil(1) = 1
        (1.0, (0, 0)),  # solved prompt: no branching
    ],
)
def test_paper_budgets(v_root, expected):
    assert adaptive_budget(v_root, 3, 4) == expected


def test_integer_products_are_not_rounded_up_by_float_error():
    # N = 10, 7 correct: V_root = 0.7; 10·(1 − 0.7) = 3 exactly, but in floats 3.0000000000000004
    assert 10 * (1 - 0.7) > 3  # the float trap this guards against
    assert adaptive_budget(0.7, 10, 10) == (3, 3)
    # N = 3, one correct: K̂ = ceil(3·2/3) = 2, B̂ = ceil(4·2/3) = ceil(2.67) = 3
    assert adaptive_budget(1 / 3, 3, 4) == (2, 3)


def test_out_of_range_v_root_is_clamped_and_nan_refused():
    assert adaptive_budget(1.5, 3, 4) == (0, 0)
    assert adaptive_budget(-0.5, 3, 4) == (3, 4)
    with pytest.raises(ValueError, match="NaN"):
        adaptive_budget(math.nan, 3, 4)
    with pytest.raises(ValueError, match="k_max"):
        adaptive_budget(0.5, -1, 4)


def test_root_success_rate_counts_verdicts_of_scorable_rollouts():
    from trl_credit.datpo.budget import root_success_rate

    # 4 base rollouts: correct, wrong, unscorable, correct -> 2 of 3 scorable are correct
    assert root_success_rate([True, False, False, True], [False, False, True, False]) == pytest.approx(2 / 3)
    assert math.isnan(root_success_rate([False, False], [True, True]))  # nothing scorable
    assert adaptive_budget(root_success_rate([True, False, False, True], [False, False, True, False]), 3, 4) == (1, 2)
