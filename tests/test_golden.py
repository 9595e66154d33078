"""Golden values: every trainer (and plain GRPOTrainer, the control that the harness itself is deterministic) must
reproduce, on fixed seeds and the tiny model, the generated token ids, the advantages and log-probs that reach TRL's
loss, the losses, every logged metric and the trained parameters recorded in tests/golden/*.json from the code as it
was before the trainer glue moved into one credit core. What is recorded and how: tests/golden/record.py.

A failure here after a refactor means the refactor changed numbers. Do not regenerate the golden files to make it
pass; regenerate (``python -m tests.golden.record``) only for a change that is meant to change numbers, and say so.

Tolerance: token ids, masks, counts and steps are compared exactly; floats within rtol 1e-6 / atol 1e-7. The same
code on the same machine reproduces every value bit for bit (the recorder run twice writes identical files; torch
runs on one thread inside the harness, since a CPU reduction's result depends on how threads split it). The
tolerance only admits a refactor that adds the same float32 numbers in another order (a few ulps: float32's
relative step is 1.2e-7); atol covers values that are zero up to rounding (an on-policy GRPO loss is ~1e-8). A
real change of behaviour moves advantages or metrics far more, and a changed random draw changes token ids.
"""

import json
import math

import pytest

from tests.golden.record import (
    ONE_PROCESS_FILE,
    SCENARIOS,
    TWO_PROCESS_SCENARIOS,
    TWO_PROCESS_SCRIPT,
    TWO_PROCESSES_FILE,
    compare,
    environment,
    load,
    run_scenario,
    scenario_settings,
)
from tests.mp import run_torchrun


@pytest.fixture(scope="module")
def golden():
    return load(ONE_PROCESS_FILE)


@pytest.fixture(scope="module")
def golden_two():
    return load(TWO_PROCESSES_FILE)


def _report(name: str, problems: list[str], recorded_env: dict) -> str:
    shown = "\n  ".join(problems[:25])
    more = f"\n  ... and {len(problems) - 25} more" if len(problems) > 25 else ""
    return (
        f"{name}: {len(problems)} values differ from the golden record (recorded with {recorded_env}, running "
        f"{environment()}):\n  {shown}{more}"
    )


def test_comparison_is_exact_for_integers_and_tight_for_floats():
    # The checker itself: what it lets through and what it reports.
    golden = {"ids": [[5, 7, 2]], "adv": [0.5, -1.25], "loss": 1e-8, "flag": True, "none": None}
    assert compare(golden, json.loads(json.dumps(golden))) == []
    assert compare(golden, {**golden, "ids": [[5, 8, 2]]}) == ["/ids[0][1]: 8 != golden 7"]
    assert compare(golden, {**golden, "adv": [0.5 * (1 + 5e-7), -1.25]}) == []  # within rtol 1e-6
    assert len(compare(golden, {**golden, "adv": [0.5 * (1 + 5e-6), -1.25]})) == 1
    assert compare(golden, {**golden, "loss": 5e-8}) == []  # within atol 1e-7
    assert len(compare(golden, {**golden, "loss": 3e-7})) == 1
    assert len(compare(golden, {**golden, "ids": [[5, 7]]})) == 1  # one token fewer
    assert len(compare(golden, {**golden, "adv": [0.5, -1]})) == 1  # an int where a float was recorded
    assert len(compare(golden, {**golden, "extra": 1})) == 1  # a new logged key
    assert compare({"x": math.nan}, {"x": math.nan}) == []


def test_golden_files_hold_the_harness_scenarios(golden, golden_two):
    # Editing a scenario (or the shared settings) without regenerating would compare different runs.
    assert golden["settings"] == scenario_settings(SCENARIOS), "scenarios changed: the golden file is stale"
    assert golden_two["settings"] == scenario_settings(TWO_PROCESS_SCENARIOS), "2-process scenarios changed"
    assert set(golden["runs"]) == set(SCENARIOS) and set(golden_two["runs"]) == set(TWO_PROCESS_SCENARIOS)


def _logs(run):
    return [entry for entry in run["log"] if "loss" in entry]


def test_golden_runs_exercise_each_method(golden, golden_two):
    """The recorded runs are not degenerate: every method's mechanism acted on them (else matching them would prove
    little about it)."""
    for name, run in list(golden["runs"].items()) + [
        (f"{n} (rank {r})", ranks[r]) for n, ranks in golden_two["runs"].items() for r in (0, 1)
    ]:
        logs = _logs(run)
        assert len(run["steps"]) == 2 and len(logs) == 2, name
        assert all(log["grad_norm"] > 0 for log in logs), name  # both steps trained
        method = name.split("/")[0]
        if method == "cue_grpo":  # the partition split positive sets and reweighted them
            assert any(log.get("cue/weight_spread", 0) > 0 for log in logs), name
        if method == "oppo":  # per-token advantages that vary along a completion
            advantages = [row for step in run["steps"] for call in step["loss_calls"] for row in call["advantages"]]
            assert all(isinstance(row, list) for row in advantages), name
            assert any(len(set(row)) > 2 for row in advantages), name
        if method == "datpo":  # trees grew: more leaves than base rollouts, branches in the loss
            assert any(log["datpo/leaves_per_prompt"] > 4 for log in logs), name
            assert any(log["datpo/forks_per_rollout"] > 0 for log in logs), name
        if method == "srpo":  # reset groups formed from incorrect seeds, extra generation beyond the batch
            assert all(log["srpo/fallback_rate"] < 1 for log in logs), name
            rows = [sum(len(c["completion_ids"]) for c in step["loss_calls"]) for step in run["steps"]]
            assert all(len(step["generated"]) > n for step, n in zip(run["steps"], rows)), name


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_one_process_reproduces_golden_values(name, golden, tiny_model_path, tmp_path):
    fresh = run_scenario(SCENARIOS[name], tiny_model_path, str(tmp_path), golden["config_defaults"])
    problems = compare(golden["runs"][name], fresh)
    assert not problems, _report(name, problems, golden["environment"])


@pytest.mark.multiprocess
def test_two_processes_reproduce_golden_values(golden_two, tiny_model_path, tmp_path):
    defaults_file = tmp_path / "config_defaults.json"
    defaults_file.write_text(json.dumps(golden_two["config_defaults"]))
    run_torchrun(TWO_PROCESS_SCRIPT, tiny_model_path, str(tmp_path), str(defaults_file), nproc=2)
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 for r in ranks)
    problems = []
    for name in TWO_PROCESS_SCENARIOS:
        for rank in (0, 1):
            found = compare(golden_two["runs"][name][rank], ranks[rank]["runs"][name], f"{name}/rank{rank}")
            problems.extend(found)
    assert not problems, _report("2 processes", problems, golden_two["environment"])
