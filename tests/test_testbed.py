"""The tiny testbed (trl_credit/testbed, docs/testbed.md#the-tiny-testbed): the sums task's checker and rewards on
hand-written chains, the supervised mix, the character tokenizer, the deterministic build, and two steps of every
grid method on a reduced model."""

import random

import pytest

from trl_credit.srpo.prompts import localization_prompt, parse_reset_step
from trl_credit.tasks import sums
from trl_credit.testbed import model as testbed_model
from trl_credit.testbed import runner
from trl_credit.testbed.model import VOCAB, Recipe, build_model, make_tokenizer, testbed_model_path

Q = "S35281\n"  # forward: 3+5=8, 8+2=0, 0+8=8, 8+1=9 -> A9; backward: 1+8=9, 9+2=1, 1+5=6, 6+3=9 -> A9
FORWARD = "3+5=8\n8+2=0\n0+8=8\n8+1=9\nA9"
BACKWARD = "1+8=9\n9+2=1\n1+5=6\n6+3=9\nA9"


@pytest.mark.parametrize("completion, expected", [
    (FORWARD, (None, None, 4)),
    (BACKWARD, (None, None, 4)),
    ("3+5=8\n8+2=1\n1+8=9\n9+1=0\nA0", (2, "arithmetic", 1)),  # 8+2=10 -> 0, written 1
    ("3+5=8\n8+8=6\n6+1=7\nA7", (2, "off path", 1)),  # skips the digit 2
    ("3+5=8\n2+8=0\nA0", (2, "off path", 1)),  # restarts from a digit instead of the running value
    ("3+5=8\nso 8+2=0\nA9", (2, "unparseable", 1)),
    ("3+5=8\n8+2=0", (3, "no answer", 2)),  # one past the last line
    ("3+5=8\n8+2=0\nA5", (3, "wrong answer", 2)),
    ("3+5=8\nA9", (None, None, 1)),  # the answer line is checked against the answer only (as the chain task's)
    (FORWARD + "\n1+1=2", (6, "text after answer", 4)),
    ("1+8=9\n9+5=4\n", (2, "off path", 1)),  # backward must add 2 next, not 5
    ("", (1, "no answer", 0)),
])
def test_checker_on_hand_written_chains(completion, expected):
    assert sums.check_steps(Q, completion) == expected


def test_checker_keeps_both_structures_while_they_agree():
    # S1221: forward 1+2=3, 3+2=5, 5+1=6; backward 1+2=3, 3+2=5, 5+1=6: the same lines, both right
    assert sums.first_wrong_step("S1221\n", "1+2=3\n3+2=5\n5+1=6\nA6") is None
    # S1231: forward 1+2=3 then +3; backward 1+3=4 ...; "1+2=3" is forward only, so "3+1" is off path
    assert sums.check_steps("S1231\n", "1+2=3\n3+1=4\nA4") == (2, "off path", 1)


def test_step_line_numbers_lines_as_the_checker_does():
    completion = "1+2=3\n\n  3+9=3 \nA4"  # the blank line is not counted, spaces are stripped
    assert sums.step_line(completion, 1) == (1, 2, 3)
    assert sums.step_line(completion, 2) == (3, 9, 3)
    assert sums.step_line(completion, 3) is None  # the answer line is no step line
    assert sums.step_line(completion, 0) is None and sums.step_line(completion, 4) is None


def test_step_checker_maps_lines_to_thoughts_and_blames_a_missing_answer_on_the_last():
    thoughts = ["3+5=8", "", "8+2=1", "1+8=9", "9+1=0", "A0"]  # an empty thought holds no line
    assert sums.step_checker(Q, thoughts) == 3
    assert sums.step_checker(Q, ["3+5=8", "8+2=0"]) == 2  # no answer: one past the last line -> the last thought
    assert sums.step_checker(Q, FORWARD.split("\n")) is None
    assert sums.step_checker(Q, []) is None


def test_rewards_on_hand_written_completions():
    completions = [FORWARD, BACKWARD, "3+5=8\n8+2=1\n1+8=9\n9+1=0\nA0", "A9", "3+5=8 A9", "3+5=8\nA9\n"]
    assert sums.accuracy_reward(completions, ["9"] * 6) == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    # format: >= 1 step line, then A<d> last; the arithmetic is not checked
    assert sums.format_reward(completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]


