"""OPPO's k and G from the verifier and the scorable rows, and which groups carry a signal (hand-worked numbers)."""

import math

import pytest
import torch

from trl_credit.core.success import groups_with_reward_variance, success_rows, unscorable_rows
from trl_credit.oppo.recursion import group_success_counts, prior_log_odds

NAN = math.nan


def test_k_counts_the_verifier_and_g_counts_scorable_rows():
    # columns [accuracy, format], weights 1, two groups of 4.
    # group 0: right+formatted, wrong+formatted (total 1.0: "correct" under the old total rule), wrong+unformatted,
    #          unscorable (both None).  -> k = 1, G = 3.
    # group 1: every row formatted and right except row 5, whose verifier returned None (not correct, but scorable
    #          through its format reward).  -> k = 3, G = 4.
    rewards = torch.tensor(
        [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [NAN, NAN], [1.0, 1.0], [NAN, 1.0], [1.0, 1.0], [1.0, 0.0]]
    )
    correct = success_rows(rewards, 0, 1.0)
    scorable = ~unscorable_rows(rewards)
    k, g = group_success_counts(correct, scorable, 4)
    assert k.tolist() == [1, 3] and g.tolist() == [3, 4]
    # ℓ_0 = log((k + α)/(G − k + α)), α = 1: group 0 log(2/3) (the old rule, k = 2 of G = 4: log(3/3) = 0);
    # group 1 log(4/2).
    prior = prior_log_odds(k, g, 1.0)
    assert prior.tolist() == pytest.approx([math.log(2 / 3), math.log(2.0)], abs=1e-12)


def test_group_of_only_unscorable_rows_has_an_even_prior():
    k, g = group_success_counts(torch.tensor([False] * 4), torch.tensor([False] * 4), 4)
    assert k.tolist() == [0] and g.tolist() == [0]
    assert prior_log_odds(k, g, 1.0).tolist() == [0.0]  # log(α/α): V_0 = 1/2, and its rows get advantage 0 anyway


def test_groups_with_reward_variance_sum_then_normalize():
    weights = torch.tensor([1.0, 1.0])
    rewards = torch.tensor(
        [
            [1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0],  # totals all 1: no signal although each column varies
            [1.0, 1.0], [0.0, 1.0], [NAN, NAN], [NAN, NAN],  # totals 2, 1 over 2 scorable rows: signal
            [1.0, 1.0], [NAN, NAN], [NAN, NAN], [NAN, NAN],  # one scorable row: no signal
        ]
    )
    assert groups_with_reward_variance(rewards, weights, 4).tolist() == [False, True, False]
    # normalize_then_sum z-scores each column per group: the first group's columns vary, so it has a signal.
    assert groups_with_reward_variance(rewards, weights, 4, "normalize_then_sum").tolist() == [True, True, False]
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        groups_with_reward_variance(rewards, weights, 4, "sum")
