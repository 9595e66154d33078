"""The tool regime's runner (trl_credit/testbed/tool_runner.py) and its grid's summary (benchmarks/tools/): one
training step through TRL's tool loop counted and measured, every grid method configured, the sweep's rate choice and
the claims table on hand-made runs."""

import json
import math

import pytest

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)
import tool_grid
import tool_summary
from trl_credit.testbed import tool_runner


def test_one_step_counts_the_models_tokens_and_measures_the_end():
    captured = []

    def record_rollouts(trainer):
        generate_and_score = trainer._generate_and_score_completions

        def wrapped(inputs):
            out = generate_and_score(inputs)
            # the model's tokens of the batch: its completion tokens (padding out) that are not tool results
            captured.append(int((out["completion_mask"] * out["tool_mask"]).sum()))
            return out

        trainer._generate_and_score_completions = wrapped

    result = tool_runner.run_tools("grpo", 0, 3e-4, steps=1, eval_samples=2, eval_rows=4, greedy_rows=8,
                                   on_trainer=record_rollouts)
    # every generate call counted to its EOS is what TRL's batch holds as model tokens (tool results not generated)
    assert captured and result["generated_tokens"] == sum(captured)
    assert result["generate_calls"] >= 5  # the first turn, then a tool-loop round per call (4-7 calls)
    final = result["final"]
    assert len(final["greedy_correct"]) == 8 and final["greedy_accuracy"] == sum(final["greedy_correct"]) / 8
    assert len(final["correct_per_row"]) == 4 and all(0 <= c <= 2 for c in final["correct_per_row"])
    assert final["pass_at_k"][1] == pytest.approx(final["accuracy"])
    # one batch of 4 groups of 8: the all-fail share is a multiple of 1/4
    assert len(result["train_all_fail_share"]) == 1 and result["train_all_fail_share"][0] * 4 in (0, 1, 2, 3, 4)


@pytest.mark.parametrize("method", tool_runner.TOOL_METHODS)
def test_every_grid_method_builds_its_config(method, tmp_path):
    spec = tool_runner.tool_method_spec(method)
    from trl_credit.testbed.runner import method_fields

    fields = dict(tool_runner.TOOL_SHARED, output_dir=str(tmp_path), use_cpu=True, report_to="none")
    fields.update(method_fields(spec, 3e-4))
    fields["per_device_train_batch_size"] = tool_runner.TOOL_PROMPTS_PER_STEP * fields["num_generations"]
    config = spec["config"](**fields)
    assert config.max_tool_calling_iterations == tool_runner.MAX_TOOL_CALLS
    if hasattr(config, "success_reward"):  # the verifier is the environment's reward, not the format reward
        assert config.success_reward == "KeyChainEnvironment"


def test_unknown_method_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown tool regime method 'ppo'.*grpo"):
        tool_runner.tool_method_spec("ppo")


def _run(method, seed, rate, greedy, t1, pass8, tokens=1000):
    return dict(method=method, seed=seed, learning_rate=rate, generated_tokens=tokens, train_cpu_seconds=1.0,
                final=dict(greedy_accuracy=greedy, accuracy=t1, pass_at_k={"8": pass8}, all_fail_share=0.0))


def test_the_sweep_chooses_the_best_mean_on_the_seeds_run_at_every_rate():
    sweep = [_run("grpo", 100, 3e-4, 0, 0.40, 0), _run("grpo", 101, 3e-4, 0, 0.50, 0),
             _run("grpo", 100, 6e-4, 0, 0.60, 0),  # seed 101 missing at 6e-4: only seed 100 compares
             _run("oppo", 100, 3e-4, 0, 0.30, 0), _run("oppo", 100, 6e-4, 0, 0.20, 0)]
    choices = tool_grid.chosen_rates(sweep)
    assert choices["grpo"]["rate"] == 6e-4 and choices["grpo"]["seeds"] == [100]  # 0.60 > 0.40 on seed 100
    assert choices["oppo"]["rate"] == 3e-4


def test_the_sweep_table_rounds_the_mean_once():
    # DATPO's 3e-4 sweep: T=1 0.43359375, 0.521484375, 0.462890625, 0.4921875 -> mean 0.4775390625, which reads
    # 0.478; rounding the mean to 4 places first (0.4775) and then to 3 printed 0.477
    sweep = [_run("datpo", 100 + i, 3e-4, 0, t1, 0) for i, t1 in enumerate([0.43359375, 0.521484375, 0.462890625,
                                                                          0.4921875])]
    table = tool_summary.sweep_table(tool_grid.chosen_rates(sweep))
    assert "| datpo | 100, 101, 102, 103 | 0.478 | 0.0003 |" in table


