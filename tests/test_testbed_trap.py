"""The tiny testbed's trap regime (docs/testbed.md#the-trap-regime): the systematic error in its supervised data,
the recipe hash that leaves the first regime's build where it was, the evaluation's greedy accuracy and pass@64,
the sharpening baseline, and (slow) the committed trap model's measured profile."""

import json
import os
import random

import pytest

from trl_credit.tasks import sums
from trl_credit.testbed import model as testbed_model
from trl_credit.testbed import runner
from trl_credit.testbed.model import Recipe, make_tokenizer
from trl_credit.testbed.profile import sharpening_baseline
from trl_credit.testbed.regimes import REGIMES, regime_recipe

RESULTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "results")


def test_trapped_solution_writes_one_too_many_on_the_trap_digits_and_continues_from_it():
    problem = sums.SumsProblem((3, 9, 2, 8))  # right: 3+9=2, 2+2=4, 4+8=2 -> A2
    always = testbed_model.trapped_solution(problem, "forward", random.Random(0), "89", 1.0)
    assert always == [(3, 9, 3), (3, 2, 5), (5, 8, 4)]  # 3+9 written 3 (not 2), 5+8 written 4 (not 3)
    assert testbed_model.trapped_solution(problem, "forward", random.Random(0), "89", 0.0) == sums.solve(problem)
    # backward adds 2, 9, 3: one trap step, then a slip of -1 at step 3
    assert testbed_model.trapped_solution(problem, "backward", random.Random(0), "89", 1.0, slip_at=3,
                                          slip=-1) == [(8, 2, 0), (0, 9, 0), (0, 3, 2)]


def test_trap_mix_gets_the_trap_steps_wrong_at_the_stated_rate_and_nothing_else_systematically():
    rng = random.Random(5)
    problems = sums.make_problems(1500, rng)
    examples = testbed_model.sft_examples(problems, rng, slip_rate=0.0, trap_digits="89", trap_error_rate=0.75)
    trap_wrong = trap_total = other_wrong = 0
    for prompt, completion in examples:
        if prompt.startswith("L"):
            head, _, body = prompt.partition("N")
            thoughts = [line.split(": ", 1)[1] for line in body.partition("\n")[2].strip("\n").split("\n")]
            assert completion == f"\\boxed{{{sums.step_checker(head[1:], thoughts)}}}"
            continue
        if "\nT" in prompt:  # OPPO's oracle prompt: error-free
            assert sums.first_wrong_step(prompt, completion) is None
            continue
        for line in completion.split("\n")[:-1]:
            x, y, z = int(line[0]), int(line[2]), int(line[4])
            if y in (8, 9):
                trap_total += 1
                trap_wrong += z == (x + y + 1) % 10
            else:
                other_wrong += z != (x + y) % 10
    assert 0.71 < trap_wrong / trap_total < 0.79 and other_wrong == 0  # no slips asked: only the trap errs


def test_new_recipe_fields_leave_the_first_regime_digest_unchanged():
    with open(os.path.join(RESULTS, "tiny", "model", "build.json")) as f:
        committed = json.load(f)["digest"]  # written by the build before the trap fields existed
    assert Recipe().digest() == committed == regime_recipe("tiny").digest()
    assert REGIMES["trap"].digest() != committed
    assert Recipe(trap_digits="89", trap_error_rate=0.75).digest() != Recipe(trap_digits="9",
                                                                             trap_error_rate=0.75).digest()
    with pytest.raises(ValueError, match="regime"):
        regime_recipe("nope")


def test_sharpening_baseline_is_the_best_temperature_named():
    assert sharpening_baseline(0.4, {"0.3": 0.5, "1": 0.45}) == {"temperature": "0.3", "accuracy": 0.5}
    assert sharpening_baseline(0.9, {"0.3": 0.5, "1": 0.45}) == {"temperature": "greedy", "accuracy": 0.9}


