"""Common GRPOConfig settings from TRL's own GRPO test suite (tests/test_grpo_trainer.py, trl 1.16), which needs Hub
models and datasets and so cannot run offline: each entry is one configuration those tests train with. A trainer
that is a drop-in replacement trains one step with each of them on the tiny model, or refuses it clearly."""

import pytest

DROPIN_CONFIGS = [
    pytest.param(dict(loss_type="grpo"), id="grpo"),
    pytest.param(dict(loss_type="bnpo"), id="bnpo"),
    pytest.param(dict(loss_type="dr_grpo"), id="dr_grpo"),
    pytest.param(dict(loss_type="dapo", gradient_accumulation_steps=2), id="dapo-accumulated"),
    pytest.param(dict(loss_type="cispo"), id="cispo"),
    pytest.param(dict(loss_type="sapo"), id="sapo"),
    pytest.param(dict(loss_type="luspo", importance_sampling_level="sequence"), id="luspo"),
    pytest.param(dict(loss_type="vespo"), id="vespo"),
    pytest.param(dict(scale_rewards="batch"), id="scale_rewards-batch"),
    pytest.param(dict(scale_rewards="none"), id="scale_rewards-none"),
    pytest.param(dict(multi_objective_aggregation="normalize_then_sum"), id="normalize_then_sum"),
    pytest.param(dict(mask_truncated_completions=True), id="mask_truncated_completions"),
    pytest.param(dict(num_generations=3, per_device_train_batch_size=3), id="num_generations-3"),
    pytest.param(dict(num_iterations=2), id="num_iterations-2"),
    pytest.param(dict(steps_per_generation=2, per_device_train_batch_size=2), id="steps_per_generation-2"),
    pytest.param(dict(beta=0.1), id="beta"),
    pytest.param(dict(off_policy_mask_threshold=0.5), id="off_policy_mask"),
    pytest.param(dict(top_entropy_quantile=0.5), id="top_entropy_quantile"),
    pytest.param(dict(delta=2.0, epsilon_high=0.28), id="two_sided_clipping"),
    pytest.param(dict(importance_sampling_level="sequence"), id="sequence_importance_sampling"),
    pytest.param(dict(reward_weights=[0.7, 0.3]), id="reward_weights"),
]

# Evaluation settings of TRL's tests (num_generations_eval=1 is a group of one: no group statistics).
DROPIN_EVAL_CONFIGS = [
    pytest.param(dict(), id="eval"),
    pytest.param(dict(num_generations_eval=1), id="num_generations_eval-1"),
    pytest.param(dict(eval_on_start=True), id="eval_on_start"),
]