def test_the_claims_pair_by_seed_and_count_the_family():
    runs = tool_summary.by_method([
        _run("grpo", 0, 3e-4, 0.40, 0.40, 0.6, tokens=1000), _run("grpo", 1, 3e-4, 0.50, 0.45, 0.7, tokens=1000),
        _run("grpo", 2, 3e-4, 0.30, 0.40, 0.6, tokens=1000),
        _run("process", 0, 3e-4, 0.50, 0.40, 0.6, tokens=1500), _run("process", 1, 3e-4, 0.60, 0.45, 0.7, tokens=500),
        _run("process", 2, 3e-4, 0.40, 0.40, 0.6, tokens=1000)])
    rows = tool_summary.claims(runs)
    greedy = next(r for r in rows if r["metric"] == "greedy")
    assert greedy["diffs"] == pytest.approx([0.1, 0.1, 0.1]) and greedy["seeds"] == [0, 1, 2]
    assert greedy["token_ratio"] == pytest.approx((1.5 + 0.5 + 1.0) / 3)
    table, counts = tool_summary.claims_table(rows)
    # greedy: +0.1 on every seed (no spread: p = 0) survives; T=1 and pass@8: no difference (p = 1)
    assert counts == dict(comparisons=3, significant_unadjusted=1, surviving_holm=1)
    assert "| process | greedy | 3 | +0.100" in table and "higher than GRPO; survives Holm" in table
    assert "not shown (MDE" in table


def test_a_method_with_one_paired_seed_shows_its_difference_without_an_interval():
    # the first seed of a method (a sweep's): the difference, no "± nan", and no test
    runs = tool_summary.by_method([_run("grpo", 0, 3e-4, 0.40, 0.40, 0.6), _run("srpo", 0, 3e-4, 0.55, 0.30, 0.6)])
    table, counts = tool_summary.claims_table(tool_summary.claims(runs))
    assert "| srpo | greedy | 1 | +0.150 | not tested (fewer than 2 paired seeds) |" in table
    assert "nan" not in table and counts["comparisons"] == 0


def test_the_training_all_fail_share_is_given_only_for_one_reward_call_a_step():
    grpo, srpo = _run("grpo", 0, 3e-4, 0.4, 0.4, 0.6), _run("srpo", 0, 3e-4, 0.4, 0.4, 0.6)
    grpo.update(settings=dict(steps=5), train_all_fail_share=[0.5, 0.5, 0.25, 0.0, 0.0])
    srpo.update(settings=dict(steps=2), train_all_fail_share=[0.0, 1.0, 0.0, 0.0, 0.5])  # seed candidates' calls too
    table = tool_summary.levels_table(tool_summary.by_method([grpo, srpo]))
    assert "| 0.500 -> 0.000 |" in table  # GRPO: its first and last fifth of 5 batches
    assert "| - (2.5 reward calls a step) |" in table


def test_a_grid_run_is_saved_then_skipped(tmp_path, monkeypatch):
    # the trainer's settings travel as "config": "settings" is the grid's own (what a resumed run must match)
    monkeypatch.setattr(tool_runner, "evaluate_tools", lambda model, test, **kw: dict(greedy_accuracy=0.5))
    job = dict(method="grpo", learning_rate=3e-4, seed=5, settings=dict(steps=1, eval_samples=2, eval_rows=2),
               path=str(tmp_path / "sweep" / "grpo.json"))
    saved = tool_grid.one_run(job)
    assert saved["settings"] == job["settings"] and saved["config"]["learning_rate"] == 3e-4
    assert saved["cpu"] == tool_grid.cpu_model()  # where its CPU seconds were measured (tool_summary.cost)
    assert tool_grid._done(job)
    assert not tool_grid._done(dict(job, settings=dict(job["settings"], steps=2)))  # other settings: redone


def test_the_grid_cost_prefers_measured_runs_and_scales_short_ones():
    def run(method, steps, train, evaluation, **extra):
        return dict(method=method, settings=dict(steps=steps), train_cpu_seconds=train, eval_cpu_seconds=evaluation,
                    **extra)

    runs = [run("grpo", 120, 400.0, 50.0), run("grpo", 120, 600.0, 70.0),
            run("grpo", 120, 9999.0, 9999.0, from_pilot="pilot_long/"),  # its evaluations: a curve's
            run("grpo", 30, 1.0, 1.0),  # a 120-step measurement exists: not used
            run("grpo", 120, 1000.0, 120.0, cpu="AMD EPYC"),  # another CPU: only its ratio, 1120 / 560
            run("grpo", 120, 400.0, 50.0, cpu=tool_summary.REFERENCE_CPU),  # recorded as the reference: counted
            run("datpo", 30, 600.0, 80.0)]
    costs = tool_summary.cost(runs, sweep_runs=8)
    reference = (450 + 670 + 450) / 3  # the reference CPU's 120-step runs, training + evaluation
    assert costs["grpo"] == pytest.approx(dict(steps=120, run_cpu_seconds=reference, measured_at_steps=True,
                                               grid_cpu_hours=reference * 24 / 3600, other_cpu_ratio=1120 / reference))
    # 30-step training x 4 plus one final evaluation: 2480 s, 24 runs
    assert costs["datpo"] == pytest.approx(dict(steps=120, run_cpu_seconds=2480, measured_at_steps=False,
                                                grid_cpu_hours=2480 * 24 / 3600))
    assert costs["total_cpu_hours"] == pytest.approx((reference + 2480) * 24 / 3600)


