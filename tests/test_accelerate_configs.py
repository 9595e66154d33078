"""The shipped accelerate configs load with accelerate's own loader and say what their names promise."""

from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "accelerate_configs"


@pytest.mark.parametrize(
    "name, distributed_type, zero_stage",
    [("ddp.yaml", "MULTI_GPU", None), ("zero2.yaml", "DEEPSPEED", 2), ("zero3.yaml", "DEEPSPEED", 3)],
)
def test_accelerate_config_loads(name, distributed_type, zero_stage):
    config = load_config_from_file(str(CONFIGS / name))
    assert str(config.distributed_type).endswith(distributed_type)
    assert config.mixed_precision == "bf16"
    if zero_stage is not None:
        assert config.deepspeed_config["zero_stage"] == zero_stage
    if zero_stage == 3:
        # Without it, saving a LoRA adapter under ZeRO-3 can write empty tensors (docs/design.md, DeepSpeed notes).
        assert config.deepspeed_config["zero3_save_16bit_model"] is True


def test_cpu_config_is_one_full_precision_cpu_process():
    config = load_config_from_file(str(CONFIGS / "cpu.yaml"))
    assert config.use_cpu is True and config.num_processes == 1 and config.mixed_precision == "no"
    assert str(config.distributed_type).endswith("NO")


@pytest.mark.parametrize("name", ["ddp.yaml", "zero2.yaml", "zero3.yaml"])
def test_gpu_configs_take_the_process_count_from_the_launch(name):
    # A hard-coded count (8) launched 8 processes on a machine with fewer GPUs. Left out, accelerate refuses to start
    # without `--num_processes`, which the header's launch command passes.
    import yaml

    text = (CONFIGS / name).read_text()
    assert "num_processes" not in yaml.safe_load(text)
    launch = next(line for line in text.splitlines() if line.lstrip("# ").startswith("accelerate launch"))
    assert "--num_processes <GPUs>" in launch


@pytest.mark.parametrize("stage", [2, 3])
def test_cpu_zero_configs_are_the_gpu_ones_in_full_precision(stage):
    # On a CPU the examples train in float32 (bf16=False), which transformers refuses against a DeepSpeed bf16
    # config; everything else is the GPU config's, so the CPU tests (tests/engines/test_deepspeed.py) run what GPU users run.
    import yaml

    cpu = yaml.safe_load((CONFIGS / f"zero{stage}_cpu.yaml").read_text())
    gpu = yaml.safe_load((CONFIGS / f"zero{stage}.yaml").read_text())
    assert cpu.pop("mixed_precision") == "no" and gpu.pop("mixed_precision") == "bf16"
    assert cpu == gpu
    config = load_config_from_file(str(CONFIGS / f"zero{stage}_cpu.yaml"))
    assert str(config.distributed_type).endswith("DEEPSPEED") and config.deepspeed_config["zero_stage"] == stage
    launch = next(line for line in (CONFIGS / f"zero{stage}_cpu.yaml").read_text().splitlines()
                  if line.lstrip("# ").startswith("accelerate launch"))
    assert f"--config_file examples/accelerate_configs/zero{stage}_cpu.yaml --num_processes 2" in launch
