"""`--resume_from_checkpoint last`: an interrupted run continues from the newest checkpoint in its output_dir."""

import pytest
import torch
from safetensors.torch import load_file

from trl_credit.scripts import resolve_resume
from trl_credit.tasks.rewards import final_number_reward
from trl_credit.train import train

_calls = {"left": None}


def interrupted_reward(completions, **kwargs):
    """final_number_reward that raises once its call budget is spent: the run stops mid-training (a killed job)."""
    if _calls["left"] is not None:
        if _calls["left"] == 0:
            raise KeyboardInterrupt("the job was stopped")
        _calls["left"] -= 1
    return final_number_reward(completions, **kwargs)


def _argv(tiny_model_path, out, *extra):
    return ["--model_name_or_path", tiny_model_path, "--output_dir", str(out), "--max_steps", "3",
            "--save_steps", "1", "--per_device_train_batch_size", "4", "--max_completion_length", "4",
            "--arithmetic_num_train", "8", "--arithmetic_num_test", "4", "--lora_target_modules", "q_proj", "v_proj",
            "--reward_funcs", "tests.test_resume.interrupted_reward", "--logging_steps", "1", *extra]


def test_last_resumes_an_interrupted_run_where_it_stopped(tiny_model_path, tmp_path, capsys):
    straight = train("grpo", _argv(tiny_model_path, tmp_path / "straight"))  # 3 steps, never stopped
    out = tmp_path / "run"
    _calls["left"] = 2  # one reward call per step: step 3 is stopped, checkpoint-2 is the newest
    try:
        with pytest.raises(KeyboardInterrupt):
            train("grpo", _argv(tiny_model_path, out))
    finally:
        _calls["left"] = None
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-1",
                                                                                        "checkpoint-2"]
    capsys.readouterr()
    resumed = train("grpo", _argv(tiny_model_path, out, "--resume_from_checkpoint", "last"))
    printed = capsys.readouterr().out
    assert f"--resume_from_checkpoint last: resuming from {out / 'checkpoint-2'}" in printed
    assert "== GRPO run finished: 3 optimizer steps ==" in printed
    assert resumed.state.global_step == 3
    # steps 1-2 came back with the checkpoint, step 3 trained now: the run equals the one never stopped
    assert [e["step"] for e in resumed.state.log_history if "reward" in e] == [1, 2, 3]
    weights, reference = load_file(out / "adapter_model.safetensors"), load_file(
        tmp_path / "straight" / "adapter_model.safetensors")
    assert weights.keys() == reference.keys()
    for name in weights:
        torch.testing.assert_close(weights[name], reference[name], rtol=1e-5, atol=1e-7)
    assert straight.state.global_step == 3


def test_last_without_a_checkpoint_starts_from_step_0(tmp_path, capsys):
    assert resolve_resume("last", str(tmp_path / "new")) is None
    assert "no checkpoint in" in capsys.readouterr().out
    (tmp_path / "checkpoint-7").mkdir()
    (tmp_path / "checkpoint-12").mkdir()
    assert resolve_resume("last", str(tmp_path)) == str(tmp_path / "checkpoint-12")  # the newest step, not the name
    assert resolve_resume("some/path", str(tmp_path)) == "some/path" and resolve_resume(None, str(tmp_path)) is None


def test_the_scripts_checkpoint_by_default_on_a_gpu_and_save_at_the_end_on_a_cpu(monkeypatch):
    from trl_credit.scripts import offline_defaults

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = offline_defaults("srpo")
    assert (gpu["save_strategy"], gpu["save_steps"], gpu["save_total_limit"]) == ("steps", 50, 2)
    assert "use_cpu" not in gpu and "bf16" not in gpu  # GRPOConfig's bf16 default stands on a GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = offline_defaults("srpo")
    assert (cpu["save_strategy"], cpu["use_cpu"], cpu["bf16"]) == ("no", True, False)
