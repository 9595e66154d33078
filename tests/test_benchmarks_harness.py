"""The benchmark harness's pure helpers: SRPO token attribution by call order, and the Profiler's counters."""

import os
import sys

import pytest
import torch

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)

import harness  # noqa: E402


def test_srpo_token_breakdown_by_call_order():
    name = "srpo: generate_from_prefixes"
    # 2 prompts, 2 base rows + 1 seed candidate per prompt in call 1 (rows: b b c | b b c), lengths 5 6 7 | 8 9 10:
    # base = 5+6+8+9 = 28, round-1 candidates = 7+10 = 17. Call 2: a later seed round (3+4 = 7).
    # Call 3 greedy: localization (2). Call 4: suffixes (1+1+1 = 3).
    events = [
        (name, {}, [5, 6, 7, 8, 9, 10]),
        (name, {}, [3, 4]),
        (name, {"greedy": True, "max_new_tokens": 32}, [2]),
        (name, {}, [1, 1, 1]),
        ("generation", {}, [100]),  # other components are ignored
    ]
    out = harness.srpo_token_breakdown(events, num_groups=2, base_size=2, per_round=1)
    assert out == {
        "base rollouts": 28,
        "seed candidates (round 1)": 17,
        "seed candidates (later rounds)": 7,
        "localization (greedy)": 2,
        "suffixes": 3,
        "base_rows": 4,
    }


def test_profiler_counts_tokens_and_skips_grad_calls():
    profiler = harness.Profiler()

    def generate(rows):
        return [[0] * n for n in rows], None

    wrapped = profiler.timed("generation", generate, count_tokens=True)
    wrapped([3, 4])
    wrapped([5])
    assert profiler.tokens["generation"] == 12  # 3 + 4 + 5
    assert profiler.calls["generation"] == 2
    scoring = profiler.timed("logprobs", lambda: None, only_no_grad=True)
    scoring()  # grad enabled: a training forward, not counted
    with torch.no_grad():
        scoring()
    assert profiler.calls["logprobs"] == 1
    # rows scored per no-grad pass (OPPO's extra pass must score exactly B rows): the input_ids' first dimension
    score_rows = profiler.timed("rows", lambda model, input_ids: None, only_no_grad=True, count_rows=True)
    with torch.no_grad():
        score_rows(None, torch.zeros(6, 3))
        score_rows(None, input_ids=torch.zeros(2, 5))
    score_rows(None, torch.zeros(4, 3))  # with grad: the training forward, not counted
    assert profiler.rows["rows"] == 8
    profiler.reset()
    assert profiler.snapshot() == {"seconds": {}, "calls": {}, "tokens": {}, "rows": {}}


def test_overhead_spread_gives_median_range_and_geometric_mean_interval():
    import overhead

    # hand-worked: ratios 1.1 and 1/1.1 -> logs +-0.09531, mean 0, sd 0.13479, t(1 df) 12.706,
    # half-width 12.706 * 0.13479 / sqrt(2) = 1.21103 -> CI exp(+-1.21103) = [0.29790, 3.35689]
    result = overhead.spread([1.1, 1 / 1.1, float("nan")])
    assert result["n"] == 2 and result["median"] == pytest.approx((1.1 + 1 / 1.1) / 2) and result["max"] == 1.1
    assert result["geomean"] == pytest.approx(1.0)
    assert result["ci95"] == pytest.approx([0.29790, 3.35689], rel=1e-4)
    assert "ci95" not in overhead.spread([1.05])  # one pair: no interval


