"""The core's restatement of TRL's advantages (trl_credit/core/advantages.py: ``trl_advantages``) equals what the
installed TRL computes, bit for bit, for every ``scale_rewards`` and ``multi_objective_aggregation``, with
zero-variance groups, rows one reward function skipped and unscorable rows, in training and evaluation. The core hands the credit TRL's
advantages of every row from it (no gather of what TRL already cut to each process), so this must hold on every
supported TRL: CI runs it on each (``bash .ci/trl_version <version>`` runs the ``trl_smoke`` tests)."""

import warnings
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOConfig

from trl_credit.core.advantages import trl_advantages
from trl_credit.core.logs import warned_keys
from trl_credit.core.collectives import trl_global_advantages
from trl_credit.core.trainer import CreditTrainer

pytestmark = pytest.mark.trl_smoke

# Rewards by row position (the tiny model's completions do not matter): 4 groups of 4 rows. Group 0: equal totals
# (zero std); group 1: the second function skips one row; group 2: three unscorable rows (both functions None);
# group 3: uneven values. None is a skipped row.
FIRST = [1.0, 1.0, 1.0, 1.0, 0.3, 2.9, 0.7, 1.1, None, None, 0.25, None, 3.7, -1.3, 0.01, 2.2]
SECOND = [0.5, 0.5, 0.5, 0.5, 1.0, None, 0.0, 1.7, None, None, 0.9, None, 0.33, 4.1, -0.6, 1.9]


def first(completions, **kwargs):
    return FIRST[: len(completions)]


def second(completions, **kwargs):
    return SECOND[: len(completions)]


@pytest.mark.parametrize("aggregation, scale, mode", [
    ("sum_then_normalize", "group", "train"), ("sum_then_normalize", "batch", "train"),
    ("sum_then_normalize", "none", "train"), ("normalize_then_sum", "group", "train"),
    ("sum_then_normalize", "group", "eval"),  # evaluation: groups of num_generations_eval (2 here)
])
def test_the_restated_advantages_are_trls_bit_for_bit(aggregation, scale, mode, tiny_model_path, tiny_dataset,
                                                      tmp_path):
    seen = []
    size = 4 if mode == "train" else 2
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=16, num_generations=4,
                      per_device_eval_batch_size=16, num_generations_eval=2, max_completion_length=4, max_steps=1,
                      report_to="none", use_cpu=True, save_strategy="no", reward_weights=[0.7, 1.3],
                      scale_rewards=scale, multi_objective_aggregation=aggregation)
    trainer = CreditTrainer(tiny_model_path, [first, second], args=args, train_dataset=tiny_dataset,
                            on_credit=seen.append)
    # One generation batch as TRL's sampler hands it (each prompt `size` times), without training: TRL's loss needs
    # Triton on trl 1.15 without it, its generation batch does not (no old log-probs at these settings).
    trainer.model.train(mode == "train")
    trainer._generate_and_score_completions([tiny_dataset[row // size] for row in range(16)])
    (step,) = seen
    assert step.context.mode == mode
    trl = step.trl_advantages  # one process: TRL's slice is every row
    rewards = step.record.rewards_per_func
    assert torch.isnan(rewards).all(dim=1).tolist() == [False] * 8 + [True, True, False, True] + [False] * 4
    restated = trl_advantages(rewards, trainer.reward_weights, size, scale, aggregation)
    assert restated.dtype == trl.dtype == torch.float32
    assert torch.equal(restated, trl), (restated - trl).abs().max()
    assert trl[8:12].tolist()[:2] == [0.0, 0.0] and trl[12:].abs().min() > 0  # unscorable rows 0, signal elsewhere
    # What the core handed the credit: the same values, of every row (GroupOutcome's over TRL's groups)
    assert torch.equal(step.context.capture.trl_global_advantages, trl)
    assert "trl_advantages_restated" not in warned_keys(trainer)  # the core's own check agreed


def test_this_processs_rows_stay_trls_own_and_a_disagreeing_restatement_is_warned_about():
    # Process 1 of 2, 2 rows each, one group of 4: rewards 1, 0, 1, 1 -> mean 3/4, unbiased std 1/2, so TRL's
    # advantages are (0.25, -0.75, 0.25, 0.25) / (0.5 + 1e-4). This process's rows (2-3) are handed in as TRL gave
    # them: first exactly those values (no warning), then made-up ones (a TRL that computed them otherwise).
    trainer = SimpleNamespace(model=SimpleNamespace(training=True), num_generations=4, num_generations_eval=4,
                              reward_weights=torch.ones(1), scale_rewards="group",
                              multi_objective_aggregation="sum_then_normalize",
                              accelerator=SimpleNamespace(process_index=1, is_main_process=True))
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0]])
    by_hand = [a / (0.5 + 1e-4) for a in (0.25, -0.75, 0.25, 0.25)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agreed = trl_global_advantages(trainer, rewards, trl_advantages(rewards, torch.ones(1), 4)[2:])
    assert agreed.tolist() == pytest.approx(by_hand, rel=1e-6)
    with pytest.warns(UserWarning, match="differ from the core's restatement"):
        kept = trl_global_advantages(trainer, rewards, torch.tensor([0.5, 0.5]))
    assert kept[2:].tolist() == [0.5, 0.5] and kept[:2].tolist() == pytest.approx(by_hand[:2], rel=1e-6)
