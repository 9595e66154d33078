"""Plain TRL GRPOTrainer trains 2 steps on the CPU with the tiny model: proves the environment is right."""

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer


def length_parity_reward(completions, **kwargs):
    # A reward with variance on random text, so advantages are non-zero and the loss has a gradient.
    return [float(len(c[0]["content"]) % 2) for c in completions]


@pytest.mark.trl_smoke
def test_grpo_trains_two_steps(tiny_model_path, tiny_dataset, tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        report_to="none",
        logging_steps=1,
        use_cpu=True,
        save_strategy="no",
    )
    trainer = GRPOTrainer(model=tiny_model_path, reward_funcs=length_parity_reward, args=args, train_dataset=tiny_dataset)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter moved after two GRPO steps"
    assert any("reward" in log for log in trainer.state.log_history)