def test_learning_on_chain_trains_and_evaluates_every_method_on_the_dataset_prompt(tmp_path, capsys):
    """benchmarks/learning/learning.py --task chain: the prompt each trainer generates from is the held-out prompt, for every
    method (SRPO/RRPO without a rollout template), under the same rollout budget; on arithmetic SRPO keeps its
    `lines` template and is evaluated on it."""
    import argparse

    import learning

    from trl_credit.srpo.prompts import LINES_ROLLOUT_TEMPLATE
    from trl_credit.tasks.chain import make_chain_dataset

    prompts = make_chain_dataset(num_train=0, num_test=2, seed=0)["test"]["prompt"]
    args = argparse.Namespace(task="chain", generations=8, temperature=0.7, beta=0.05)
    budgets = {}
    for method in learning.METHODS:
        harness_method, overrides = learning.method_settings(method, args)
        settings = harness.common_settings(2, 96, 1, 0, 1e-4)
        settings.update(overrides)
        try:
            config = harness.method_config(harness_method, str(tmp_path / method), settings)
        except (TypeError, ValueError):
            assert method == "srpo_oracle"  # SRPOConfig without reset="oracle" yet: learning.py skips it
            continue
        assert learning.training_prompts(config, prompts) == prompts, method
        assert config.beta == 0.05, method  # --beta reaches every method alike
        budgets[method] = config.num_generations
        if method in learning.SRPO_LIKE:
            assert config.thought_delimiter == "\n" and config.suffixes_per_reset == 4
            assert config.step_checker == "chain"  # grades every reset against the first wrong step (Fig. 4)
    assert budgets["grpo"] == budgets["cue_grpo"] == budgets["oppo"] == budgets["srpo"] == budgets["rrpo"] == 8
    assert budgets["datpo"] == 4  # base rollouts; its tree grows to ~8 leaves

    args.task = "arithmetic"
    harness_method, overrides = learning.method_settings("srpo", args)
    settings = harness.common_settings(2, 48, 1, 0, 1e-4)
    settings.update(overrides)
    config = harness.method_config(harness_method, str(tmp_path / "srpo_arithmetic"), settings)
    wrapped = learning.training_prompts(config, prompts)
    assert wrapped[0][-1]["content"] == LINES_ROLLOUT_TEMPLATE.replace("{question}", prompts[0][-1]["content"])


def test_learning_records_the_warm_start_digest_and_refuses_to_resume_on_another_build(tmp_path):
    """A grid resumed with another build of the warm start (same name, other weights) must not mix runs: learning.py
    keeps the digest the build wrote beside its weights in the settings, and a run file with another digest stops it."""
    import argparse
    import json

    import learning

    build = tmp_path / "build"
    build.mkdir()
    assert learning.warm_start_digest(str(build)) is None  # not a warm start: nothing recorded
    (build / "warm_start.json").write_text(json.dumps({"weights_sha256": "abc123", "config": {}}))
    assert learning.warm_start_digest(str(build)) == "abc123"

    settings = {k: 0 for k in learning.EVAL_KEYS}
    run = tmp_path / "base.json"
    run.write_text(json.dumps({"settings": {**settings, "model_sha256": "abc123"}}))
    args = argparse.Namespace(**{**settings, "model_sha256": "abc123"}, force=False)
    assert learning.load_if_same(str(run), learning.EVAL_KEYS, args) is not None
    args.model_sha256 = "def456"
    with pytest.raises(SystemExit, match="model_sha256"):
        learning.load_if_same(str(run), learning.EVAL_KEYS, args)
    # a run written before the digest was recorded reads as None (the arithmetic grid: no warm start)
    legacy = {k: v for k, v in settings.items() if k != "model_sha256"}
    run.write_text(json.dumps({"settings": legacy}))
    args.model_sha256 = None
    assert learning.load_if_same(str(run), learning.EVAL_KEYS, args) is not None