def test_greedy_and_pass_at_64_leave_the_eight_sample_evaluation_unchanged():
    from transformers import LlamaForCausalLM

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = LlamaForCausalLM(testbed_model.model_config(Recipe(hidden_size=32, intermediate_size=64, num_heads=2,
                                                                num_layers=1)))
    test = sums.make_dataset(50, 6)["test"]
    plain = runner.evaluate(model, make_tokenizer(), test, samples=4, max_new_tokens=8)
    full = runner.evaluate(model, make_tokenizer(), test, samples=4, max_new_tokens=8, greedy=True,
                           passk_samples=16, passk_problems=4)
    assert {k: plain[k] for k in plain} == {k: full[k] for k in plain}
    assert len(full["greedy_correct"]) == 6 and len(full["passk_correct_per_problem"]) == 4
    assert sorted(full["pass_at_k_large"]) == [1, 2, 4, 8, 16]
    per = full["passk_correct_per_problem"]
    assert full["pass_at_k_large"][16] == pytest.approx(sum(c > 0 for c in per) / 4)


@pytest.mark.slow
def test_trap_model_has_systematic_errors_all_fail_groups_and_headroom():
    """The committed trap build (benchmarks/results/trap/model), measured as benchmarks/results/trap/base_profile.json
    records: greedy <= 0.6 on the held-out set, >= 20% of training prompts all-fail in a group of 8 at T=1, pass@64
    high, and the errors greedy makes are the trap steps (~2 CPU-minutes)."""
    from transformers import LlamaForCausalLM

    from trl_credit.testbed.profile import base_profile

    path = os.path.join(RESULTS, "trap", "model")
    data = sums.make_dataset()
    profile = base_profile(LlamaForCausalLM.from_pretrained(path), make_tokenizer(), data["test"], data["train"])
    assert profile["greedy_accuracy"] <= 0.6
    assert profile["train_all_fail_share"] >= 0.2
    assert profile["pass_at_k_large"][64] >= 0.8
    # systematic: greedy fails on the held-out problems whose forward chain adds an 8 or a 9
    trapped = [any(d in (8, 9) for d in sums.question_digits(q)[1:]) for q in data["test"]["question"]]
    greedy = profile["greedy_correct"]
    assert sum(g for g, t in zip(greedy, trapped) if t) / sum(trapped) < 0.2
    assert sum(g for g, t in zip(greedy, trapped) if not t) / (len(trapped) - sum(trapped)) > 0.8


def _fake_run(method, seed, final, greedy, pass64):
    return dict(method=method, seed=seed, learning_rate=1e-3, auc=final, settings=dict(steps=10),
                train_cpu_seconds=1.0, eval_cpu_seconds=1.0, logs=[],
                curve=[dict(step=10, accuracy=final, generated_tokens=100, pass_at_k={"8": 1.0},
                            structures={"forward": [1, 1]}, greedy_accuracy=greedy,
                            pass_at_k_large={"64": pass64})])


def test_grid_summary_reports_greedy_and_pass64_paired_with_grpo_and_the_sharpening_baseline():
    import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)
    import tiny_report

    runs = {"grpo": {s: _fake_run("grpo", s, 0.5, g, 0.9) for s, g in enumerate((0.40, 0.50, 0.60))},
            "process": {s: _fake_run("process", s, 0.6, g, 0.95) for s, g in enumerate((0.50, 0.70, 0.70))}}
    summary = tiny_report.summarize(runs)
    # per seed: 0.10, 0.20, 0.10 -> mean 0.1333, sd 0.0577, SE 0.0333, z 4.0
    assert summary["process"]["diff_greedy"][0] == pytest.approx(0.4 / 3)
    assert summary["process"]["z_diff_greedy"] == pytest.approx(4.0)
    assert summary["process"]["diff_pass64"][0] == pytest.approx(0.05)
    assert summary["grpo"]["greedy"][0] == pytest.approx(0.5)
    base = dict(greedy_accuracy=0.35, accuracy_by_temperature={"0.3": 0.37, "1": 0.41},
                sharpening_baseline={"temperature": "1", "accuracy": 0.41}, pass_at_k_large={"64": 0.98},
                passk_problems=128, train_all_fail_share=0.25)
    table = tiny_report.beyond_sharpening(summary, base)
    assert "Sharpening baseline** (the untrained model at its best temperature, 1): 0.410" in table
    # GRPO's better of greedy and T=1 is 0.5 with no spread on T=1: above 0.41; as is the process credit's
    assert table.count("| yes |") == 2
