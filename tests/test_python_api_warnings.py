"""The Python API shows no transformers checkpointing FutureWarning the user did not cause (the example scripts
hid them already): a config built with TRL's defaults, and a LoRA run, which PEFT and TRL's generation context
wrap in renamed calls."""

import warnings

import pytest
from peft import LoraConfig

from trl_credit import CreditConfig, CueGRPOConfig, DATPOConfig, OPPOConfig, SRPOConfig, SRPOTrainer
from trl_credit.tasks.rewards import final_number_reward

CONFIGS = [CreditConfig, CueGRPOConfig, DATPOConfig, OPPOConfig, SRPOConfig]


def checkpointing_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning) and "checkpointing" in str(w.message)]


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_configs_built_with_defaults_do_not_warn(config_class):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = config_class(output_dir="unused", use_cpu=True, report_to="none")
    assert checkpointing_warnings(caught) == []
    assert config.gradient_checkpointing is True  # TRL's GRPO default is kept, under both names
    # The user's own use of the old name keeps its value, and the warning about it.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = config_class(output_dir="unused", use_cpu=True, report_to="none", gradient_checkpointing=False)
    assert config.gradient_checkpointing is False
    if hasattr(config, "activation_checkpointing"):  # transformers with the new name
        assert config.activation_checkpointing is False and checkpointing_warnings(caught)


def test_a_lora_run_from_python_shows_no_library_checkpointing_warning(tiny_model_path, tiny_dataset, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = SRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", max_steps=1,
                          per_device_train_batch_size=8, num_generations=8, max_completion_length=8,
                          rollout_template="lines")
        trainer = SRPOTrainer(model=tiny_model_path, reward_funcs=final_number_reward, args=args,
                              train_dataset=tiny_dataset, peft_config=LoraConfig(r=4))
        trainer.train()
    assert trainer.state.global_step == 1
    assert checkpointing_warnings(caught) == []
    # Outside our trainer the same library call still warns: only its own calls are quiet.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.model.is_gradient_checkpointing
    assert checkpointing_warnings(caught)