def test_learning_lora_rank_is_a_run_setting_with_the_old_rank_for_old_runs(tmp_path):
    import argparse
    import json

    import harness
    import learning

    assert (harness.lora_config().r, harness.lora_config(8).r, harness.lora_config(8).lora_alpha) == (64, 8, 8)
    keys = learning.RUN_KEYS + learning.EVAL_KEYS
    settings = {k: 0 for k in keys if k != "lora_rank"}
    run = tmp_path / "grpo_seed0.json"
    run.write_text(json.dumps({"settings": settings}))  # written before --lora-rank: rank 64
    args = argparse.Namespace(**settings, lora_rank=64, force=False)
    assert learning.load_if_same(str(run), keys, args) is not None
    args.lora_rank = 8
    with pytest.raises(SystemExit, match="lora_rank"):
        learning.load_if_same(str(run), keys, args)
    with pytest.raises(SystemExit, match="--lora-rank"):
        learning.main(["--task", "chain", "--lora-rank", "0"])


def test_cue_grpo_timer_wraps_the_rarity_weights_part_and_counts_its_calls(tiny_model_path, tiny_dataset, tmp_path):
    """The overhead benchmark's Cue-GRPO component timer must time the rarity weighting where the credit core runs it
    (the RarityWeights modifier), not skip itself silently because the old trainer method is gone."""
    from trl_credit import CueGRPOConfig, CueGRPOTrainer
    from trl_credit.tasks.rewards import completion_text

    def parity(completions, **kwargs):
        return [float(len(completion_text(c)) % 2) for c in completions]

    args = CueGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                         max_completion_length=8, max_steps=1, report_to="none", use_cpu=True, save_strategy="no")
    trainer = CueGRPOTrainer(model=tiny_model_path, reward_funcs=parity, args=args, train_dataset=tiny_dataset)
    profiler = harness.Profiler()
    harness.instrument(trainer, "cue_grpo", profiler)
    harness.run_step(trainer, harness.prepare_manual_stepping(trainer))
    assert profiler.calls["cue: cue extraction + partition + weights"] == 1


def test_learning_chain_distributive_fraction_sets_the_problems_and_is_refused_on_arithmetic():
    import argparse

    import learning

    from trl_credit.tasks.chain import parse_question

    args = argparse.Namespace(task="chain", num_train=8, num_test=8, distributive_fraction=1.0, factor_friendly=False)
    splits = learning.dataset_of(args)
    assert all(parse_question(q).distributive for split in ("train", "test") for q in splits[split]["question"])
    args.factor_friendly = True
    cores = [parse_question(q).core for split in ("train", "test") for q in learning.dataset_of(args)[split]["question"]]
    assert all(b + c == 10 if op == "+" else b - c in (1, 2) for _, op, b, c in cores)
    args.distributive_fraction, args.factor_friendly = 0.0, False
    assert not any(parse_question(q).distributive for q in learning.dataset_of(args)["test"]["question"])
    with pytest.raises(SystemExit, match="--distributive-fraction"):
        learning.main(["--task", "arithmetic", "--distributive-fraction", "1.0"])
    with pytest.raises(SystemExit, match="--factor-friendly"):
        learning.main(["--task", "arithmetic", "--factor-friendly"])


def test_learning_structure_counts_tally_each_sample_by_structure_and_correctness():
    import learning

    distributive, plain = "6 * 3 + 6 * 5, then subtract 7", "12 - 3, then add 4"
    texts = [["3 + 5 = 8\n6 * 8 = 48\n48 - 7 = 41\n\\boxed{41}", "6 * 3 = 18\n6 * 5 = 30\n18 + 30 = 49\n\\boxed{42}",
              "5 * 6 = 30\n3 * 6 = 18\n30 + 18 = 48\n48 - 7 = 41\n\\boxed{41}"],
             ["12 - 3 = 9\n9 + 4 = 13\n\\boxed{13}", "hello"]]
    scored = [{"correct": [True, False, True]}, {"correct": [True, False]}]
    counts = learning.structure_counts(texts, [distributive, plain], scored)
    assert counts == {"factored": [1, 1], "term": [1, 2], "plain": [1, 2]}