def test_step_rewards_are_one_up_to_the_first_wrong_step():
    slipped = "3+5=8\n8+2=1\n1+8=9\n9+1=0\nA0"
    assert sums.step_rewards(Q, FORWARD, FORWARD.split("\n")) == [1.0] * 5
    assert sums.step_rewards(Q, slipped, slipped.split("\n")) == [1.0, 0.0, 0.0, 0.0, 0.0]
    # no answer: wrong one past the last line, charged to the last step
    assert sums.step_rewards(Q, "3+5=8\n8+2=0", ["3+5=8", "8+2=0"]) == [1.0, 0.0]
    # the process credit finds it by name
    from trl_credit.process.step_rewards import resolve_step_reward

    assert resolve_step_reward("sums")(Q, slipped, slipped.split("\n"))[:2] == [1.0, 0.0]


def test_structures_and_partition():
    assert sums.solution_structure(Q, FORWARD) == "forward"
    assert sums.solution_structure(Q, BACKWARD) == "backward"
    assert sums.solution_structure(Q, "5+3=8\nA9") == "other"
    assert sums.structure_partition([FORWARD, BACKWARD, FORWARD], Q) == ["forward", "backward", "forward"]


def test_solve_slips_one_step_and_continues_from_the_wrong_value():
    problem = sums.SumsProblem((3, 5, 2, 8, 1))
    assert sums.solve(problem, "forward", slip_at=2) == [(3, 5, 8), (8, 2, 1), (1, 8, 9), (9, 1, 0)]
    assert sums.solve(problem, "backward") == [(1, 8, 9), (9, 2, 1), (1, 5, 6), (6, 3, 9)]


def test_sft_mix_has_its_kinds_and_localization_labels_are_the_first_wrong_step():
    rng = random.Random(3)
    problems = sums.make_problems(600, rng)
    examples = testbed_model.sft_examples(problems, rng)
    oracle = [e for e in examples if "\nT" in e[0]]
    localization = [e for e in examples if e[0].startswith("L")]
    plain = [e for e in examples if e not in oracle and e not in localization]
    assert 0.15 < len(oracle) / 600 < 0.25 and 0.2 < len(localization) / 600 < 0.3
    for prompt, completion in oracle:  # error-free, answer given in the prompt
        assert sums.first_wrong_step(prompt, completion) is None and prompt.split("\n")[1] == "T" + completion[-1]
    slipped = [sums.first_wrong_step(p, c) is not None for p, c in plain]
    assert 0.5 < sum(slipped) / len(slipped) < 0.7  # slip_rate 0.6
    backward = [sums.solution_structure(p, c) == "backward" for p, c in plain]
    assert 0.08 < sum(backward) / len(backward) < 0.22  # backward_rate 0.15
    for prompt, completion in localization:
        head, _, body = prompt.partition("N")
        count, _, steps = body.partition("\n")
        thoughts = [line.split(": ", 1)[1] for line in steps.strip("\n").split("\n")]
        assert int(count) == len(thoughts)
        # the label is what a plain loop over the lines finds: the first line whose sum is wrong (or the answer)
        expected = sums.step_checker(head[1:], thoughts)
        assert completion == f"\\boxed{{{expected}}}" and parse_reset_step(completion, len(thoughts)) == expected


def test_slips_favour_carry_steps():
    rng = random.Random(0)
    steps = [(3, 5, 8), (8, 2, 0), (0, 8, 8), (8, 1, 9)]  # step 2 (8 + 2 = 10) is the only carry
    draws = [testbed_model._slip_step(steps, rng, carry_weight=4.0) for _ in range(7000)]
    assert abs(draws.count(2) / len(draws) - 4 / 7) < 0.03  # weight 4 against 1 + 1 + 1


def test_tokenizer_round_trips_every_prompt_kind():
    tokenizer = make_tokenizer()
    texts = [Q + FORWARD, Q + "T9\n", localization_prompt(Q, FORWARD.split("\n"), sums.LOCALIZATION_TEMPLATE)
             + "\\boxed{2}"]
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == len(text) and tokenizer.pad_token_id not in ids  # one token per character, none unknown
        assert tokenizer.decode(ids) == text
    assert tokenizer.decode([*tokenizer.encode("A9", add_special_tokens=False), tokenizer.eos_token_id],
                            skip_special_tokens=True) == "A9"
    assert len(set(VOCAB)) == len(VOCAB)


def test_pass_at_k_unbiased_estimator():
    # n=4, c=1: pass@1 = 1/4, pass@2 = 1 - (3/4)(2/3) = 1/2, pass@4 = 1
    assert runner.pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert runner.pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert runner.pass_at_k(4, 1, 4) == 1.0 and runner.pass_at_k(4, 0, 4) == 0.0


