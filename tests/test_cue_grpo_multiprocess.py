"""CueGRPOTrainer in 2 CPU processes (torchrun, gloo) with a group of 4 split 2 + 2 across processes: it trains,
and its advantages equal those of a 1-process run on the same (deterministic) generations."""

import glob
import json
import os

import pytest

from tests.mp import run_torchrun


def _results(model_path, out_dir, nproc):
    os.makedirs(out_dir)
    run_torchrun("tests/mp_scripts/cue_grpo_equivalence.py", model_path, out_dir, nproc=nproc)
    reports = [json.load(open(path)) for path in sorted(glob.glob(os.path.join(out_dir, "result_*.json")))]
    assert len(reports) == 3 * nproc
    by_partition = {}
    for report in reports:
        assert report["world"] == nproc and report["steps"] == 2
        # The credit got TRL's advantages of every row without a gather (the core's restatement of TRL's formula,
        # with this process's slice TRL's own): the restatement agreed with TRL here, and (below) every process holds
        # the same values, so each process's restated slice of the others' rows is what TRL gave those processes.
        assert report["restated_as_trl"]
        for everyone, own in report["trl_rows"]:
            assert len(everyone) == 4 and everyone[report["rank"] * len(own):][:len(own)] == own
        rows = by_partition.setdefault(report["partition"], {})
        for step, row, text_index, advantage in report["records"]:
            rows[(step, row)] = (text_index, advantage)
    for partition in {report["partition"] for report in reports}:
        everyones = [[everyone for everyone, _ in report["trl_rows"]] for report in reports
                     if report["partition"] == partition]
        assert all(values == everyones[0] for values in everyones)
    return by_partition


@pytest.mark.multiprocess
def test_two_processes_equal_one_process(tiny_model_path, tmp_path):
    two = _results(tiny_model_path, str(tmp_path / "two"), 2)
    one = _results(tiny_model_path, str(tmp_path / "one"), 1)
    assert set(two) == set(one) == {"cue", "random", "callable"}
    for partition in one:
        assert len(one[partition]) == 8  # 2 steps x 4 rows
        assert two[partition].keys() == one[partition].keys()
        for key, (text_index, advantage) in one[partition].items():
            assert two[partition][key][0] == text_index
            assert two[partition][key][1] == pytest.approx(advantage, rel=1e-6, abs=1e-7), (partition, key)

    # Hand check of the cue run: each group holds A, A, B (correct) and D (incorrect), in some order.
    # TRL: rewards [1,1,1,0], mean 0.75, unbiased std 0.5 -> A+ = 0.25/0.5001, A- = -0.75/0.5001.
    # Cue-GRPO: conclude in 3 of 3 > 2.25 suppressed; clusters {A, A}, {B}; lengths all 2 (median 2, no reset).
    # s = 2^-0.8, 1; mean = (2*0.574349 + 1)/3 = 0.716233 -> 0.801904, 1.396194; delta = 1.05 - 0.801904.
    s2 = 2**-0.8
    mean = (2 * s2 + 1) / 3
    delta = 1.05 - s2 / mean
    expected = {0: 0.25 / 0.5001 * 1.05, 1: 0.25 / 0.5001 * 1.05, 2: 0.25 / 0.5001 * (1 / mean + delta),
                3: -0.75 / 0.5001}
    assert expected[2] == pytest.approx(0.49990 * 1.644290, abs=1e-5)
    for partition in ("cue", "callable"):  # the callable reproduces the cue clusters (no singleton reset needed)
        for key, (text_index, advantage) in two[partition].items():
            assert advantage == pytest.approx(expected[text_index], rel=1e-5), (partition, key)
