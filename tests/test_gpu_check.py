"""benchmarks/gpu_check.py on the CPU: argument parsing, the dry-run plan, and a tiny end-to-end run of both parts
(the timed GRPO/method pairs, and the DeepSpeed worker's train + save + adapter check, here without DeepSpeed; with
DeepSpeed's CPU build under the marker ``deepspeed``)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import gpu_check  # noqa: E402

CONFIGS = os.path.join(gpu_check.ROOT, "examples", "accelerate_configs")


def test_arguments_and_dry_run_plan(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--methods", "grpo2"])
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--steps", "0"])
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path), "--lengths", "256,512"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [(p["method"], p["length"]) for p in plan["overhead"]][:4] == [
        ("cue_grpo", 256), ("oppo", 256), ("datpo", 256), ("srpo", 256)]
    assert len(plan["overhead"]) == 8 and plan["out"] == str(tmp_path / "gpu_check.json")
    zero2, zero3 = plan["deepspeed"]
    launch = f"{sys.executable} -m accelerate.commands.launch --config_file"
    for stage, command in ((2, zero2), (3, zero3)):
        assert command.startswith(f"{launch} {CONFIGS}/zero{stage}.yaml --num_processes 1 ")
        assert os.path.exists(f"{CONFIGS}/zero{stage}.yaml") and f"--worker --zero {stage}" in command
        assert f"--deepspeed-trainers {','.join(gpu_check.DEEPSPEED_TRAINERS)}" in command
    # every trainer of the DeepSpeed tests (tests/mp_scripts/engine_trainers.py), LoRA on each
    assert plan["deepspeed_trainers"] == ["grpo", "cue_grpo", "oppo", "oppo_teacher", "datpo", "srpo_scored",
                                          "srpo_generate", "resets_oppo", "process"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--deepspeed-trainers", "oppo,nope"])
    # on a CPU the part runs only when asked, with the full-precision configs
    assert gpu_check.main(["--dry-run", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["deepspeed"] == []
    assert gpu_check.main(["--dry-run", "--device", "cpu", "--deepspeed-cpu", "--out", str(tmp_path)]) == 0
    commands = json.loads(capsys.readouterr().out)["deepspeed"]
    for stage, command in zip((2, 3), commands):
        assert f"{CONFIGS}/zero{stage}_cpu.yaml --num_processes 1 " in command


def test_tiny_cpu_run_writes_ratios(tiny_model_path, tmp_path):
    out = tmp_path / "out"
    argv = ["--device", "cpu", "--tiny", "--assets", tiny_model_path, "--methods", "oppo,srpo", "--lengths", "8",
            "--steps", "2", "--warmup", "0", "--out", str(out)]
    assert gpu_check.main(argv) == 0
    report = json.load(open(out / "gpu_check.json"))
    assert set(report["overhead"]["results"]) == {"oppo@8", "srpo@8"} and report["overhead"]["skipped"] == []
    for key, result in report["overhead"]["results"].items():
        method = key.split("@")[0]
        assert "error" not in result, result
        assert len(result["grpo_step_s"]) == len(result[f"{method}_step_s"]) == 2
        assert result["step_time_ratio_range"][0] <= result["step_time_ratio_median"] <= result["step_time_ratio_range"][1]
        assert result["losses_finite"] and result["token_ratio_median"] >= 1.0
        assert any(name.startswith(method + "/") for name in result["method_metrics_last_step"])
    assert "deepspeed" not in report  # CPU: no DeepSpeed part


def test_worker_trains_saves_and_checks_adapter(tiny_model_path, tmp_path, capsys):
    # without DeepSpeed (one plain CPU process): the trainers the DeepSpeed part adds to the overhead part's
    argv = ["--worker", "--zero", "2", "--device", "cpu", "--tiny", "--assets", tiny_model_path,
            "--deepspeed-trainers", "oppo_teacher,datpo,process", "--lengths", "8", "--steps", "1",
            "--out", str(tmp_path)]
    assert gpu_check.main(argv) == 0
    results = json.load(open(tmp_path / "zero2.json"))
    assert set(results) == {"oppo_teacher", "datpo", "process"}
    for entry in results.values():
        assert "error" not in entry, entry
        assert entry["steps"] == 1 and entry["adapter_tensors"] > 0 and entry["adapter_empty_tensors"] == 0
        assert entry["zero_stage"] is None  # no DeepSpeed here


@pytest.mark.deepspeed
@pytest.mark.multiprocess
def test_deepspeed_part_on_the_cpu(tiny_model_path, tmp_path):
    # The GPU run's DeepSpeed part as it will run there (one process per stage, every trainer, adapters saved),
    # on the CPU configs: what can be checked of it without a GPU.
    pytest.importorskip("deepspeed")
    out = tmp_path / "out"
    argv = ["--device", "cpu", "--tiny", "--deepspeed-cpu", "--skip-overhead", "--assets", tiny_model_path,
            "--deepspeed-length", "8", "--deepspeed-steps", "1", "--deepspeed-timeout-s", "600", "--out", str(out)]
    assert gpu_check.main(argv) == 0
    report = json.load(open(out / "gpu_check.json"))
    assert "overhead" not in report
    for stage in (2, 3):
        part = report["deepspeed"][f"zero{stage}"]
        assert part["exit"] == 0 and part["not_run"] == [], (open(out / f"zero{stage}.log").read()[-3000:], part)
        assert set(part["results"]) == set(gpu_check.DEEPSPEED_TRAINERS)
        for name, entry in part["results"].items():
            assert "error" not in entry, (stage, name, entry)
            assert entry["zero_stage"] == stage and entry["steps"] == 1
            assert entry["adapter_tensors"] > 0 and entry["adapter_empty_tensors"] == 0
