"""OPPOTrainer in 2 CPU processes (torchrun, gloo): it trains, and groups spanning both processes get the same
advantages as in 1 process (per-group normalization statistics are gathered across processes)."""

import json
from pathlib import Path

import pytest

from tests.mp import run_torchrun

SCRIPT = "tests/mp_scripts/oppo_two_processes.py"


def _reports(out_dir, world):
    return [json.loads((Path(out_dir) / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.fixture(scope="module")
def two_process_run(tiny_model_path, tmp_path_factory):
    # 3 prompts x 4 generations = 12 rows per step; 6 rows per process, so the second group (rows 4-7) spans both.
    out = str(tmp_path_factory.mktemp("oppo_two"))
    run_torchrun(SCRIPT, tiny_model_path, out, "deterministic", "6")
    return _reports(out, 2)


@pytest.mark.multiprocess
def test_oppo_trains_two_steps_in_two_processes(two_process_run):
    reports = two_process_run
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["world"] == 2 and r["steps"] == 2 for r in reports)
    for r in reports:
        assert len([m for m in r["metrics"] if "oppo/value_mean" in m]) == 2
    # Metrics are reduced over processes before logging: both ranks log the same numbers.
    assert reports[0]["metrics"] == reports[1]["metrics"]


@pytest.mark.multiprocess
def test_two_processes_give_the_same_advantages_as_one(two_process_run, tiny_model_path, tmp_path):
    run_torchrun(SCRIPT, tiny_model_path, str(tmp_path), "deterministic", "12", nproc=1)
    one = _reports(tmp_path, 1)
    assert len(one) == 1 and one[0]["world"] == 1
    rows_one = sorted(one[0]["rows"], key=lambda r: r["row"])
    rows_two = sorted([row for r in two_process_run for row in r["rows"]], key=lambda r: r["row"])
    assert [r["row"] for r in rows_one] == [r["row"] for r in rows_two] == list(range(12))
    assert [r["prompt"] for r in rows_one] == [r["prompt"] for r in rows_two]
    assert [r["completion"] for r in rows_one] == [r["completion"] for r in rows_two]
    # reward_funcs=[accuracy-like, format-like]; rows no function scores get exactly 0 on every token
    assert any(r["unscorable"] for r in rows_two) and not all(r["unscorable"] for r in rows_two)
    assert all(a == 0.0 for r in rows_two if r["unscorable"] for a in r["advantages"])
    spanning = [r for r in rows_two if 4 <= r["row"] < 8]
    assert any(abs(a) > 1e-2 for r in spanning for a in r["advantages"]), "the spanning group has zero advantages"
    for a, b in zip(rows_one, rows_two):
        # Batches padded to other widths change float32 log-probs by ~1e-6, which the group normalization divides
        # by a small std; a group normalized per process instead of globally would be off by O(0.1-1).
        assert a["advantages"] == pytest.approx(b["advantages"], abs=1e-3)
