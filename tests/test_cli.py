"""`trl-credit <method>`: the training command of the installed wheel (not the checkout), in TRL's shape."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trl_credit.cli import _resolve_accelerate_config, _subtract_subsequence
from trl_credit.train import METHODS

ROOT = Path(__file__).resolve().parents[1]


def test_methods_are_the_issue_s_six():
    assert list(METHODS) == ["grpo", "cue_grpo", "oppo", "datpo", "srpo", "credit"]


def test_launch_flags_go_to_accelerate_and_training_flags_to_the_script():
    args = ["--config", "r.yaml", "--num_processes", "8", "--learning_rate", "1e-6", "--config_file", "z.yaml"]
    assert _subtract_subsequence(args, ["--num_processes", "8", "--config_file", "z.yaml"]) == [
        "--config", "r.yaml", "--learning_rate", "1e-6"]
    resolved = _resolve_accelerate_config(["--num_processes", "8", "--accelerate_config", "zero2"])
    assert resolved[0] == "--config_file" and resolved[1].endswith(os.path.join("accelerate_configs", "zero2.yaml"))
    assert resolved[2:] == ["--num_processes", "8"]
    with pytest.raises(SystemExit, match="zero9"):
        _resolve_accelerate_config(["--accelerate_config", "zero9"])


def _build_and_install(tmp_path: Path) -> Path:
    """The wheel built from this working tree, pip-installed (--no-deps, offline) into a fresh venv that sees the
    installed dependencies (--system-site-packages). Returns the venv."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / "trl_credit", source / "trl_credit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = ["--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", *pip, "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("trl_credit-*.whl"))
    assert "trl_credit/train.py" in zipfile.ZipFile(wheel).namelist()  # the script ships: examples/ does not
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", *pip, "--no-deps", "--no-index",
                    str(wheel)], check=True, cwd=tmp_path)
    return venv


def test_the_installed_wheel_trains_one_step_with_trl_credit(tiny_model_path, tmp_path):
    venv = _build_and_install(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package, not the checkout
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import trl_credit.train as t; print(t.__file__)"],
                           env=env, cwd=run, capture_output=True, text=True, check=True).stdout.strip()
    assert Path(where).is_relative_to(venv), where
    out = run / "out"
    result = subprocess.run(
        [str(venv / "bin" / "trl-credit"), "oppo", "--model_name_or_path", tiny_model_path, "--output_dir", str(out),
         "--max_steps", "1", "--per_device_train_batch_size", "4", "--max_completion_length", "4",
         "--arithmetic_num_train", "8", "--arithmetic_num_test", "4", "--lora_target_modules", "q_proj", "v_proj",
         "--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
        env=env, cwd=run, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-6000:]
    # the scripts' closing summary, the method's metrics in it, and the adapter where it says
    assert "== OPPO run finished: 1 optimizer step ==" in result.stdout, result.stdout[-4000:]
    assert "oppo/" in result.stdout and f"Adapter saved to {out}" in result.stdout
    assert (out / "adapter_model.safetensors").exists() and (out / "README.md").exists()


def test_unknown_method_and_help():
    from trl_credit.cli import main

    assert main(["ppo"]) == 2
    assert main([]) == 0
    with pytest.raises(SystemExit) as exit_:
        main(["srpo", "--help"])  # the method's TrlParser help (every GRPOConfig and SRPOConfig flag)
    assert exit_.value.code == 0