REDUCED = Recipe(steps=30, hidden_size=32, intermediate_size=64, num_heads=2, num_layers=1, batch_size=16,
                 num_train=200, num_test=32, warmup_steps=5)


@pytest.fixture(scope="module")
def reduced_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("testbed_cache")
    import os

    previous = os.environ.get("TRL_CREDIT_CACHE")
    os.environ["TRL_CREDIT_CACHE"] = str(root)
    try:
        yield testbed_model_path(REDUCED)
    finally:
        if previous is None:
            os.environ.pop("TRL_CREDIT_CACHE")
        else:
            os.environ["TRL_CREDIT_CACHE"] = previous


def test_build_is_deterministic_and_cached_by_recipe(reduced_model, tmp_path):
    import json

    first = json.load(open(f"{reduced_model}/build.json"))
    again = build_model(REDUCED, str(tmp_path / "again"))
    assert again["weights_sha256"] == first["weights_sha256"]
    assert reduced_model.endswith(REDUCED.digest())
    assert Recipe(**{**REDUCED.__dict__, "seed": 1}).digest() != REDUCED.digest()
    other = build_model(Recipe(**{**REDUCED.__dict__, "seed": 1}), str(tmp_path / "other"))
    assert other["weights_sha256"] != first["weights_sha256"]


@pytest.mark.parametrize("method", runner.METHODS)
def test_every_grid_method_trains_two_steps_on_the_reduced_model(method, reduced_model):
    spec = runner.method_spec(method)
    test = sums.make_dataset(200, 16)["test"]
    result = runner.run(spec["trainer"], spec["config"], seed=0, learning_rate=1e-3, steps=2, eval_every=1,
                        eval_samples=2, test=test, model_path=reduced_model, trainer_kwargs=spec["kwargs"],
                        **runner.method_fields(spec, 1e-3))
    assert [point["step"] for point in result["curve"]] == [1, 2] and len(result["logs"]) == 2
    assert 0 < result["curve"][0]["generated_tokens"] < result["curve"][1]["generated_tokens"]
    assert all(log["grad_norm"] == log["grad_norm"] for log in result["logs"])  # no NaN


def test_method_fields_set_prime_prm_rate_at_the_released_ratio_to_the_policy_rate():
    # the released recipe: PRM 1e-6 for a policy at 5e-7, so 2x; every other method's fields do not depend on it
    assert runner.method_fields(runner.method_spec("prime"), 1e-3) == dict(
        credit="implicit_prm", prime_learning_rate=2e-3, prime_prompt_filter=False, prime_grad_clip=1.0)
    for method in set(runner.METHODS) - {"prime"}:
        spec = runner.method_spec(method)
        assert runner.method_fields(spec, 1e-3) == spec["fields"]


def test_evaluation_does_not_change_training(reduced_model):
    spec = runner.method_spec("grpo")
    test = sums.make_dataset(200, 16)["test"]
    kwargs = dict(seed=0, learning_rate=1e-3, steps=3, eval_samples=2, test=test, model_path=reduced_model)
    often = runner.run(spec["trainer"], spec["config"], eval_every=1, **kwargs)
    once = runner.run(spec["trainer"], spec["config"], eval_every=3, **kwargs)
    assert [log["loss"] for log in often["logs"]] == [log["loss"] for log in once["logs"]]
    assert often["curve"][-1]["accuracy"] == once["curve"][-1]["accuracy"]
    assert often["curve"][-1]["generated_tokens"] == once["curve"][-1]["generated_tokens"]


@pytest.mark.slow
def test_grpo_learns_on_the_testbed_model():
    """An end-to-end learning check (verl's tiny-model e2e test in spirit): TRL's GRPOTrainer, 40 steps at the grid's
    GRPO learning rate, raises held-out sampled accuracy well above the starting model's (measured: 0.52 -> 0.88 at
    seed 0; the margin asked is half of that gain). On the committed build the grid used (~1 CPU-minute)."""
    import os

    from transformers import LlamaForCausalLM

    model_path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks", "results", "tiny", "model")
    test = sums.make_dataset()["test"]
    base = runner.evaluate(LlamaForCausalLM.from_pretrained(model_path), make_tokenizer(), test)["accuracy"]
    spec = runner.method_spec("grpo")
    result = runner.run(spec["trainer"], spec["config"], seed=0, learning_rate=3e-4, steps=40, eval_every=40,
                        model_path=model_path)
    assert 0.4 < base < 0.65  # the starting model errs at temperature 1 (slips at carry steps)
    assert result["curve"][-1]["accuracy"] > base + 0.18
