import json

import pytest

from tests.mp import run_torchrun


@pytest.mark.multiprocess
def test_grpo_runs_in_two_cpu_processes(tiny_model_path, tmp_path):
    run_torchrun("tests/mp_scripts/grpo_two_processes.py", tiny_model_path, str(tmp_path))
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert all(r["world"] == 2 and r["steps"] == 2 for r in reports)
