"""Every trainer under DeepSpeed ZeRO-2 and ZeRO-3 with 2 CPU processes, launched as users do (``accelerate launch
--config_file examples/accelerate_configs/zero{2,3}_cpu.yaml``), against the same run under 2-process DDP (torchrun).

Each launch trains the trainers of tests/mp_scripts/engine_trainers.py one after the other (2 steps each, sampled
generation, rewards [accuracy, format]); the first generation batch (made by the initial policy, the same on every
launcher) must have the same completions and, within float round-off, the same advantages, and the first step the same
loss. ZeRO-3 also trains and saves a LoRA adapter. PRIME (``prime``: its PRM a model copy, ``prime_lora``: a second
LoRA adapter, partitioned with the policy under ZeRO-3) runs under both stages, and its PRM's parameters after the
first update equal DDP's. The process credit, OPPO and DATPO also train with TRL's ``environment_factory`` under
ZeRO-3 against DDP (``env_process``, ``env_oppo``, ``env_datpo``), and DATPO's resumed tool loop goes in lockstep when
only one process has branches (``test_datpo_branches_resume_the_tool_loop_in_lockstep_under_zero3``). Marker ``deepspeed`` (needs the ``deepspeed`` extra; excluded
from the default run): ``python -m pytest -m deepspeed tests/engines/test_deepspeed.py``.
"""

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from tests.mp import run_accelerate, run_torchrun  # noqa: E402

pytestmark = [pytest.mark.deepspeed, pytest.mark.multiprocess]

SCRIPT = "tests/mp_scripts/engine_trainers.py"
CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "accelerate_configs"
TRAINERS = ["grpo", "cue_grpo", "cue_judge", "oppo", "oppo_teacher", "datpo", "srpo_scored", "srpo_generate",
            "resets_oppo", "process"]
PRIME = ["prime", "prime_lora"]  # PRIME's PRM is trained by its own AdamW outside the engine


def _launch(launch, out_dir, names):
    """Run one launch; a failure is kept (not raised) so each trainer's test reports it, and the ones that ran pass."""
    try:
        launch(str(out_dir), ",".join(names))
        return None
    except AssertionError as error:
        return str(error)


def _reports(out_dir, failure, name):
    paths = [Path(out_dir) / f"{name}.rank{rank}.json" for rank in range(2)]
    if not all(path.exists() for path in paths):
        pytest.fail(f"{name} did not finish in its launch:\n{failure}")
    return [json.loads(path.read_text()) for path in paths]


