"""benchmarks/cost/srpo_token_ratio.py's pure helpers: the token shares read off the logged metrics, the modelled shares,
and the summary of logged runs (hand-worked numbers)."""

import json
import os
import sys

import pytest

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)

import srpo_token_ratio as ratio  # noqa: E402

SPLIT = dict(num_generations=8, suffixes=4, max_seed_rounds=4)


def step(total, paper, vs_base, **factors):
    return {ratio.RATIO: total, ratio.PAPER: paper, ratio.BASE: vs_base, **factors}


def test_shares_split_the_ratio_into_base_seed_and_suffix():
    # 2 prompts x G=8, iid length 10 -> a GRPO step of 160 tokens. Base 2 x 4 x 10 = 80, seed candidates 30,
    # suffixes 50: generated 160 -> tokens_vs_grpo 1.0, paper (80 + 50) / 160 = 0.8125, tokens_vs_base 160 / 80 = 2.
    out = ratio.shares(step(1.0, 0.8125, 2.0))
    assert out == pytest.approx(dict(base=0.5, seed=30 / 160, suffix=50 / 160))
    assert ratio.shares({ratio.RATIO: 1.0}) is None  # a step that logged no split


def test_expected_candidates_one_per_round_until_a_failure():
    # p = 0.5, at most 4 rounds: 1 + 0.5 + 0.25 + 0.125
    assert ratio.expected_candidates(0.5, 4) == pytest.approx(1.875)
    assert ratio.expected_candidates(0.0, 4) == 1  # the first candidate always fails
    assert ratio.expected_candidates(1.0, 3) == 3  # never fails: every round runs


def test_modelled_shares():
    s = {"srpo/base_pass_rate": 0.5, "srpo/fallback_rate": 0.25, "srpo/reset_position": 0.4}
    out = ratio.modelled_shares(s, SPLIT)
    # seed 1.875 / 8; suffix 4 / 8 x 0.75 x 0.6
    assert out == pytest.approx(dict(seed=0.234375, suffix=0.225))
    # every reset group fell back: no reset position logged, no suffix tokens
    assert ratio.modelled_shares({"srpo/base_pass_rate": 1.0, "srpo/fallback_rate": 1.0}, SPLIT)["suffix"] == 0
    assert ratio.modelled_shares({"srpo/fallback_rate": 0.0}, SPLIT) is None


def test_statistics():
    assert ratio.sd([1.0, 3.0]) == pytest.approx(2 ** 0.5)
    assert ratio.sd([1.0]) is None
    assert ratio.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert ratio.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert ratio.pearson([1, 2, 3], [5, 5, 5]) is None  # constant side
    assert ratio.pearson([1, None, 3, 4], [1, 9, 3, 5]) == pytest.approx(ratio.pearson([1, 3, 4], [1, 3, 5]))
    assert ratio.quantiles([1, 2, 3, 4], (0.0, 0.5, 1.0)) == [1, 2.5, 4]


def test_summary_of_logged_runs(tmp_path):
    # Two seeds of srpo (tiny-grid layout: "logs"), one of rrpo (learning layout: "reward_curve"), and files that are
    # not SRPO-family runs or have no token metric.
    srpo0 = [step(1.0, 0.75, 2.0, **{"srpo/reset_position": 0.5}), step(1.2, 0.95, 2.4, **{"srpo/reset_position": 0.1})]
    srpo1 = [step(0.9, 0.7, 1.8, **{"srpo/reset_position": 0.6})]
    files = {"srpo_seed0.json": {"logs": srpo0}, "srpo_seed1.json": {"logs": srpo1},
             "rrpo_seed3.json": {"reward_curve": [step(1.1, 0.8, 2.2)]},
             "grpo_seed0.json": {"logs": [step(9, 9, 9)]}, "srpo_oracle_seed0.json": {"logs": [{"loss": 1.0}]}}
    for name, payload in files.items():
        (tmp_path / name).write_text(json.dumps(payload))
    (tmp_path / "srpo_seed2.json").write_text("{not json")  # a run being written: skipped
    runs = ratio.load_logged_runs(str(tmp_path))
    assert sorted(runs) == ["rrpo", "srpo"]
    out = ratio.summarize_method(runs["srpo"], SPLIT)
    t = out["tokens_vs_grpo"]
    # seed means 1.1 (seed 0) and 0.9 (seed 1): mean 1.0, sd 0.1414; steps 0.9 .. 1.2
    assert t["mean_over_seeds"] == pytest.approx(1.0)
    assert t["sd_over_seeds"] == pytest.approx(0.02 ** 0.5)
    assert (t["step_min"], t["step_max"]) == (0.9, 1.2)
    assert out["paper_tokens_vs_grpo"]["mean_over_seeds"] == pytest.approx((0.85 + 0.7) / 2)
    # by step: step 1 over both seeds, step 2 only seed 0
    assert [s["tokens_vs_grpo"] for s in out["by_step"]] == pytest.approx([0.95, 1.2])
    # shares: base = ratio / vs_base = 0.5 on every step; seed = ratio - paper: 0.25, 0.25, 0.2
    assert out["shares"]["base"] == pytest.approx(0.5)
    assert out["shares"]["seed"] == pytest.approx(0.7 / 3)
    # the ratio falls as the reset position rises on these three steps: r < 0
    assert out["correlation_over_steps"]["tokens_vs_grpo"]["reset_position"] < -0.9