def test_chain_pilot_reports_other_methods_of_a_pilot_against_base_and_grpo(tmp_path):
    import json

    import chain_pilot

    def report(*correct):  # two problems, 4 samples each
        return {"problems": [{"question": q, "num_correct": c, "num_samples": 4} for q, c in zip("ab", correct)],
                "pass_at_k": {"8": 0.5}, "structures": {"factored": [sum(correct), 8]}}

    base, grpo, oppo = report(1, 2), report(2, 2), report(3, 3)
    for name, eval_report in (("grpo", grpo), ("oppo", oppo)):
        (tmp_path / f"{name}_seed0.json").write_text(json.dumps({"eval": eval_report, "cpu_seconds_per_step": 9.0}))
    out = chain_pilot.other_methods(str(tmp_path), base, grpo)
    assert list(out) == ["oppo"]
    # per problem: oppo 0.75, 0.75; base 0.25, 0.5 -> +0.5, +0.25; grpo 0.5, 0.5 -> +0.25, +0.25
    assert out["oppo"]["gain"][0] == pytest.approx(0.375)
    assert out["oppo"]["gain"][1] == pytest.approx(0.125)  # sd 0.1768 / sqrt(2)
    assert out["oppo"]["vs_grpo"] == (pytest.approx(0.25), pytest.approx(0.0))
    assert out["oppo"]["accuracy"][0] == pytest.approx(0.75)
    assert out["oppo"]["structures"] == {"factored": [6, 8]}


def test_chain_pilot_names_the_warm_start_build_of_each_pilot(tmp_path):
    import json

    import chain_pilot

    config = {"epochs": 1.0, "learning_rate": 1e-3, "num_examples": 160}
    record = {"weights_sha256": "4699c010c3878b43", "config": config}
    (tmp_path / "warm_start.json").write_text(json.dumps(record))
    run = {"settings": {"model_sha256": "ignored: the folder's record wins"}}
    assert chain_pilot.warm_start_of(str(tmp_path), run) == "4699c010c3878b43: 1 epochs, lr 0.001, 160 examples"
    (tmp_path / "warm_start.json").unlink()
    assert chain_pilot.warm_start_of(str(tmp_path), {"settings": {"model_sha256": "abc"}}) == "abc"
    assert "default" in chain_pilot.warm_start_of(str(tmp_path), {"settings": {}})


def test_learning_chain_grid_runs_cue_grpo_with_the_structure_partition(tiny_model_path, tmp_path):
    """On chain the grid's Cue-GRPO partitions its positives by solution structure (the cue partition finds one
    cluster there); it is refused on arithmetic, which has no structures, and the arithmetic grid keeps cue_grpo."""
    import argparse

    import learning
    import mechanism_cue_grpo

    from trl_credit.tasks.chain import make_chain_dataset, parse_question

    chain_methods = learning.DEFAULT_METHODS["chain"]
    assert "cue_grpo_structure" in chain_methods and "cue_grpo" not in chain_methods
    assert "cue_grpo" in learning.DEFAULT_METHODS["arithmetic"]
    assert not set(learning.CHAIN_ONLY) & set(learning.DEFAULT_METHODS["arithmetic"])
    dataset = make_chain_dataset(num_train=8, num_test=2, seed=0, distributive_fraction=1.0)
    args = argparse.Namespace(task="chain", generations=4, temperature=0.7, beta=0.0, prompts=1, tokens=16, steps=1,
                              learning_rate=1e-4, lora_rank=4)
    harness_method, config, trainer = learning.build_run_trainer("cue_grpo_structure", 0, args, dataset,
                                                                 tiny_model_path)
    assert harness_method == "cue_grpo"
    assert type(trainer).__name__ == "CueGRPOTrainer" and config.cue_partition == "callable"
    assert trainer.rarity_weights.partition_fn is mechanism_cue_grpo.structure_partition
    # Each positive is labelled by its first line: b op c first is factored, a * b first is term by term.
    a, op, b, c = parse_question(dataset["train"][0]["question"]).core
    factored, term = f"{b} {op} {c} = {eval(f'{b} {op} {c}')}", f"{a} * {b} = {a * b}"
    labels = trainer.rarity_weights.partition_fn([term, factored, factored], dataset["train"][0]["prompt"])
    assert labels == ["term", "factored", "factored"]
    with pytest.raises(SystemExit, match="cue_grpo_structure needs the chain task"):
        learning.main(["--task", "arithmetic", "--methods", "cue_grpo_structure"])


