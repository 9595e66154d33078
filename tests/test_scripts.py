"""The shared example-script runner and the model card mixin, driven with GRPOTrainer and the tiny model."""

import os

import pytest
from trl import GRPOConfig, GRPOTrainer

from trl_credit.model_card import MethodModelCardMixin, method_hyperparameters
from trl_credit.rewards import accuracy_reward, final_number_reward
from trl_credit.scripts import load_reward_funcs, main, offline_defaults


def test_reward_registry_defaults_and_errors():
    assert load_reward_funcs(None, "arithmetic") == [final_number_reward]
    assert load_reward_funcs(None, "openai/gsm8k") == [accuracy_reward]
    assert load_reward_funcs(["trl_credit.rewards.accuracy_reward"], None) == [accuracy_reward]
    with pytest.raises(ValueError, match="--reward_funcs"):
        load_reward_funcs(["nope"], None)


def test_chain_dataset_name_builds_the_chain_task_with_the_boxed_reward(tiny_model_path, tmp_path):
    assert load_reward_funcs(None, "chain") == [accuracy_reward]
    defaults = offline_defaults("grpo", max_steps=1, per_device_train_batch_size=4, max_completion_length=4)
    argv = [
        "--model_name_or_path", tiny_model_path,
        "--output_dir", str(tmp_path / "out"),
        "--dataset_name", "chain",
        "--chain_num_train", "8",
        "--chain_num_test", "4",
        "--lora_target_modules", "q_proj", "v_proj",
        "--use_cpu", "true",
    ]
    trainer = main(GRPOTrainer, GRPOConfig, defaults, argv=argv)
    questions = trainer.train_dataset["question"]
    assert len(questions) == 8 and all(", then " in q for q in questions)
    assert trainer.reward_funcs == [accuracy_reward]


def test_main_trains_with_lora_and_saves_adapter(tiny_model_path, tmp_path):
    defaults = offline_defaults("grpo", max_steps=1, per_device_train_batch_size=4, max_completion_length=4)
    argv = [
        "--model_name_or_path", tiny_model_path,
        "--output_dir", str(tmp_path / "out"),
        "--arithmetic_num_train", "8",
        "--arithmetic_num_test", "4",
        "--lora_target_modules", "q_proj", "v_proj",
        "--use_cpu", "true",
    ]
    trainer = main(GRPOTrainer, GRPOConfig, defaults, argv=argv)
    assert trainer.state.global_step == 1
    assert trainer.args.learning_rate == 5e-5 and trainer.args.num_generations == 4  # defaults reached the config
    saved = os.listdir(tmp_path / "out")
    assert "adapter_config.json" in saved and "adapter_model.safetensors" in saved


def test_model_card_names_method_hyperparameters_and_base_model(tiny_model_path, tiny_dataset, tmp_path):
    class CardTrainer(MethodModelCardMixin, GRPOTrainer):
        _name = "Demo"
        _paper = {"title": "A demo paper"}

    args = GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, num_generations=4,
                      per_device_train_batch_size=4, max_completion_length=4)
    trainer = CardTrainer(model=tiny_model_path, reward_funcs=final_number_reward, args=args, train_dataset=tiny_dataset)
    trainer.create_model_card()
    card = open(tmp_path / "README.md").read()
    assert "## Demo hyperparameters" in card and "A demo paper" in card
    assert tiny_model_path in card
    assert "| `num_generations` | `4` |" in card
    assert method_hyperparameters(args)["max_completion_length"] == 4
