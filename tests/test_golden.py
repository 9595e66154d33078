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

Two exceptions let the files hold on any CPU of the recording machine's kind (same versions, other kernels):
- ``grad_norm`` within rtol 1e-5 (record.GRAD_NORM_RTOL): a norm over every gradient coordinate, reduced in an
  order the CPU's vector kernels decide (measured 1.2e-6 apart between two machines).
- OPPO's floats within NOISE_MARGIN (3) times their measured round-off band (tests/golden/noise.py). OPPO's
  evidence is a difference of two log-probs ~1000x smaller than they are on the tiny random model, so a one-ulp
  difference of a log-prob between two CPUs moves its advantages by ~1e-4 of their scale and its second step more.
  The band of each recorded quantity is its largest deviation over 4 reruns with o_t and s_t moved one ulp; the
  recording machine's values and a newer machine's were at most 0.4x the band apart for the advantages and 0.9x for
  any value beyond rtol 1e-6, and AVX2 / no-SIMD kernels on the newer one (ATEN_CPU_CAPABILITY,
  MKL_ENABLE_INSTRUCTIONS) at most 1.1x (a grad_norm).
  The margin keeps a 1e-3 change of any first-step advantage (advantages have unit std in their group) a failure:
  ``test_oppo_bands_still_catch_a_1e_3_change``.
"""

import copy
import json
import math

import pytest

from tests.golden.noise import is_sensitive
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
    # grad_norm: within rtol 1e-5, not beyond
    assert compare({"grad_norm": 0.8}, {"grad_norm": 0.8 * (1 + 5e-6)}) == []
    assert len(compare({"grad_norm": 0.8}, {"grad_norm": 0.8 * (1 + 2e-5)})) == 1
    # params/sum cancels (a sum near 0 of 44k parameters of size ~0.07): one-ulp differences of the parameters, which
    # another CPU's kernels give, add up to ~2^-24 sqrt(sum_of_squares) = 8.4e-7 in it, 2.3x its rtol 1e-6 here (the
    # 1.1e-6 an AMD EPYC gave against the Xeon that recorded srpo/dapo-self-lora). Admitted up to 16x that, no more.
    params = {"count": 44192, "sum": -0.3563696, "sum_of_squares": 197.4}
    assert compare({"params": params}, {"params": {**params, "sum": -0.3563685}}) == []
    assert compare({"params": params}, {"params": {**params, "sum": -0.3563696 + 1.3e-5}}) == []
    assert len(compare({"params": params}, {"params": {**params, "sum": -0.3563696 + 1.5e-5}})) == 1
    assert len(compare({"params": params}, {"params": {**params, "sum_of_squares": 197.4 * (1 + 2e-6)}})) == 1
    # A measured band admits NOISE_MARGIN times itself for every value of its quantity, keyed below the given path.
    bands = {"/adv": 1e-4}
    assert compare(golden, {**golden, "adv": [0.5 + 2.9e-4, -1.25 - 2.9e-4]}, bands=bands) == []
    assert len(compare(golden, {**golden, "adv": [0.5 + 3.1e-4, -1.25]}, bands=bands)) == 1
    assert compare(golden, {**golden, "adv": [0.5, -1.25 + 2.9e-4]}, "run/rank0", bands=bands) == []
    assert len(compare(golden, {**golden, "ids": [[5, 8, 2]]}, bands={"/ids": 10.0})) == 1  # integers stay exact


def test_golden_files_hold_the_harness_scenarios(golden, golden_two):
    # Editing a scenario (or the shared settings) without regenerating would compare different runs.
    assert golden["settings"] == scenario_settings(SCENARIOS), "scenarios changed: the golden file is stale"
    assert golden_two["settings"] == scenario_settings(TWO_PROCESS_SCENARIOS), "2-process scenarios changed"
    assert set(golden["runs"]) == set(SCENARIOS) and set(golden_two["runs"]) == set(TWO_PROCESS_SCENARIOS)
    # Round-off bands were measured for exactly the sensitive scenarios (each rank's in 2 processes).
    assert set(golden["noise"]) == {name for name in SCENARIOS if is_sensitive(name)}
    assert set(golden_two["noise"]) == {name for name in TWO_PROCESS_SCENARIOS if is_sensitive(name)}
    assert all(len(golden_two["noise"][name]) == 2 for name in golden_two["noise"])


def _sensitive_runs(golden, golden_two):
    """(label, golden run, its bands) of every run with measured round-off bands, each rank of 2 processes too."""
    runs = [(name, golden["runs"][name], bands) for name, bands in golden["noise"].items()]
    runs += [(f"{name} (rank {rank})", golden_two["runs"][name][rank], ranks[rank])
             for name, ranks in golden_two["noise"].items() for rank in (0, 1)]
    return runs


def test_oppo_bands_still_catch_a_1e_3_change(golden, golden_two):
    """The round-off bands do not hide a real change: moving any one advantage of a first step by 1e-3 (its group
    has unit std, so 1e-3 of it) fails the comparison (bands up to 2.5e-4 there). The second step's values inherit
    the first step's round-off through the update and are pinned more loosely (measured bands up to 3.2e-3 in one
    process, 2.5e-2 in two): there a change of 0.1 fails. The first step's advantages, computed from the recorded
    initial model, carry the check of OPPO's arithmetic; the second step's token ids stay exact."""
    for label, run, bands in _sensitive_runs(golden, golden_two):
        assert bands, label
        for step, change in ((0, 1e-3), (1, 1e-1)):
            advantages = run["steps"][step]["loss_calls"][0]["advantages"]
            for row, values in enumerate(advantages):
                for token in range(len(values)):
                    changed = copy.deepcopy(run)
                    changed["steps"][step]["loss_calls"][0]["advantages"][row][token] += change
                    found = compare(run, changed, bands=bands)
                    assert len(found) == 1 and f"advantages[{row}][{token}]" in found[0], (label, step, row, token)


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
    problems = compare(golden["runs"][name], fresh, bands=golden["noise"].get(name))
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
            bands = golden_two["noise"][name][rank] if name in golden_two["noise"] else None
            found = compare(golden_two["runs"][name][rank], ranks[rank]["runs"][name], f"{name}/rank{rank}", bands)
            problems.extend(found)
    assert not problems, _report("2 processes", problems, golden_two["environment"])