def test_pooled_gain_averages_seeds_per_problem_then_pairs_with_the_base():
    """Two problems, two seeds, 4 samples each (hand-worked): per problem the seeds' mean accuracy minus the base's,
    q1: (2/4 + 4/4)/2 - 1/4 = 0.5, q2: (2/4 + 1/4)/2 - 2/4 = -0.125; mean 0.1875, SE = |0.5 + 0.125|/sqrt(2)/sqrt(2)."""
    from harness import plots

    def report(counts):
        return {"problems": [dict(question=q, num_correct=k, num_samples=4) for q, k in counts.items()]}

    base = report({"q1": 1, "q2": 2})
    gain, se = plots.pooled_gain([report({"q1": 2, "q2": 2}), report({"q2": 1, "q1": 4})], base)
    assert gain == pytest.approx(0.1875) and se == pytest.approx(0.3125)
    # One seed: the per-run paired gain, diffs 0.25 and 0 -> mean 0.125, SE = 0.25/sqrt(2)/sqrt(2) = 0.125.
    assert plots.paired_problem_se(report({"q1": 2, "q2": 2}), base) == pytest.approx((0.125, 0.125))


def test_learning_base_samples_evaluates_only_the_base_model_with_more_samples():
    import argparse

    import learning

    args = argparse.Namespace(samples=8, base_samples=32, task="chain", num_test=64, eval_seed=1234)
    base = learning.base_eval_args(args)
    assert base.samples == 32 and args.samples == 8  # the trained runs keep theirs
    assert {k: v for k, v in vars(base).items() if k != "samples"} == {k: v for k, v in vars(args).items()
                                                                       if k != "samples"}
    args.base_samples = None
    assert learning.base_eval_args(args).samples == 8
    with pytest.raises(SystemExit, match="--base-samples: at least --samples"):
        learning.main(["--task", "chain", "--samples", "8", "--base-samples", "4"])


def test_learning_sharpening_baseline_is_the_base_at_its_best_decoding_named():
    import learning

    base = dict(greedy_accuracy=0.40, by_temperature={"0.3": dict(accuracy=0.50), "1": dict(accuracy=0.30)})
    sharp = learning.sharpening_baseline(base)
    assert sharp["decoding"] == "temperature 0.3" and sharp["accuracy"] == 0.50
    assert sharp["options"] == {"temperature 0.3": 0.50, "temperature 1": 0.30, "greedy": 0.40}
    assert learning.sharpening_baseline(dict(greedy_accuracy=0.6, **{"by_temperature": {}}))["decoding"] == "greedy"
    assert learning.sharpening_baseline({}) is None


def test_learning_base_json_lists_its_temperatures_in_order_whatever_order_runs_added_them(tmp_path):
    """A grid resumed with more --base-temperatures appends them (0.7, 0.3, then 1 and 0.5): base.json and the
    sharpening baseline's options list them 0.3, 0.5, 0.7, 1 (nothing new to sample, so no model is loaded)."""
    import argparse
    import json

    import learning

    path = tmp_path / "base.json"
    by_temperature = {t: dict(accuracy=a, samples=8) for t, a in [("0.7", 0.3), ("0.3", 0.5), ("1", 0.2), ("0.5", 0.4)]}
    path.write_text(json.dumps(dict(eval=dict(accuracy=0.3, greedy_accuracy=0.6), by_temperature=by_temperature)))
    args = argparse.Namespace(base_temperatures="0.3,0.5,0.7,1.0", greedy_eval=True)
    learning.base_by_temperature(str(path), args, dataset=None, model_path="unused")
    saved = json.loads(path.read_text())
    assert list(saved["by_temperature"]) == ["0.3", "0.5", "0.7", "1"]
    assert list(saved["sharpening_baseline"]["options"]) == ["temperature 0.3", "temperature 0.5", "temperature 0.7",
                                                             "temperature 1", "greedy"]