def test_cli_refuses_oracle_without_the_checker_and_an_empty_call(capsys):
    with pytest.raises(SystemExit):
        ratio.main(["--measure", "--resets", "oracle"])
    assert "--resets oracle needs the chain step checker" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ratio.main([])
    assert "nothing to do" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ratio.main(["--logs", "/nonexistent/folder"])
    assert "--logs /nonexistent/folder" in capsys.readouterr().err


def test_measured_summary_pairs_first_batches_by_seed():
    def row(seed, reset, batch, total, position):
        r = {"seed": seed, "reset": reset, "batch": batch, ratio.RATIO: total, ratio.PAPER: total - 0.3,
             ratio.BASE: 2 * total, "srpo/reset_position": position}
        r["shares"] = ratio.shares(r)
        return r

    rows = [row(0, "self", 1, 1.2, 0.1), row(0, "self", 2, 1.0, 0.5), row(0, "random", 1, 1.0, 0.4),
            row(0, "random", 2, 0.8, 0.6), row(1, "self", 1, 1.1, 0.2), row(1, "random", 1, 1.05, 0.3)]
    out = ratio.measured_summary(rows, ["self", "random"])
    # self: seed means 1.1 (seed 0) and 1.1 (seed 1): sd 0; batches 1.0 .. 1.2
    assert out["self"]["tokens_vs_grpo"]["mean_over_seeds"] == pytest.approx(1.1)
    assert out["self"]["tokens_vs_grpo"]["sd_over_seeds"] == pytest.approx(0.0)
    assert (out["self"]["tokens_vs_grpo"]["batch_min"], out["self"]["tokens_vs_grpo"]["batch_max"]) == (1.0, 1.2)
    # random minus self on the first batches: 1.0 - 1.2 and 1.05 - 1.1
    paired = out["random"]["first_batch_minus_self"]
    assert paired["values"] == pytest.approx([-0.2, -0.05])
    assert paired["mean"] == pytest.approx(-0.125)
    assert "first_batch_minus_self" not in out["self"]


def test_cli_reuses_an_earlier_measurement(tmp_path, capsys):
    row = {"seed": 0, "reset": "self", "batch": 1, ratio.RATIO: 1.1, ratio.PAPER: 0.8, ratio.BASE: 2.2}
    row["shares"] = ratio.shares(row)
    settings = dict(task="arithmetic", seeds=[0], resets=["self"], batches=1, prompts=2, tokens=64, threads=1)
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(dict(settings=settings, measured=dict(batches=[row]))))
    out = tmp_path / "out.json"
    payload = ratio.main(["--measured-json", str(earlier), "--output", str(out)])
    assert payload["measured"]["summary"]["self"]["tokens_vs_grpo"]["mean_over_seeds"] == pytest.approx(1.1)
    assert json.loads(out.read_text())["settings"]["seeds"] == [0]
    with pytest.raises(SystemExit):
        ratio.main(["--measure", "--measured-json", str(earlier)])
    assert "give one of them" in capsys.readouterr().err
