"""Every trainer trains 2 steps on a colocated vLLM engine (vLLM's CPU build), and what reached vLLM is checked.

Run by ``.ci/engines`` in the engines' own environment (marker ``vllm``; CONTRIBUTING.md, "Engines"). Each case
runs ``tests/engines/vllm_run.py`` in a fresh process (its own engine, as a user's run), which records every
``LLM.generate`` call with each row's sampling parameters, checks after each weight push that vLLM holds the
policy's weights, and compares vLLM's sampling log-probs with the trainer's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm

HERE = os.path.dirname(os.path.abspath(__file__))
CAP = 12  # vllm_run.py's max_completion_length
PROBE_TOLERANCE = 0.05  # vLLM computes in bf16 on the CPU, the policy in float32 (measured: <= 0.007)


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory):
    pytest.importorskip("vllm")
    sys.path.insert(0, os.path.dirname(HERE))
    from tiny import build_tiny_vllm_model

    return build_tiny_vllm_model(str(tmp_path_factory.mktemp("tiny_vllm")))


def run_case(case: str, model: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / f"{case}.json"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.path.dirname(HERE) + os.pathsep + os.path.dirname(os.path.dirname(HERE)),
           "TMPDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, os.path.join(HERE, "vllm_run.py"), case, model, str(out)],
                            capture_output=True, text=True, timeout=900, env=env, cwd=str(tmp_path))
    return result, json.loads(out.read_text()) if out.exists() else None


def check_common(report: dict) -> None:
    assert report["global_step"] == 2
    assert report["push"] == "reload_push", "the bridge's push is installed on vLLM's CPU platform"
    # One push per optimizer step, and after each vLLM holds the policy's weights.
    assert [p["step"] for p in report["pushes"]] == [0, 1]
    for push in report["pushes"]:
        assert push["readable"] >= 3 and push["equal"] == push["readable"], push
        assert push["probe_vs_policy"] < PROBE_TOLERANCE, push
    moved = report["pushes"][1]
    # the step moved the policy well past the tolerance, and vLLM followed it (not the initial weights)
    assert moved["policy_moved"] > 2 * PROBE_TOLERANCE and moved["probe_vs_initial"] > 2 * PROBE_TOLERANCE, moved
    # Every call asked for and got back vLLM's log-probs of the sampled tokens.
    assert report["calls"] and all(c["logprobs_back"] for c in report["calls"])
    assert all(row["logprobs"] == 0 for c in report["calls"] for row in c["rows"])
    assert all(g <= row["max_tokens"] for c in report["calls"] for g, row in zip(c["generated"], c["rows"]))
    # vLLM's sampling log-probs reached the training batch, on every completion token, close to the trainer's.
    assert len(report["batches"]) == 2
    for batch in report["batches"]:
        assert batch["has_sampling"] and batch["sampling_finite"], batch
        assert batch["sampling_vs_old_mean"] < 0.02, batch


def rollout_calls(report: dict, step: int) -> list[dict]:
    """Calls of a step that sample TRL's rollouts: temperature 1, the configured cap, no stop strings."""
    return [c for c in report["calls"] if c["step"] == step and all(
        r["temperature"] == 1.0 and r["max_tokens"] == CAP and not r["stop"] for r in c["rows"])]


@pytest.mark.parametrize("case", ["grpo", "cue_grpo", "oppo", "process", "prime", "prime_lora"])
def test_group_trainers_generate_their_rollouts_on_vllm(case, vllm_model, tmp_path):
    result, report = run_case(case, vllm_model, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    check_common(report)
    # One generation call a step, every row of the batch (8 = 2 prompts x 4), nothing else.
    assert [len(c["rows"]) for c in report["calls"]] == [8, 8]
    assert all(rollout_calls(report, step) for step in (0, 1))


def test_datpo_branches_reach_vllm_with_their_own_budgets(vllm_model, tmp_path):
    result, report = run_case("datpo", vllm_model, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    check_common(report)
    for step in (0, 1):
        calls = [c for c in report["calls"] if c["step"] == step]
        assert rollout_calls(report, step) and len(calls) >= 2, "phase 1, then the branches"
        branches = [c for c in calls if c not in rollout_calls(report, step)]
        rows = [(row["max_tokens"], g) for c in branches for row, g in zip(c["rows"], c["generated"])]
        # each branch row carries its own fork's budget (below the cap, not all the same) and vLLM stopped it there
        assert rows and all(budget < CAP for budget, _ in rows)
        assert len({budget for budget, _ in rows}) > 1, rows
        assert all(generated <= budget for budget, generated in rows)
    assert "datpo/branch_tokens_past_budget" in report["logged"]


@pytest.mark.parametrize("case", ["srpo_scored", "srpo_generate_lora", "resets_oppo"])
def test_resets_seeds_suffixes_and_localization_reach_vllm(case, vllm_model, tmp_path):
    result, report = run_case(case, vllm_model, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    check_common(report)
    greedy = [c for c in report["calls"] if all(r["temperature"] == 0.0 for r in c["rows"])]
    if case == "srpo_generate_lora":
        # the paper's localization: greedy, stopped right after the boxed answer, within its own token budget
        assert greedy and all(r["max_tokens"] == 6 and r["stop"] and all(s.startswith("\\boxed{") for s in r["stop"])
                              for c in greedy for r in c["rows"]), greedy
    else:
        assert not greedy, "scored localization is a forward pass, not a generation"
    for step in (0, 1):
        sampled = [c for c in report["calls"] if c["step"] == step and c not in greedy]
        # base rollouts (or the seeds of a resets-only split) and the suffixes from the reset states
        assert len(sampled) >= 2, [len(c["rows"]) for c in sampled]


def test_trl_push_still_fails_on_vllm_cpu(vllm_model, tmp_path):
    """The contract of the bridge's fix: TRL's own colocate push cannot load into vLLM's CPU engine. When this fails,
    TRL or vLLM no longer need the fix (trl_bridge/vllm_push.py): drop it."""
    result, report = run_case("grpo_trl_push", vllm_model, tmp_path)
    assert result.returncode != 0 and report is None
    assert "weight_loader" in result.stderr, result.stderr[-4000:]
