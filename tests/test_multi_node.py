"""Two "machines" on localhost: two `accelerate launch` processes with --num_machines 2 and --machine_rank 0/1, as
examples/accelerate_configs/MULTI_NODE.md runs them on two nodes (gloo on the CPU)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trl_credit.scripts import JOINING_CONFIGS, refuse_unjoined_processes

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "examples" / "accelerate_configs"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch_two_machines(config: str, tiny_model_path: str, out: Path, timeout: int = 600):
    """Start machine 0 and machine 1 (one process each) of `trl_credit.train grpo`; return both results."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    port = _free_port()
    processes = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
                   "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(rank),
                   "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
                   "-m", "trl_credit.train", "grpo", "--model_name_or_path", tiny_model_path, "--output_dir", str(out),
                   "--max_steps", "2", "--per_device_train_batch_size", "4", "--max_completion_length", "4",
                   "--arithmetic_num_train", "8", "--arithmetic_num_test", "4", "--lora_target_modules", "q_proj",
                   "v_proj"]
        processes.append(subprocess.Popen(command, env=env, cwd=str(out.parent), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [process.communicate(timeout=timeout)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    return [(process.returncode, output) for process, output in zip(processes, outputs)]


def test_a_config_that_cannot_join_machines_is_refused_naming_the_ones_that_can(tiny_model_path, tmp_path):
    # cpu.yaml (distributed_type NO): accelerate would start two unrelated one-process runs, each saving its own model
    results = _launch_two_machines("cpu.yaml", tiny_model_path, tmp_path / "out", timeout=300)
    for returncode, output in results:
        assert returncode != 0, output[-3000:]
        assert "cannot join them" in output and "ddp.yaml" in output and "zero3_cpu.yaml" in output, output[-3000:]
        assert "saved to" not in output
    assert not (tmp_path / "out").exists()  # nothing trained, nothing saved


def test_the_refusal_reads_the_launchers_environment():
    launched = {"ACCELERATE_USE_CPU": "True"}
    refuse_unjoined_processes(launched)  # one machine, one process: no MASTER_ADDR
    refuse_unjoined_processes({**launched, "MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "16"})  # torchrun joined them
    refuse_unjoined_processes({"MASTER_ADDR": "10.0.0.1"})  # not started by accelerate's plain launcher
    with pytest.raises(SystemExit, match="MULTI_NODE.md"):
        refuse_unjoined_processes({**launched, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})


def test_multi_node_md_names_the_configs_that_join_machines():
    from accelerate.commands.config.config_args import load_config_from_file

    text = (CONFIGS / "MULTI_NODE.md").read_text()
    for name in JOINING_CONFIGS:
        assert f"`{name}`" in text
        assert load_config_from_file(str(CONFIGS / name)).distributed_type.value in ("MULTI_GPU", "DEEPSPEED")
    assert load_config_from_file(str(CONFIGS / "cpu.yaml")).distributed_type.value == "NO"
    assert "`cpu.yaml`" in text  # and says it cannot


@pytest.mark.multiprocess
def test_ddp_across_two_machines_trains_and_only_the_main_machine_says_it_saved(tiny_model_path, tmp_path):
    out = tmp_path / "out"
    (main_rc, main_out), (other_rc, other_out) = _launch_two_machines("ddp.yaml", tiny_model_path, out)
    assert main_rc == 0, main_out[-6000:]
    assert other_rc == 0, other_out[-6000:]
    assert "== GRPO run finished: 2 optimizer steps ==" in main_out
    assert f"Adapter saved to {out}" in main_out
    assert "saved to" not in other_out and "run finished" not in other_out  # machine 1 saved nothing
    assert (out / "adapter_model.safetensors").exists()


@pytest.mark.deepspeed  # in .ci/engines' venv, where DeepSpeed is installed
@pytest.mark.multiprocess
def test_zero2_across_two_machines_trains(tiny_model_path, tmp_path):
    out = tmp_path / "out"
    (main_rc, main_out), (other_rc, other_out) = _launch_two_machines("zero2_cpu.yaml", tiny_model_path, out)
    assert main_rc == 0, main_out[-6000:]
    assert other_rc == 0, other_out[-6000:]
    assert "== GRPO run finished: 2 optimizer steps ==" in main_out and "saved to" not in other_out
    assert (out / "adapter_model.safetensors").exists()