def test_the_grid_cost_rounds_once_in_the_table():
    # 24 runs a method (8 sweep + 16 reported): 3.825 s a run is 0.0255 CPU h, 3.21 s is 0.0214; together 0.0469 h.
    # Rounding each to 2 places first (0.03 + 0.02 = 0.05) would print 0.1; once, 0.0. 3.825 s is 0.06375 min: 0.1.
    runs = [dict(method=method, settings=dict(steps=120), train_cpu_seconds=seconds, eval_cpu_seconds=0.0)
            for method, seconds in (("grpo", 3.825), ("process", 3.21))]
    costs = tool_summary.cost(runs, sweep_runs=8)
    assert costs["grpo"]["grid_cpu_hours"] == pytest.approx(0.0255)
    assert costs["process"]["run_cpu_seconds"] == pytest.approx(3.21)
    assert costs["total_cpu_hours"] == pytest.approx(0.0469)
    table = tool_summary.cost_table(costs)
    assert "| grpo | 120 | 0.1 | 0.0 | measured |" in table  # 0.0255 h: 0.0 at one place
    assert "All methods: 0.0 CPU hours" in table


def test_the_levels_table_orders_a_methods_rates_as_numbers():
    runs = [_run("prime", 100, rate, 0.3, 0.3, 0.6) for rate in (1e-4, 5e-5, 2e-4)]
    runs.append(_run("grpo", 100, 3e-4, 0.6, 0.6, 0.9))
    for run in runs:
        run.update(train_all_fail_share=[0.5])
    table = tool_summary.levels_table(tool_summary.by_method_rate(runs))
    rows = [line.split(" | ")[0] for line in table.splitlines()[2:]]
    # as strings "prime (0.0001)" < "prime (0.0002)" < "prime (5e-05)"; as rates 5e-05 comes first
    assert rows == ["| grpo (0.0003)", "| prime (5e-05)", "| prime (0.0001)", "| prime (0.0002)"]


def test_the_training_all_fail_share_by_fifths():
    shares = [1.0] * 2 + [0.5] * 6 + [0.0] * 2  # 10 groups: fifths of 2
    assert tool_summary._fifth(shares, last=False) == 1.0 and tool_summary._fifth(shares, last=True) == 0.0
    assert tool_summary._fifth([0.25, 0.75], last=True) == 0.75  # under 5 groups: the last one


def test_the_edge_by_trap_keys_beside_what_compounding_predicts():
    rows = [dict(traps=0, calls=4), dict(traps=1, calls=4), dict(traps=1, calls=5), dict(traps=2, calls=5)]

    def run(method, seed, greedy):
        return dict(method=method, seed=seed, final=dict(greedy_correct=greedy))

    runs = tool_summary.by_method([run("grpo", 0, [1, 1, 0, 0]), run("grpo", 1, [1, 0, 1, 0]),
                                   run("process", 0, [1, 1, 1, 1]), run("process", 1, [1, 1, 1, 0])])
    table = {r["value"]: r for r in tool_summary.by_chain(runs, rows, "process", "traps")}
    # one-trap chains: GRPO 0.5 on both seeds, process 1.0 on both: q = 0.5 and 1.0
    assert table[1]["edge"] == pytest.approx(0.5) and table[1]["compounding"] == pytest.approx(1.0 - 0.5)
    # two trap keys: compounding predicts 1.0^2 - 0.5^2 = 0.75; observed: seed 0 +1, seed 1 0 -> mean 0.5
    assert table[2]["compounding"] == pytest.approx(0.75) and table[2]["edge"] == pytest.approx(0.5)
    assert table[0]["edge"] == 0.0 and table[0]["chains"] == 1
    calls = {r["value"]: r for r in tool_summary.by_chain(runs, rows, "process", "calls")}
    assert calls[5]["edge"] == pytest.approx(((1 - 0) + (1 - 1) + (1 - 0) + (0 - 0)) / 4)  # seeds' means of 2 chains
    # by calls, each chain's prediction from its own trap keys: calls 5 holds a 1-trap (0.5) and a 2-trap (0.75) chain
    assert calls[5]["compounding"] == pytest.approx(0.625)
    # the excess, per seed then averaged: at 2 trap keys seed 0 +1 - 0.75, seed 1 0 - 0.75
    assert table[2]["excess_by_seed"] == pytest.approx([0.25, -0.75]) and table[2]["excess"] == pytest.approx(-0.25)
    assert table[1]["excess_by_seed"] == pytest.approx([0.0, 0.0])  # one-trap chains set q: no excess by construction
    # calls 4 (chains 0, 1): predicted (0 + 0.5) / 2 = 0.25; edges seed 0: 0, seed 1: 0.5 -> excess -0.25, +0.25
    # calls 5: edges 1 and 0 against 0.625 -> +0.375, -0.625; slopes over calls 4 -> 5: +0.625 and -0.875
    assert calls[4]["excess_by_seed"] == pytest.approx([-0.25, 0.25])
    slopes = tool_summary.growth(tool_summary.chain_tables(runs, rows))
    assert slopes["calls"]["slopes"] == pytest.approx([0.625, -0.875])
    # by trap keys 0, 1, 2 (x mean 1): excess 0, 0, +0.25 and 0, 0, -0.75 -> slopes 0.25 / 2 and -0.75 / 2
    assert slopes["traps"]["slopes"] == pytest.approx([0.125, -0.375])
    assert slopes["calls"]["p"] is not None and slopes["calls"]["adjusted_p"] >= slopes["calls"]["p"]


