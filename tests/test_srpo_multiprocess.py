import json

import pytest

from tests.mp import run_torchrun


@pytest.mark.multiprocess
@pytest.mark.parametrize("reset", ["self", "oracle"])
def test_srpo_two_processes_with_different_seed_rounds(reset, tiny_model_path, tmp_path):
    run_torchrun("tests/mp_scripts/srpo_two_processes.py", tiny_model_path, str(tmp_path), reset, timeout=300)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    for report in reports:
        assert report["world"] == 2 and report["steps"] == 2
        # One prompt per process: rank 0's reset group falls back, rank 1's has a seed -> 1 of 2 reset groups.
        assert report["fallback_rate"] == [0.5, 0.5]
        # Rank 0 needed all 3 rounds; rank 1 (done after round 1) joined rounds 2 and 3 with zero rows.
        assert report["seed_rounds"] == [3.0, 3.0]
        for log in report["logs"]:
            # Quality against the checker (last thought wrong): every prefix clean; the oracle resets there exactly.
            assert log["srpo/localization_clean_rate"] == 1.0
            if reset == "oracle":
                assert log["srpo/localization_exact_rate"] == 1.0 and log["srpo/oracle_miss_rate"] == 0.0
            elif "srpo/localization_source/scored" in log:  # rank 1's seeds were scored, none drawn at random
                assert log["srpo/localization_source/scored"] == 1.0
        if reset == "self":  # the scored pass ran (rank 0 with zero rows joined it)
            assert any("srpo/localization_source/scored" in log for log in report["logs"])
    assert reports[0]["logs"] == reports[1]["logs"]  # metrics are summed over both processes