@pytest.fixture(scope="module")
def ddp_run(tiny_model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    return out, _launch(lambda o, n: run_torchrun(SCRIPT, tiny_model_path, o, n), out, TRAINERS + PRIME)


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def zero_run(request, tiny_model_path, tmp_path_factory):
    stage = request.param
    out = tmp_path_factory.mktemp(f"zero{stage}")
    names = TRAINERS + PRIME + (["lora"] if stage == 3 else [])
    config = str(CONFIGS / f"zero{stage}_cpu.yaml")
    return stage, out, _launch(lambda o, n: run_accelerate(config, SCRIPT, tiny_model_path, o, n), out, names)


@pytest.mark.parametrize("name", TRAINERS + PRIME)
def test_trainer_under_zero_matches_ddp_at_step_one(zero_run, ddp_run, name):
    stage, zero_out, zero_failure = zero_run
    ddp = _reports(*ddp_run, name)
    zero = _reports(zero_out, zero_failure, name)
    for rank, (d, z) in enumerate(zip(ddp, zero)):
        assert (d["deepspeed"], d["world"]) == (False, 2)
        assert (z["deepspeed"], z["zero_stage"], z["world"]) == (True, stage, 2)
        assert d["steps"] == z["steps"] == 2
        assert len(z["losses"]) == 2 and all(math.isfinite(loss) for loss in z["losses"])
        assert [r["prompt"] for r in z["rows"]] == [r["prompt"] for r in d["rows"]], f"rank {rank}"
        assert [r["completion"] for r in z["rows"]] == [r["completion"] for r in d["rows"]], f"rank {rank}"
        # PRIME's LoRA PRM under ZeRO-3: its float32 gradients through the partitioned model round differently
        # (~1e-9 relative), AdamW's first step scales each by 1 / (|g| + eps), and the whitening scales the PRM's small
        # token rewards up: measured 2.2e-6 (7.7e-6 with seed 0) on advantages up to 2.3, hence a relative bound too.
        rel = 1e-5 if (stage == 3 and name in PRIME) else None
        for row_ddp, row_zero in zip(d["rows"], z["rows"]):
            assert row_zero["advantages"] == pytest.approx(row_ddp["advantages"], rel=rel, abs=1e-5)
        # The first step trains the same batch from the same weights: the same loss up to float round-off.
        assert z["losses"][0] == pytest.approx(d["losses"][0], rel=1e-4, abs=1e-7)
    # a comparison of all-zero advantages would show nothing
    assert any(abs(a) > 1e-3 for report in ddp for row in report["rows"] for a in row["advantages"])
    if name in PRIME:  # the PRM's update (its own AdamW, gradients summed over processes) is DDP's
        for d, z in zip(ddp, zero):
            assert d["prm"] and len(z["prm"]) == len(d["prm"])
            for (sum_d, abs_d, head_d), (sum_z, abs_z, head_z) in zip(d["prm"], z["prm"]):
                assert abs_z == pytest.approx(abs_d, rel=1e-5, abs=1e-6)
                # a sum of terms of both signs rounds on the scale of its terms' total: 6.6e-7 measured on a sum of
                # 3.9e-4 whose terms total 0.64 (prime_lora under ZeRO-3)
                assert sum_z == pytest.approx(sum_d, rel=1e-5, abs=max(1e-6, 1e-5 * abs_d))
                assert head_z == pytest.approx(head_d, rel=1e-5, abs=1e-6)
        assert ddp[0]["prm"] == ddp[1]["prm"]  # every process took the same step
        assert zero[0]["prm"] == zero[1]["prm"]
    if name == "prime_lora":  # one process has no credited row: under ZeRO-3 it runs filler forwards (else: a hang)
        assert any(all(a == 0 for row in report["rows"] for a in row["advantages"]) for report in ddp)


def test_lora_adapter_saved_complete_under_zero3(zero_run):
    stage, out, failure = zero_run
    if stage != 3:
        pytest.skip("LoRA runs under ZeRO-3 only (its sharded save is the one that can write empty tensors)")
    _reports(out, failure, "lora")
    from safetensors.torch import load_file

    adapter = load_file(str(out / "lora_adapter" / "adapter_model.safetensors"))
    # r=4 on q_proj (32 -> 32) and v_proj (32 -> 16, 2 key-value heads of 8) in both layers of the tiny model
    expected = {}
    for layer in range(2):
        for proj, out_features in (("q_proj", 32), ("v_proj", 16)):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            expected[f"{prefix}.lora_A.weight"] = (4, 32)
            expected[f"{prefix}.lora_B.weight"] = (out_features, 4)
    assert {k: tuple(v.shape) for k, v in adapter.items()} == expected
    # lora_B starts at zero: non-zero values mean the trained (gathered) weights were written, not empty shards
    assert all(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)


# ---------------------------------------------------------------------------------------------------- environment
# TRL's environment_factory under ZeRO-3 (the policy gathered for each turn's generation; the environment's results
# between the turns): the process credit (the environment's turn rewards), OPPO and DATPO (its branches resume TRL's
# tool loop from their forks, in lockstep across the processes) on the tool-calling tiny model, their own launches
# (another model), compared with DDP as above.
ENVIRONMENT = ["env_process", "env_oppo", "env_datpo"]


@pytest.fixture(scope="module")
def environment_runs(tmp_path_factory):
    from tests.tiny_tools import build_tool_calling_model

    model = build_tool_calling_model(str(tmp_path_factory.mktemp("tool_calling_model")))
    ddp, zero3 = tmp_path_factory.mktemp("env_ddp"), tmp_path_factory.mktemp("env_zero3")
    config = str(CONFIGS / "zero3_cpu.yaml")
    return ((ddp, _launch(lambda o, n: run_torchrun(SCRIPT, model, o, n), ddp, ENVIRONMENT)),
            (zero3, _launch(lambda o, n: run_accelerate(config, SCRIPT, model, o, n), zero3, ENVIRONMENT)))


@pytest.mark.parametrize("name", ENVIRONMENT)
def test_environment_trainer_under_zero3_matches_ddp_at_step_one(environment_runs, name):
    (ddp_out, ddp_failure), (zero_out, zero_failure) = environment_runs
    ddp, zero = _reports(ddp_out, ddp_failure, name), _reports(zero_out, zero_failure, name)
    for rank, (d, z) in enumerate(zip(ddp, zero)):
        assert (d["deepspeed"], d["world"], z["deepspeed"], z["zero_stage"], z["world"]) == (False, 2, True, 3, 2)
        assert d["steps"] == z["steps"] == 2 and all(math.isfinite(loss) for loss in z["losses"])
        # the same turns (the environment's results between them), the same advantages, the same first loss
        assert [r["completion"] for r in z["rows"]] == [r["completion"] for r in d["rows"]], f"rank {rank}"
        assert [r["tool_mask"] for r in z["rows"]] == [r["tool_mask"] for r in d["rows"]], f"rank {rank}"
        for row_ddp, row_zero in zip(d["rows"], z["rows"]):
            assert row_zero["advantages"] == pytest.approx(row_ddp["advantages"], abs=1e-5)
        assert z["losses"][0] == pytest.approx(d["losses"][0], rel=1e-4, abs=1e-7)
    rows = [row for report in ddp for row in report["rows"]]
    # the environment answered in the rollouts (tool_mask 0), and its results carry no advantage; the model's do
    assert sum(0 in row["tool_mask"] for row in rows) >= 2, [row["tool_mask"] for row in rows]
    for row in rows:
        assert len(row["advantages"]) == len(row["tool_mask"])  # per-token advantages
        assert all(a == 0.0 for a, m in zip(row["advantages"], row["tool_mask"]) if m == 0)
    assert any(abs(a) > 1e-3 for row in rows for a in row["advantages"])


# ---------------------------------------------------------------------------------------------------- lockstep
def test_datpo_branches_resume_the_tool_loop_in_lockstep_under_zero3(tiny_tool_model_path, tmp_path):
    """Process 0 grows a tree whose 4 branches call the tool again (one more round of TRL's resumed loop), process 1
    none (its prompt is solved). Under ZeRO-3 each generation call gathers the parameters, so process 1 joins the
    round with a filler call (core.tool_loop.Lockstep): the run ends, with process 0's branches resumed."""
    from tests.test_multiturn_datpo import CALL, CONTINUATION, LONG
    from tests.test_multiturn_trl import TOOL_SPAN

    run_accelerate(str(CONFIGS / "zero3_cpu.yaml"), "tests/mp_scripts/datpo_lockstep_zero3.py", tiny_tool_model_path,
                   str(tmp_path), timeout=600)
    reports = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in range(2)]
    assert all(r["deepspeed"] and r["world"] == 2 and r["steps"] == 1 for r in reports)
    base, branch = CALL + TOOL_SPAN.format(result="2") + LONG, CONTINUATION + TOOL_SPAN.format(result="7") + LONG
    # rank 0: 2 base rows, then 2 branches from each one's fork; rank 1: its 2 base rows, then 4 empty filler rows
    assert [text for text, _ in reports[0]["rows"]] == [base] * 2 + [branch] * 4
    assert [text for text, _ in reports[1]["rows"]] == [base] * 2 + [""] * 4
    # the generate calls of each process: the first turns, the turns after the tool, the branch continuations (the 2
    # forks shared out, one a process), then process 0's resumed round (4 rows after the tool results), which process
    # 1, done, joined with 4 one-token filler rows
    assert reports[0]["calls"][2:] == [["continuation"] * 2, ["after_tool"] * 4]
    assert reports[1]["calls"][2:] == [["continuation"] * 2, ["continuation"] * 4]