def test_learning_report_judges_runs_without_greedy_by_their_sampled_accuracy_against_the_baseline():
    """A grid made before --greedy-eval: a method whose sampled accuracy (0.45) is above the base's best decoding
    (greedy 0.42) learned beyond sharpening; one at 0.40 cannot be told from sharpening."""
    from harness import plots

    def run(accuracy):
        problems = [dict(question=f"q{i}", num_correct=int(i < accuracy * 20), num_samples=1) for i in range(20)]
        return dict(eval=dict(accuracy=accuracy, problems=problems), seconds_per_step=1.0)

    base_file = dict(eval=dict(accuracy=0.30), sharpening_baseline=dict(
        decoding="greedy", accuracy=0.42, options={"greedy": 0.42, "temperature 0.7": 0.30}))
    data = dict(base=None, base_file=base_file, runs={"grpo": {0: run(0.45)}, "srpo": {0: run(0.40)}})
    lines = plots.beyond_sampling_lines(data, plots.learning_summary(data))
    assert lines[0] == ("Sharpening baseline (the base model at its best decoding, greedy): 0.420 (greedy 0.420, "
                        "temperature 0.7 0.300).")
    assert lines[1].endswith("above the sharpening baseline with accuracy 0.450")
    assert lines[2].endswith("accuracy 0.400 is not above the sharpening baseline: these runs do not show a gain "
                             "beyond sharpening")


def test_learning_report_pairs_each_seeds_greedy_answers_with_the_bases_over_problems():
    """Four problems, base greedy [1, 0, 0, 1]; seed 0 greedy [1, 1, 0, 1], seed 1 [1, 1, 1, 0] (hand-worked):
    seed 0 diffs (0, 1, 0, 0): gain 0.25, sd 0.5, SE 0.25; seed 1 diffs (0, 1, 1, -1): gain 0.25, sd sqrt(11/12),
    SE 0.4787; pooled per problem (0, 1, 0.5, -0.5): gain 0.25, sd sqrt(5/12), SE 0.3227."""
    from harness import plots

    def report(greedy):
        problems = [dict(question=f"q{i}", num_correct=1, num_samples=2) for i in range(4)]
        return dict(accuracy=0.5, problems=problems, greedy_correct=greedy, greedy_accuracy=sum(greedy) / 4)

    base_file = dict(eval=report([1, 0, 0, 1]), sharpening_baseline=dict(
        decoding="greedy", accuracy=0.5, options={"greedy": 0.5, "temperature 0.7": 0.5}))
    runs = {s: dict(eval=report(g), seconds_per_step=1.0) for s, g in [(0, [1, 1, 0, 1]), (1, [1, 1, 1, 0])]}
    data = dict(base=base_file["eval"], base_file=base_file, runs={"grpo": runs})
    gain = plots.learning_summary(data)["grpo"]["greedy_gain_over_base"]
    assert [(r["seed"], r["gain"]) for r in gain["per_seed"]] == [(0, 0.25), (1, 0.25)]
    assert [r["se"] for r in gain["per_seed"]] == pytest.approx([0.25, (11 / 12) ** 0.5 / 2])
    assert gain["pooled"]["gain"] == pytest.approx(0.25) and gain["pooled"]["se"] == pytest.approx((5 / 12) ** 0.5 / 2)
    lines = plots.beyond_sampling_lines(data, plots.learning_summary(data))
    assert lines[-1] == ("  greedy gain over the base's greedy (paired over problems; z = gain / SE): seed 0: +0.250 "
                         "(SE 0.250, z 1.0), seed 1: +0.250 (SE 0.479, z 0.5); pooled over the 2 seeds +0.250 "
                         "(SE 0.323, z 0.8)")


