"""GroupOutcome over groups other than TRL's (trl_credit/core/trainer.py): the group-normalized outcome over a record's
``group_ids`` (SRPO's sub-groups), rows of NO_GROUP at 0 and outside every statistic, this process's cut, TRL's
completions table. Expected values are worked by hand from ``A = (r - mean_g) / (std_g + 1e-4)``, std unbiased."""

import math
from types import SimpleNamespace

import pytest
import torch

from trl_credit.core.batch import NO_GROUP, ROW_BASE, RowBatch
from trl_credit.core.context import BatchContext
from trl_credit.core.trainer import GroupOutcome

EPS = 1e-4


def fake_context(scale="group", aggregation="sum_then_normalize", num_funcs=1):
    # No trainer: the credit reads the context's settings and logs into its metrics.
    return BatchContext(args=SimpleNamespace(), reward_weights=torch.ones(num_funcs),
                        reward_func_names=[f"r{k}" for k in range(num_funcs)],
                        multi_objective_aggregation=aggregation, scale_rewards=scale)


def record(rewards, group_ids, num_local, process_index):
    rewards = torch.tensor(rewards, dtype=torch.float32).view(len(group_ids), -1)
    n = len(group_ids)
    return RowBatch(rewards_per_func=rewards, group_ids=torch.tensor(group_ids), row_kinds=torch.full((n,), ROW_BASE),
                    success=torch.zeros(n, dtype=torch.bool), scorable=torch.ones(n, dtype=torch.bool),
                    num_local=num_local, process_index=process_index)


def run(ctx, batch, metric="srpo/nonfinite_reward_rate"):
    output = {"advantages": torch.zeros(batch.num_local)}
    advantages = GroupOutcome(metric).advantages(ctx, batch, None, output)
    # over sub-groups the credit returns every row; the core cuts them to this process's rows once
    assert advantages.size(0) == batch.num_rows
    local = batch.local_rows(advantages)
    # the credit hands the table's values to the record (the core writes them into TRL's table once) and logs its
    # metric only
    assert set(ctx.metrics) == {metric}
    return local, batch.table_advantages, ctx.metrics[metric]


# Rows: group 5 = {1, 0}, a row in no group with a far-off reward, group 2 = {3, 1, 2}, group 7 = {4, 4} (no signal).
REWARDS = [1.0, 0.0, 100.0, 3.0, 1.0, 2.0, 4.0, 4.0]
GROUPS = [5, 5, NO_GROUP, 2, 2, 2, 7, 7]


def test_group_normalized_within_each_group_no_group_rows_zero():
    local, logged, rate = run(fake_context(), record(REWARDS, GROUPS, num_local=4, process_index=1))
    half = 0.5 / (math.sqrt(0.5) + EPS)  # group {1, 0}: mean 1/2, std sqrt(1/2)
    one = 1.0 / (1.0 + EPS)  # group {3, 1, 2}: mean 2, std 1
    expected = [half, -half, 0.0, one, -one, 0.0, 0.0, 0.0]
    assert logged == pytest.approx(expected, abs=1e-6)  # the table shows every row's advantage, the global batch
    assert local.tolist() == pytest.approx(expected[4:], abs=1e-6)  # this process's rows: 4..7
    assert rate == [0.0]


def test_batch_scale_leaves_no_group_rows_out_of_the_batch_std():
    local, logged, _ = run(fake_context(scale="batch"), record(REWARDS, GROUPS, num_local=8, process_index=0))
    grouped = torch.tensor([1.0, 0.0, 3.0, 1.0, 2.0, 4.0, 4.0])  # the 100 of the NO_GROUP row is not among them
    std = grouped.std(unbiased=True).item()
    expected = [0.5 / (std + EPS), -0.5 / (std + EPS), 0.0, 1 / (std + EPS), -1 / (std + EPS), 0.0, 0.0, 0.0]
    assert local.tolist() == pytest.approx(expected, abs=1e-6)


def test_a_group_with_an_infinite_reward_gets_zero_and_is_counted():
    rewards = [1.0, 0.0, math.inf, 3.0, 1.0, 2.0, 4.0, math.inf]  # inf in the NO_GROUP row and in group 7
    with pytest.warns(UserWarning, match="'r0' returned ±inf"):
        local, _, rate = run(fake_context(), record(rewards, GROUPS, num_local=8, process_index=0))
    one = 1.0 / (1.0 + EPS)
    assert local.tolist()[2:] == pytest.approx([0.0, one, -one, 0.0, 0.0, 0.0], abs=1e-6)
    assert rate == [pytest.approx(1 / 3)]  # 1 of the 3 groups; the NO_GROUP row counts in none


def test_normalize_then_sum_over_the_groups():
    # Two reward functions; the second is constant within each group (no signal), so s = z of the first.
    rewards = [[1.0, 0.0], [0.0, 0.0], [100.0, 7.0], [3.0, 1.0], [1.0, 1.0], [2.0, 1.0], [4.0, 2.0], [4.0, 2.0]]
    ctx = fake_context(aggregation="normalize_then_sum", num_funcs=2)
    local, _, _ = run(ctx, record(rewards, GROUPS, num_local=8, process_index=0))
    half, one = 0.5 / (math.sqrt(0.5) + EPS), 1.0 / (1.0 + EPS)
    summed = torch.tensor([half, -half, one, -one, 0.0, 0.0, 0.0], dtype=torch.float64)  # the 7 grouped rows
    scaled = ((summed - summed.mean()) / (summed.std(unbiased=True) + EPS)).tolist()
    assert local.tolist() == pytest.approx(scaled[:2] + [0.0] + scaled[2:], abs=1e-6)
