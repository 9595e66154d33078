"""Evaluation pipeline (trl_credit/evaluation/evaluate.py): pure scoring/report, tiny-model sampling, CLI."""

import json
import os
import subprocess
import sys

import pytest

from trl_credit.evaluation.evaluate import (
    answer_key,
    build_report,
    evaluate,
    load_model_and_tokenizer,
    load_problems,
    main,
    plot_pass_at_k,
    report_budgets,
    sample_completions,
    score_completions,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------- pure part


def hand_made_problems():
    return [
        # c = 1 of 4; votes: "3" twice -> majority "3" (wrong) at k=4, "7" (right) at k=1
        {"correct": [True, False, False, False], "answers": ["7", "3", "3", "5"], "question": "3 + 4"},
        # c = 2 of 4; votes 2-2 tie between "9" and "2": "9" came first and is right
        {"correct": [True, True, False, False], "answers": ["9", "9", "2", "2"], "question": "4 + 5"},
    ]


def test_report_budgets():
    assert report_budgets(1) == [1]
    assert report_budgets(4) == [1, 4]
    assert report_budgets(10) == [1, 4, 8, 10]
    assert report_budgets(256) == [1, 4, 8, 16, 32, 64, 128, 256]
    with pytest.raises(ValueError, match="num_samples"):
        report_budgets(0)


def test_build_report_on_hand_made_counts():
    report = build_report(hand_made_problems(), settings={"model": "m"})
    assert report["num_problems"] == 2 and report["num_samples"] == 4
    # pass@1 = mean(c/n) = (1/4 + 2/4) / 2 = 0.375; pass@4 with n = 4: both problems have c >= 1 -> 1.0
    assert report["pass_at_k"] == pytest.approx({"1": 0.375, "4": 1.0})
    # AUC@4 = (4 - 1) * (0.375 + 1.0) / 2 / (4 - 1) = 0.6875
    assert report["auc_at_k"] == pytest.approx({"4": 0.6875})
    # avg@k over random k-subsets = c/n for every k: (1/4 + 2/4) / 2 = 0.375 = pass@1 (the first samples, both
    # right, do not make avg@1 = 1.0)
    assert report["avg_at_k"] == pytest.approx({"1": 0.375, "4": 0.375})
    # maj@1 = P(one random sample is right) = (1/4 + 2/4) / 2 = 0.375; maj@4 (all samples): problem 1 "3" wins
    # 2-1-1 (wrong), problem 2 a 2-2 tie of "9" (right) and "2" broken at random -> 1/2; (0 + 1/2) / 2 = 0.25
    assert report["maj_at_k"] == pytest.approx({"1": 0.375, "4": 0.25})
    assert report["accuracy"] == pytest.approx(0.375)
    assert report["settings"] == {"model": "m"}
    assert report["problems"] == [
        {"index": 0, "num_correct": 1, "num_samples": 4, "question": "3 + 4", "majority_answer": "3"},
        {"index": 1, "num_correct": 2, "num_samples": 4, "question": "4 + 5", "majority_answer": "9"},
    ]
    json.dumps(report)  # JSON-ready


def test_build_report_auc_keys_and_pass_at_n():
    # n = 10, one problem with c = 1: pass@k = 1 - C(9, k)/C(10, k) = k/10 for every k.
    report = build_report([{"correct": [True] + [False] * 9}])
    assert report["pass_at_k"] == pytest.approx({"1": 0.1, "4": 0.4, "8": 0.8, "10": 1.0})
    # AUC@4 = (0.1 + 0.4)/2 = 0.25; AUC@8 = (3*(0.1+0.4)/2 + 4*(0.4+0.8)/2)/7 = (0.75 + 2.4)/7 = 0.45
    assert report["auc_at_k"] == pytest.approx({"4": 0.25, "8": 0.45})
    assert "maj_at_k" not in report  # no answers given


def test_build_report_errors():
    with pytest.raises(ValueError, match="at least one problem"):
        build_report([])
    with pytest.raises(ValueError, match="same number of samples"):
        build_report([{"correct": [True]}, {"correct": [True, False]}])
    with pytest.raises(ValueError, match="at least one sample"):
        build_report([{"correct": []}])


def test_answer_key_follows_the_reward():
    assert answer_key(r"so \boxed{x = 7}", "accuracy") == "7"
    assert answer_key("7 then 8.0", "final_number") == "8"
    assert answer_key("", "accuracy") is None
    assert answer_key("no number", "final_number") is None
    with pytest.raises(ValueError, match="reward must be one of"):
        answer_key("1", "bleu")


def test_score_completions():
    completions = [["3 + 4 = 7", r"\boxed{7}", "eight"], [[{"role": "assistant", "content": r"\boxed{9}"}], "9", ""]]
    lenient = score_completions(completions, ["7", "9"], "final_number")
    assert lenient == [
        {"correct": [True, True, False], "answers": ["7", "7", None]},
        {"correct": [True, True, False], "answers": ["9", "9", None]},
    ]
    strict = score_completions(completions, ["7", "9"], "accuracy")
    # "3 + 4 = 7" is not a bare answer line: the strict `accuracy` checker (docs/design.md#answer-checking) says wrong
    assert [p["correct"] for p in strict] == [[False, True, False], [True, True, False]]
    assert strict[0]["answers"] == ["3 + 4 = 7", "7", "eight"]
    with pytest.raises(ValueError, match="2 problems but 1 reference"):
        score_completions(completions, ["7"])
    with pytest.raises(ValueError, match="reward must be one of"):
        score_completions(completions, ["7", "9"], "exact")


def test_write_report_and_plot(tmp_path):
    report = build_report(hand_made_problems())
    path = write_report(report, str(tmp_path / "sub" / "report.json"))
    with open(path) as f:
        assert json.load(f) == report
    png = plot_pass_at_k(report, str(tmp_path / "curve.png"))
    with open(png, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    # n = 1 (a single k): still plots
    single = build_report([{"correct": [True]}, {"correct": [False]}])
    assert single["auc_at_k"] == {}
    with open(plot_pass_at_k(single, str(tmp_path / "single.png")), "rb") as f:
        assert f.read(8) == PNG_MAGIC


# ---------------------------------------------------------------------------------------------------- data side


def test_load_problems_builtin():
    prompts, answers = load_problems(num_problems=5, digits=2)
    assert len(prompts) == 5 and len(answers) == 5
    assert prompts[0][0]["role"] == "user"
    from trl_credit.tasks.data import make_arithmetic_dataset

    expected = make_arithmetic_dataset(num_train=0, num_test=5, digits=2)["test"]
    assert answers == expected["answer"] and prompts == expected["prompt"]
    # Default: the whole test split of the default built-in dataset (what training held out).
    prompts, answers = load_problems()
    assert answers == make_arithmetic_dataset()["test"]["answer"] and len(answers) == 20


def test_load_problems_from_a_local_hf_dataset(tmp_path):
    rows = [{"problem": f"What is {i} + 1?", "solution": str(i + 1)} for i in range(4)]
    (tmp_path / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    prompts, answers = load_problems(
        str(tmp_path), split="test", prompt_column="problem", answer_column="solution", num_problems=3
    )
    assert prompts == ["What is 0 + 1?", "What is 1 + 1?", "What is 2 + 1?"]
    assert answers == ["1", "2", "3"]
    with pytest.raises(ValueError, match="prompt_column='prompt' is not a column"):
        load_problems(str(tmp_path), split="test")
    with pytest.raises(ValueError, match="only apply to the built-in"):
        load_problems(str(tmp_path), split="test", prompt_column="problem", answer_column="solution", digits=2)
    with pytest.raises(ValueError, match="num_problems must be"):
        load_problems(num_problems=0)


# ---------------------------------------------------------------------------------------------------- model side


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_path):
    return load_model_and_tokenizer(tiny_model_path, device="cpu")


def test_sample_completions_shapes_and_seeding(tiny_lm):
    model, tokenizer = tiny_lm
    prompts, _ = load_problems(num_problems=3)
    kwargs = dict(batch_size=5, max_new_tokens=6, temperature=1.0, progress=False)
    first = sample_completions(model, tokenizer, prompts, 4, seed=1, **kwargs)
    assert [len(per) for per in first] == [4, 4, 4]
    for sample in (s for per in first for s in per):
        assert 1 <= sample["num_tokens"] <= 6 and isinstance(sample["text"], str)
        assert sample["stopped"] or sample["num_tokens"] == 6
    assert sample_completions(model, tokenizer, prompts, 4, seed=1, **kwargs) == first
    assert sample_completions(model, tokenizer, prompts, 4, seed=2, **kwargs) != first


def test_greedy_sampling_repeats_and_matches_generate(tiny_lm):
    model, tokenizer = tiny_lm
    prompts = ["What is 3 + 4?", "Let x = 2."]  # plain-text prompts are used as they are
    samples = sample_completions(model, tokenizer, prompts, 3, batch_size=4, max_new_tokens=5, temperature=0,
                                 progress=False)
    for prompt, per in zip(prompts, samples):
        assert len({s["text"] for s in per}) == 1  # greedy: every sample the same
        # Left-padded batching must not change the greedy continuation of each prompt alone.
        ids = tokenizer(prompt, return_tensors="pt")
        alone = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        new = alone[0, ids["input_ids"].shape[1]:].tolist()
        eos = tokenizer.eos_token_id
        new = new[: new.index(eos)] if eos in new else new
        assert per[0]["text"] == tokenizer.decode(new, skip_special_tokens=True)


def test_sample_completions_argument_errors(tiny_lm):
    model, tokenizer = tiny_lm
    with pytest.raises(ValueError, match="num_samples, batch_size and max_new_tokens"):
        sample_completions(model, tokenizer, ["a"], 0)
    with pytest.raises(ValueError, match="top_p"):
        sample_completions(model, tokenizer, ["a"], 1, top_p=0)


def test_evaluate_writes_json_and_png(tiny_model_path, tmp_path):
    report = evaluate(
        model=tiny_model_path, num_problems=3, num_samples=4, batch_size=8, max_new_tokens=6, seed=0,
        output_dir=str(tmp_path / "out"), save_completions=True, progress=False, device="cpu",
    )
    with open(tmp_path / "out" / "report.json") as f:
        saved = json.load(f)
    assert saved == json.loads(json.dumps(report))
    with open(tmp_path / "out" / "pass_at_k.png", "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert saved["settings"]["reward"] == "final_number"  # default for the built-in task
    assert saved["settings"]["num_samples"] == 4 and saved["num_problems"] == 3
    assert set(saved["pass_at_k"]) == {"1", "4"} and set(saved["auc_at_k"]) == {"4"}
    # Per-problem counts agree with the saved completions re-scored independently of the report code.
    from trl_credit.tasks.rewards import final_number_reward

    lines = [json.loads(line) for line in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    assert len(lines) == 12
    for problem in saved["problems"]:
        texts = [line["text"] for line in lines if line["problem"] == problem["index"]]
        rewards = final_number_reward(texts, answer=[problem["answer"]] * len(texts))
        assert problem["num_correct"] == sum(rewards)
    assert 0 <= saved["truncated_fraction"] <= 1 and saved["mean_completion_tokens"] <= 6


def test_maj_at_k_needs_one_verdict_per_answer_and_score_completions_keeps_it(monkeypatch):
    import trl_credit.evaluation.evaluate as evaluate_module

    with pytest.raises(ValueError, match="'7'.*same correctness"):
        build_report([{"correct": [True, False], "answers": ["7", "7"]}])
    # a reward that judges two samples with the same voting key differently: they vote as different answers
    monkeypatch.setitem(evaluate_module.REWARDS, "final_number", lambda completions, answer: [1.0, 0.0, 0.0])
    (scored,) = score_completions([["so 7", "so 7", "so 8"]], ["7"], reward="final_number")
    assert scored == {"correct": [True, False, False], "answers": ["7 (correct)", "7 (wrong)", "8"]}
    # maj@3: a 3-way tie, 1 of 3 right; maj@1 = 1/3
    assert build_report([scored])["maj_at_k"] == pytest.approx({"1": 1 / 3, "3": 1 / 3})
    # beyond the float64 range of C(n, k): maj@k is left out, with a warning, the rest is reported
    with pytest.warns(UserWarning, match="maj@k is left out"):
        report = build_report([{"correct": [True] * 1001, "answers": ["1"] * 1001}])
    assert "maj_at_k" not in report and report["avg_at_k"]["1"] == 1.0


def test_cli_defaults_are_the_base_accuracy_setting():
    from trl_credit.evaluation.evaluate import _parse_args

    args = _parse_args([])
    # README "Built-in task and base accuracy" / trl_credit.tasks.data: temperature 0.7, top-p 1 (sampling default),
    # 64 new tokens; the table is benchmarks/learning/base_accuracy.py with its defaults
    assert (args.temperature, args.top_p, args.max_new_tokens) == (0.7, 1.0, 64)
    import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)
    import base_accuracy

    table = base_accuracy.build_parser().parse_args([])
    assert (table.temperature, table.max_new_tokens) == (args.temperature, args.max_new_tokens)


def test_cli_help():
    result = subprocess.run([sys.executable, "-m", "trl_credit.evaluation.evaluate", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0
    for option in ("--model", "--adapter", "--dataset", "--reward", "--num_samples", "--temperature", "--top_p",
                   "--max_new_tokens", "--seed", "--output_dir"):
        assert option in result.stdout
    assert "base-accuracy table" in result.stdout and "temperature 0.7" in result.stdout
    with pytest.raises(SystemExit) as exit_info:
        main(["--reward", "bleu"])
    assert exit_info.value.code == 2


def test_cli_run_with_tiny_model(tiny_model_path, tmp_path, capsys):
    assert main([
        "--model", tiny_model_path, "--num_problems", "2", "-n", "2", "--max_new_tokens", "4", "--reward",
        "accuracy", "--output_dir", str(tmp_path), "--no_progress", "--device", "cpu", "--digits", "2",
    ]) == 0
    out = capsys.readouterr().out
    assert "| pass@k |" in out and "report.json" in out
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["settings"]["reward"] == "accuracy"
    assert saved["settings"]["builtin_kwargs"] == {"digits": 2}
    assert (tmp_path / "pass_at_k.png").exists()


def test_lora_adapter_is_loaded_and_merged(tiny_model_path, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    # init_lora_weights=False: random B as well as A, so the adapter really changes the outputs.
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(str(tmp_path / "adapter"))
    inputs = {"input_ids": torch.tensor([[5, 17, 42, 7]])}
    with torch.no_grad():
        expected = peft_model(**inputs).logits
        plain = AutoModelForCausalLM.from_pretrained(tiny_model_path)(**inputs).logits

    model, _ = load_model_and_tokenizer(tiny_model_path, adapter=str(tmp_path / "adapter"), device="cpu")
    with torch.no_grad():
        got = model(**inputs).logits
    assert not torch.allclose(plain, expected, atol=1e-4)  # the adapter matters...
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)  # ...and is what the evaluator runs

    # Without a model, the adapter's recorded base model is loaded (here the tiny model's path).
    model, _ = load_model_and_tokenizer(None, adapter=str(tmp_path / "adapter"), device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_default_model_on_default_task_scores_above_zero(tmp_path):
    # SmolLM2-135M-Instruct gets ~47% of the default task right (benchmarks/learning/base_accuracy.py); with 4 problems x
    # 4 samples, all 16 wrong would have probability ~0.53**16 < 1e-4 (and the run is seeded).
    report = evaluate(num_problems=4, num_samples=4, temperature=0.7, max_new_tokens=48, output_dir=str(tmp_path),
                      progress=False, device="cpu")
    assert report["settings"]["reward"] == "final_number"
    assert 0 < report["accuracy"] < 1
    assert (tmp_path / "report.json").exists() and (tmp_path / "pass_at_k.png").exists()
