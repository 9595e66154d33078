"""Drop-in for the composed trainers: the configurations of TRL's own GRPO tests (tests/trainers/dropin_configs.py)
with ``CreditTrainer(rollout="resets", credit="oppo")`` at TRL's baseline G = 3 (one reset group of 3, no base group:
when no seed is incorrect every row falls back and OPPO has no group to credit) and with process credit whose outcome
joins as a final step (``process_outcome="final_step"``). Each trains one step finitely through its own parts."""

import math

import pytest

from tests.trainers.dropin_configs import DROPIN_CONFIGS, DROPIN_EVAL_CONFIGS
from trl_credit import CreditConfig, CreditTrainer
from trl_credit.process.parts import ProcessCredit
from trl_credit.tasks.rewards import completion_text


def parity_reward(completions, **kwargs):
    # The verifier: correct when the text length is odd, so about half the tiny model's rollouts fail (seeds exist
    # in some groups, not in others: both SRPO's reset groups and its fallbacks occur).
    return [float(len(completion_text(c)) % 2) for c in completions]


def trl_length_reward(completions, **kwargs):
    # The reward function of TRL's GRPO tests: the completion's length. Every non-empty completion scores >= 1, so
    # is correct by the verifier: no seed is incorrect, every reset group falls back (OPPO: no group at G = 3).
    return [float(len(completion_text(c))) for c in completions]


def alternating_reward(completions, **kwargs):
    # A second reward that varies within every group, so each reward function matters (TRL's tests use two).
    return [float(i % 2) for i in range(len(completions))]


def word_parity_steps(prompt, completion, steps, **row):
    # One reward per step: 1 for a step of odd length (the steps are split at spaces, see below).
    return [float(len(step) % 2) for step in steps]


def resets_oppo_config(tmp_path, **overrides):
    # TRL's baseline num_generations=3 and per_device_train_batch_size=3; a config's own batch size without its own
    # num_generations is dropped so that whole groups still fit (as in test_srpo_trainer.py's drop-in)
    settings = dict(output_dir=str(tmp_path), rollout="resets", credit="oppo", per_device_train_batch_size=3,
                    num_generations=3, max_completion_length=4, max_steps=1, learning_rate=1e-2, report_to="none",
                    use_cpu=True, save_strategy="no", logging_steps=1, seed=0, rollout_template="Q: {question}",
                    thought_delimiter=" ", max_seed_rounds=2)
    if "num_generations" not in overrides:
        overrides = {k: v for k, v in overrides.items() if k != "per_device_train_batch_size"}
    settings.update(overrides)
    return CreditConfig(**settings)


def process_config(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path), credit="process", process_outcome="final_step",
                    process_thought_delimiter=" ", per_device_train_batch_size=4, num_generations=4,
                    max_completion_length=4, max_steps=1, learning_rate=1e-2, report_to="none", use_cpu=True,
                    save_strategy="no", logging_steps=1, seed=0)
    settings.update(overrides)
    return CreditConfig(**settings)


def _trained_one_finite_step(trainer):
    trainer.train()
    assert trainer.state.global_step == 1
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    return trainer.state.log_history[0]


@pytest.mark.parametrize("overrides", DROPIN_CONFIGS)
def test_resets_x_oppo_trains_with_trl_grpo_test_configurations(tiny_model_path, tiny_dataset, tmp_path, overrides):
    trainer = CreditTrainer(model=tiny_model_path, reward_funcs=[trl_length_reward, alternating_reward],
                            args=resets_oppo_config(tmp_path, **overrides), train_dataset=tiny_dataset)
    logs = _trained_one_finite_step(trainer)
    assert "srpo/fallback_rate" in logs and "oppo/success_rate" in logs  # both parts ran, not plain GRPO


def test_resets_x_oppo_trains_with_reset_groups_at_trls_baseline(tiny_model_path, tiny_dataset, tmp_path):
    # The same baseline with a verifier that fails about half the rollouts: seeds exist, reset groups are credited.
    trainer = CreditTrainer(model=tiny_model_path, reward_funcs=[parity_reward, alternating_reward],
                            args=resets_oppo_config(tmp_path, max_steps=2), train_dataset=tiny_dataset)
    trainer.train()
    rates = [log["srpo/fallback_rate"] for log in trainer.state.log_history if "srpo/fallback_rate" in log]
    assert rates and min(rates) < 1.0, rates  # some reset group was built (not every row a fallback)
    assert any("oppo/value_mean" in log for log in trainer.state.log_history)  # OPPO credited its rows


@pytest.mark.parametrize("overrides", DROPIN_CONFIGS)
def test_process_final_step_trains_with_trl_grpo_test_configurations(tiny_model_path, tiny_dataset, tmp_path,
                                                                     overrides):
    trainer = CreditTrainer(model=tiny_model_path, reward_funcs=[parity_reward, alternating_reward],
                            args=process_config(tmp_path, **overrides), train_dataset=tiny_dataset,
                            credit=ProcessCredit(step_reward=word_parity_steps))
    logs = _trained_one_finite_step(trainer)
    assert "process/steps_per_completion" in logs  # the process credit ran


@pytest.mark.parametrize("overrides", DROPIN_EVAL_CONFIGS)
@pytest.mark.parametrize("composed", ["resets_x_oppo", "process_final_step"])
def test_composed_trainers_evaluate_with_trl_grpo_test_configurations(tiny_model_path, tiny_dataset, tmp_path,
                                                                      composed, overrides):
    # TRL's eval tests: num_generations=3, per_device_eval_batch_size=3.
    settings = dict(max_steps=2, per_device_eval_batch_size=3, eval_strategy="steps", eval_steps=2, **overrides)
    if composed == "resets_x_oppo":
        args, credit = resets_oppo_config(tmp_path, **settings), None
    else:
        args = process_config(tmp_path, num_generations=3, per_device_train_batch_size=3, **settings)
        credit = ProcessCredit(step_reward=word_parity_steps)
    trainer = CreditTrainer(model=tiny_model_path, reward_funcs=trl_length_reward, args=args, train_dataset=tiny_dataset,
                            eval_dataset=tiny_dataset.select(range(4)), **({"credit": credit} if credit else {}))
    trainer.train()
    assert any("eval_loss" in log for log in trainer.state.log_history)