@pytest.mark.slow
def test_evaluating_during_training_changes_nothing_of_the_training():
    # the curve's evaluations draw from their own random state and their tokens are not the run's: the same rewards
    # at every step, the same tokens and the same end as a run evaluated only at its end
    small = dict(steps=3, eval_samples=2, eval_rows=4, greedy_rows=4)
    plain = tool_runner.run_tools("grpo", 1, 6e-4, **small)
    curved = tool_runner.run_tools("grpo", 1, 6e-4, eval_every=1, **small)
    assert [c["step"] for c in curved["curve"]] == [1, 2]
    assert curved["generated_tokens"] == plain["generated_tokens"]
    assert [log["reward"] for log in curved["logs"]] == [log["reward"] for log in plain["logs"]]
    assert curved["final"]["correct_per_row"] == plain["final"]["correct_per_row"]
    assert curved["curve"][0]["generated_tokens"] < curved["curve"][1]["generated_tokens"] < plain["generated_tokens"]


def test_datpo_trains_as_many_steps_as_generate_grpos_tokens(tmp_path, monkeypatch):
    # hand-made token rates: GRPO 3000 tokens in 30 steps (100 a step), DATPO's trees 7500 (250 a step): at 120 GRPO
    # steps (12000 tokens) DATPO trains 120 * 100 / 250 = 48 steps; every other method trains the grid's 120
    monkeypatch.setattr(tool_grid, "RESULTS", str(tmp_path))
    for method, tokens in (("grpo", 3000), ("datpo", 7500)):
        path = tool_grid.run_path("sweep_30steps", method, 3e-4, 100)
        (tmp_path / "sweep_30steps").mkdir(exist_ok=True)
        with open(path, "w") as f:
            json.dump(dict(settings=dict(steps=30), generated_tokens=tokens), f)
    jobs = []
    monkeypatch.setattr(tool_grid, "run_jobs", lambda todo, workers, **kw: jobs.extend(todo))
    tool_grid.main(["sweep", "--methods", "grpo", "datpo", "srpo", "--rates", "3e-4", "--seeds", "100",
                    "--steps", "120"])
    assert {job["method"]: job["settings"]["steps"] for job in jobs} == dict(grpo=120, datpo=48, srpo=120)
    # its cost is scaled to its own steps: 30-step training 600 s x 48 / 30 + one evaluation 80 s
    costs = tool_summary.cost([dict(method="datpo", settings=dict(steps=30), train_cpu_seconds=600.0,
                                    eval_cpu_seconds=80.0)], sweep_runs=8,
                              steps_of=lambda method: tool_grid.method_steps(method, 120))
    assert costs["datpo"]["steps"] == 48 and costs["datpo"]["run_cpu_seconds"] == 600 * 48 // 30 + 80
    (tmp_path / "sweep_30steps" / "datpo_lr0.0003_seed100.json").unlink()  # no measured rate: says which run to make
    with pytest.raises(SystemExit, match="sweep --methods grpo datpo --rates 3e-4 --seeds 100 --steps 30"):
        tool_grid.method_steps("datpo", 120)


def test_the_committed_token_rates_put_datpo_at_47_steps():
    # the first sweep's seed-100 runs at 3e-4: GRPO 130,841 tokens and DATPO 331,097 in 30 steps;
    # 120 * 130841 / 331097 = 47.42
    assert tool_grid.method_steps("datpo", 120) == 47
    assert tool_grid.method_steps("process", 120) == 120
