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


# Scored localization in 2 processes (one prefix pass per chain): per call, the chains of rank 0 and of rank 1.
_CHAIN_A = ("What is 3 + 4?", ["we add", "the numbers", "then check", "so 7"], False)
_CHAIN_B = ("What is 12 * 3 - 5?", ["compute 12 * 3 = 36", "subtract 5", "so 31"], False)
_CHAIN_C = ("Let x = 2. What is x^2?", ["x^2 = 4", "so 4", "done", "we check", "it holds", "final"], False)
LOCALIZATION_CALLS = [
    [[_CHAIN_A], [_CHAIN_B, _CHAIN_C, _CHAIN_A]],
    [[], [_CHAIN_C, _CHAIN_B]],  # rank 0 has nothing to score and still joins the call
]


def localization_trainer(model_dir, out_dir):
    from trl_credit import SRPOConfig, SRPOTrainer
    from trl_credit.tasks.data import make_arithmetic_dataset

    args = SRPOConfig(output_dir=out_dir, per_device_train_batch_size=8, num_generations=8, max_completion_length=8,
                      thought_delimiter=" ", rollout_template="{question}", temperature=0.7,
                      localization_template="{question}\n{steps}\n1-{num_steps}?", report_to="none", use_cpu=True,
                      save_strategy="no")
    return SRPOTrainer(model=model_dir, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                       train_dataset=make_arithmetic_dataset(num_train=8, num_test=2)["train"])


@pytest.mark.multiprocess
def test_scored_localization_two_processes_equal_one_process(tiny_model_path, tmp_path):
    from trl_credit.core.context import BatchContext
    from trl_credit.srpo.localize import _prefix_can_be_shared, answer_scores
    from trl_credit.srpo.step_metrics import StepStats

    run_torchrun("tests/mp_scripts/srpo_localization_scores.py", tiny_model_path, str(tmp_path), timeout=300)
    reports = [json.loads((tmp_path / f"scores_rank{rank}.json").read_text()) for rank in (0, 1)]
    trainer = localization_trainer(tiny_model_path, str(tmp_path / "one"))
    ctx = BatchContext.for_trainer(trainer)  # what the localization gets inside a generation batch
    assert _prefix_can_be_shared(ctx)
    for report in reports:
        assert report["world"] == 2 and report["shared"]  # the one-pass path ran in both processes
        for call, got in zip(LOCALIZATION_CALLS, report["calls"]):
            stats = StepStats()
            expected = answer_scores(ctx, call[report["rank"]], stats)
            assert len(got["scores"]) == len(expected)
            for a, b in zip(got["scores"], expected):
                assert a == pytest.approx(b, abs=1e-5)
            assert got["tokens"] == stats.localization_forward_tokens
    assert reports[0]["calls"][1] == {"scores": [], "tokens": 0}
