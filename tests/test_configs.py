"""What every method config shares with GRPOConfig: the same fields at the same positions (a positional
``XConfig("my_run")`` is the output dir, as with ``GRPOConfig``), the method's fields after them, every
``__post_init__`` in the chain run, and the same command line."""

from dataclasses import fields

import pytest
from transformers import HfArgumentParser
from trl import GRPOConfig

from trl_credit import CueGRPOConfig, DATPOConfig, OPPOConfig, SRPOConfig

CONFIGS = [CueGRPOConfig, OPPOConfig, DATPOConfig, SRPOConfig]
# One field each method validates in its own __post_init__, and a value it refuses.
METHOD_FIELD = {CueGRPOConfig: ("cue_partition", "kmeans"), OPPOConfig: ("oracle", "nobody"),
                DATPOConfig: ("fork_method", "nowhere"), SRPOConfig: ("reset", "never")}


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_grpo_fields_keep_their_positions(config_class):
    grpo = [f.name for f in fields(GRPOConfig)]
    names = [f.name for f in fields(config_class)]
    assert names[: len(grpo)] == grpo
    assert {"success_reward", "success_threshold", "log_credit_rows"} <= set(names[len(grpo):])
    config = config_class("my_run", use_cpu=True)
    assert config.output_dir == "my_run"
    assert (config.log_credit_rows, config.success_reward, config.success_threshold) == (0, None, 1.0)


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_every_post_init_of_the_chain_runs(config_class):
    config = config_class("my_run", use_cpu=True, success_reward="0")
    assert config.success_reward == 0  # SuccessArguments' validation
    assert config.generation_batch_size == config.per_device_train_batch_size  # GRPOConfig's __post_init__
    assert config.bf16 is True  # TrainingArguments' (via TRL's base config): None -> not fp16
    name, bad = METHOD_FIELD[config_class]
    with pytest.raises(ValueError, match=name):
        config_class("my_run", use_cpu=True, **{name: bad})
    with pytest.raises(ValueError, match="log_credit_rows"):
        # validated when the trainer is built; the check reads the field by name
        from trl_credit.core.viz import check_credit_logging_arguments

        check_credit_logging_arguments(config_class("my_run", use_cpu=True, log_credit_rows=-1))


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_command_line_fills_the_named_fields(config_class):
    (config,) = HfArgumentParser(config_class).parse_args_into_dataclasses(
        ["--output_dir", "cli_run", "--use_cpu", "true", "--success_reward", "1", "--log_credit_rows", "2",
         "--per_device_train_batch_size", "16"]
    )
    assert isinstance(config, config_class)
    assert (config.output_dir, config.success_reward, config.log_credit_rows) == ("cli_run", 1, 2)
    assert config.per_device_train_batch_size == 16


def _default(f):
    """A dataclass field's default value (calling its default_factory), or MISSING."""
    from dataclasses import MISSING

    return f.default_factory() if f.default_factory is not MISSING else f.default


@pytest.mark.parametrize("config_class", CONFIGS, ids=lambda c: c.__name__)
def test_every_inherited_field_keeps_grpo_configs_default(config_class):
    # Switching `GRPOConfig` for a method config changes nothing else: the papers' settings (SRPO's temperature
    # 0.7, OPPO's loss_type "grpo", DATPO's N = 4...) live in examples/recipes/<method>.yaml.
    method = {f.name: f for f in fields(config_class)}
    changed = {
        f.name: (_default(f), _default(method[f.name]))
        for f in fields(GRPOConfig)
        if _default(f) != _default(method[f.name]) or f.metadata != method[f.name].metadata
    }
    assert changed == {}
    # and after __post_init__: the same values as a GRPOConfig built with the same arguments
    grpo, config = GRPOConfig("my_run", use_cpu=True), config_class("my_run", use_cpu=True)
    values = {f.name: getattr(grpo, f.name) for f in fields(GRPOConfig)}
    assert {name: getattr(config, name) for name in values} == values