def test_learning_table_reports_pass_at_k_up_to_the_largest_sample_count_of_any_model():
    """The base sampled 32 times per problem, the runs 8: the table's pass@k goes to 32 (a run's missing cell is
    "-"); one problem solved 1 time in 32 has pass@32 = 1 and pass@1 = 1/32."""
    from harness import plots

    base = dict(accuracy=1 / 32, problems=[dict(question="q", num_correct=1, num_samples=32)])
    run = dict(eval=dict(accuracy=0.25, problems=[dict(question="q", num_correct=2, num_samples=8)]),
               seconds_per_step=1.0)
    data = dict(base=base, base_file=None, runs={"grpo": {0: run}})
    lines = plots.learning_markdown(data, plots.learning_summary(data)).splitlines()
    assert lines[0].startswith("| model | seeds | s/step | accuracy (95% CI) | pass@1 | pass@2 | pass@4 | pass@8 | "
                               "pass@16 | pass@32 | Δ")
    assert lines[2].startswith("| base model | - | - | 0.031 | 0.031 |") and "| 1.000 | - |" in lines[2]
    assert lines[3].split(" | ")[-3:] == ["-", "-", "- |"]


def test_learning_greedy_eval_and_base_temperatures_on_the_tiny_model(tiny_model_path, tmp_path):
    """evaluate_model's greedy pass is one deterministic sample a problem, scored like the sampled ones; the base
    gets its temperatures and greedy added once, the sharpening baseline stored beside them; the report reads both."""
    import argparse
    import json

    import learning
    from harness import plots
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_credit.tasks.chain import make_chain_dataset

    dataset = make_chain_dataset(num_train=2, num_test=3, seed=0)
    args = argparse.Namespace(task="chain", samples=2, eval_batch_size=8, eval_temperature=0.7, eval_top_p=1.0,
                              tokens=8, eval_seed=1, greedy_eval=True, base_temperatures="0.7,1.0",
                              **{k: None for k in learning.EVAL_KEYS if k not in (
                                  "task", "samples", "eval_temperature", "eval_top_p", "tokens", "eval_seed",
                                  "greedy_eval")})
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    report = learning.evaluate_model(model, tokenizer, dataset["test"], args)
    again = learning.evaluate_model(model, tokenizer, dataset["test"], args)
    assert len(report["greedy_correct"]) == 3 and report["greedy_correct"] == again["greedy_correct"]
    assert report["greedy_accuracy"] == sum(report["greedy_correct"]) / 3
    # The base file of an older grid (no greedy, no temperatures) is completed, not redone
    base_path = tmp_path / "base.json"
    old = {k: v for k, v in report.items() if not k.startswith("greedy")}
    base_path.write_text(json.dumps(dict(settings={}, eval=old)))
    learning.base_by_temperature(str(base_path), args, dataset, tiny_model_path)
    saved = json.loads(base_path.read_text())
    assert saved["eval"]["greedy_correct"] == report["greedy_correct"]
    assert saved["by_temperature"]["0.7"]["accuracy"] == old["accuracy"]  # the base evaluation itself, reused
    assert set(saved["by_temperature"]) == {"0.7", "1"}
    assert saved["sharpening_baseline"]["accuracy"] == max(saved["sharpening_baseline"]["options"].values())
    run = dict(eval=report, seconds_per_step=1.0)
    data = dict(base=saved["eval"], base_file=saved, runs={"grpo": {0: run}})
    text = "\n".join(plots.beyond_sampling_lines(data, plots.learning_summary(data)))
    assert f"Sharpening baseline (the base model at its best decoding, {saved['sharpening_baseline']['decoding']})" \
        in text and f"greedy {report['greedy_accuracy']:.3f}" in text
