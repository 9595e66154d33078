"""credit="process": GRPO's process supervision (DeepSeekMath §4.1.3, docs/process.md). The pure math against the
paper's formula worked by hand (the arithmetic in the comments), the step-reward registry and the chain task's
built-in, and the config fields. Trainer tests on the tiny model: tests/test_process_trainer.py."""

from __future__ import annotations

import math

import pytest

from trl_credit.process.advantages import normalized_step_rewards, token_advantages
from trl_credit.process.step_rewards import (
    STEP_REWARDS,
    chain_step_rewards,
    checked_rewards,
    register_step_reward,
    resolve_step_reward,
)

EPS = 1e-4  # TRL's GRPO: std + 1e-4


# ------------------------------------------------------------------------------------------- the paper's formula
def test_a_group_of_two_completions_by_hand():
    # Completion 1: 8 tokens, steps ending (exclusive) at 3, 5, 8 with step rewards 1, 1, 0.
    # Completion 2: 6 tokens, steps ending at 2, 6 with step rewards 1, 1.
    # R = {1, 1, 0, 1, 1}: mean 4/5; unbiased variance (4 * 0.2² + 0.8²) / 4 = (0.16 + 0.64) / 4 = 0.2, std √0.2.
    s = math.sqrt(0.2) + EPS
    up, down = 0.2 / s, -0.8 / s  # r~ of a 1 and of a 0
    normalized = normalized_step_rewards([[1.0, 1.0, 0.0], [1.0, 1.0]], [0, 0])
    assert normalized[0] == pytest.approx([up, up, down]) and normalized[1] == pytest.approx([up, up])
    # Â_t = sum of r~ over the steps with index(j) >= t (index(j) = end - 1):
    # completion 1: tokens 0-2 (step 1) up + up + down = -0.4 / s; tokens 3-4 (step 2) up + down = -0.6 / s;
    # tokens 5-7 (step 3) down = -0.8 / s. Completion 2: tokens 0-1 up + up = 0.4 / s; tokens 2-5 up = 0.2 / s.
    first = token_advantages([3, 5, 8], normalized[0], 8)
    second = token_advantages([2, 6], normalized[1], 6)
    assert first == pytest.approx([-0.4 / s] * 3 + [-0.6 / s] * 2 + [-0.8 / s] * 3)
    assert second == pytest.approx([0.4 / s] * 2 + [0.2 / s] * 4)
    assert (first[0], second[0]) == pytest.approx((-0.4 / 0.44731359, 0.4 / 0.44731359))


def test_steps_without_a_reward_rows_without_credit_and_other_groups():
    # Group 0: rows 0, 1 (row 1's second step unscored, row 2 not credited: None); group 1: rows 3, 4; row 5 in no
    # group. R_0 = {1, 0, 0.5} (the None left out): mean 0.5, unbiased variance (0.25 + 0.25 + 0) / 2 = 0.25, std 0.5.
    # R_1 = {2, 4}: mean 3, variance (1 + 1) / 1 = 2, std √2.
    s0, s1 = 0.5 + EPS, math.sqrt(2) + EPS
    normalized = normalized_step_rewards(
        [[1.0, 0.0], [0.5, None], None, [2.0], [4.0], [3.0, 1.0]], [0, 0, 0, 1, 1, -1])
    assert normalized[0] == pytest.approx([0.5 / s0, -0.5 / s0])
    assert normalized[1] == [0.0, 0.0]  # 0.5 is the mean: exactly 0; the unscored step adds nothing
    assert normalized[2] == []  # not credited (unscorable, or a ±inf group): no step, advantage 0
    assert normalized[3] == pytest.approx([-1 / s1]) and normalized[4] == pytest.approx([1 / s1])
    assert normalized[5] == [0.0, 0.0]  # in no group (SRPO's fallback rows)
    # A step without a reward adds nothing: row 1 has 0 on every token, before and after its unscored step.
    assert token_advantages([2, 5], normalized[1], 6) == [0.0] * 6


def test_a_group_whose_step_rewards_are_all_equal_gets_zero():
    # 0.7 three times: the float mean is 0.6999999999999998, not 0.7; the group has no spread, so exactly 0 (GRPO).
    assert normalized_step_rewards([[0.7, 0.7], [0.7]], [0, 0]) == [[0.0, 0.0], [0.0]]
    assert normalized_step_rewards([[1.0], [None, None]], [0, 0]) == [[0.0], [0.0, 0.0]]  # one reward in R
    assert normalized_step_rewards([[None], []], [0, 0]) == [[0.0], []]  # R empty
    for scale in ("group", "batch", "none"):
        assert normalized_step_rewards([[1.0, 1.0], [1.0]], [0, 0], scale=scale) == [[0.0, 0.0], [0.0]]


def test_scale_rewards_batch_and_none():
    # Group 0: R = {0, 1} (mean 0.5); group 1: R = {0, 0, 3} (mean 1). "none": r - mean.
    rewards, groups = [[0.0], [1.0], [0.0, 0.0], [3.0]], [0, 0, 1, 1]
    assert normalized_step_rewards(rewards, groups, scale="none") == [[-0.5], [0.5], [-1.0, -1.0], [2.0]]
    # "batch": the group's mean, the std of every step reward of the batch {0, 1, 0, 0, 3}: mean 0.8, unbiased
    # variance (0.64 + 0.04 + 0.64 + 0.64 + 4.84) / 4 = 6.8 / 4 = 1.7.
    b = math.sqrt(1.7) + EPS
    expected = [[-0.5 / b], [0.5 / b], [-1 / b, -1 / b], [2 / b]]
    got = normalized_step_rewards(rewards, groups, scale="batch")
    assert all(g == pytest.approx(e) for g, e in zip(got, expected))
    # "group" for comparison: group 1's std is √3 (variance (1 + 1 + 4) / 2).
    assert normalized_step_rewards(rewards, groups)[3] == pytest.approx([2 / (math.sqrt(3) + EPS)])
    with pytest.raises(ValueError, match="scale must be one of"):
        normalized_step_rewards(rewards, groups, scale="std")


def test_token_advantages_several_steps_at_one_token_and_tokens_after_the_last_step():
    # Steps ending (exclusive) at 2, 4 and 4 (the outcome as a final step shares the last step's end) of a 6-token
    # row: tokens 0-1 get a + b + c, tokens 2-3 get b + c, tokens 4-5 come after every step: 0.
    a, b, c = 0.5, -2.0, 0.25
    assert token_advantages([2, 4, 4], [a, b, c], 6) == [a + b + c] * 2 + [b + c] * 2 + [0.0, 0.0]
    assert token_advantages([], [], 3) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="outside the completion"):
        token_advantages([7], [1.0], 6)


# ------------------------------------------------------------------------------------------- step-reward functions
def test_checked_rewards():
    assert checked_rewards([1, 0.5, None, float("nan")], 4, "'f'", "row 0") == [1.0, 0.5, None, None]
    with pytest.raises(ValueError, match=r"'f' returned 2 rewards for the 3 steps of row 0"):
        checked_rewards([1.0, 0.0], 3, "'f'", "row 0")
    with pytest.raises(ValueError, match="must be finite"):
        checked_rewards([math.inf], 1, "'f'", "row 0")
    with pytest.raises(TypeError, match="a step reward is a float or None"):
        checked_rewards(["good"], 1, "'f'", "row 0")
    with pytest.raises(TypeError, match="must return a list"):
        checked_rewards(1.0, 1, "'f'", "row 0")


@pytest.mark.parametrize("value", ["1.0", "nan", b"1", True, False])
def test_a_string_or_a_bool_step_reward_is_an_error(value):
    # docs/process.md: "a non-number is an error". A string that parses as a number ("1.0" -> 1.0, "nan" -> None) and
    # a bool (True -> 1.0) were accepted silently before: a step checker returning verdicts as text or True/False
    # (wrong type, likely a bug in it) must be told so, not read.
    with pytest.raises(TypeError, match=r"step-reward function 'f' returned .* for a step of row 0; a step reward is a "
                                        r"float or None"):
        checked_rewards([1.0, value], 2, "'f'", "row 0")


def test_numeric_scalars_of_numpy_and_torch_are_numbers():
    import numpy as np
    import torch

    values = [np.float32(0.5), np.int64(1), torch.tensor(0.25), torch.tensor(2), np.float64("nan")]
    assert checked_rewards(values, 5, "'f'", "row 0") == [0.5, 1.0, 0.25, 2.0, None]
    for boolean in (np.bool_(True), torch.tensor(True)):
        with pytest.raises(TypeError, match="a step reward is a float or None"):
            checked_rewards([boolean], 1, "'f'", "row 0")


def test_registry_one_registration_per_function():
    assert resolve_step_reward("chain") is chain_step_rewards  # a "module:function" entry, imported when used
    assert resolve_step_reward(None) is None

    def lengths(prompt, completion, steps, **row):
        return [float(len(step)) for step in steps]

    try:
        assert register_step_reward("test_lengths", lengths) is lengths
        assert resolve_step_reward("test_lengths") is lengths
        register_step_reward("test_lengths", lengths)  # the same function again: no error
        with pytest.raises(ValueError, match="already registered"):
            register_step_reward("test_lengths", chain_step_rewards)

        @register_step_reward("test_decorated")
        def decorated(prompt, completion, steps, **row):
            return [1.0] * len(steps)

        assert resolve_step_reward("test_decorated") is decorated
    finally:
        STEP_REWARDS.pop("test_lengths", None)
        STEP_REWARDS.pop("test_decorated", None)
    with pytest.raises(ValueError, match=r"one of the registered step-reward functions \['chain', 'environment', 'sums'\]"):
        resolve_step_reward("prm")


QUESTION = "11 - 6, then multiply by 3, then add 5, then subtract 6"  # answer 14
STEPS = ["11 - 6 = 5", "5 * 3 = 15", "15 + 5 = 20", "20 - 6 = 14", "\\boxed{14}"]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        (STEPS, [1.0] * 5),  # every step and the answer right
        (["11 - 6 = 5", "5 * 3 = 16", *STEPS[2:]], [1.0, 0.0, 0.0, 0.0, 0.0]),  # arithmetic at step 2: 0 from it on
        (STEPS[:4], [1.0, 1.0, 1.0, 0.0]),  # no answer line: charged to the last step
        ([*STEPS[:4], "\\boxed{15}"], [1.0, 1.0, 1.0, 1.0, 0.0]),  # wrong answer: the answer line's step
        ([*STEPS, "and more"], [1.0] * 5 + [0.0]),  # text after the answer
        (["5 * 3 = 15", *STEPS[1:]], [0.0] * 5),  # off path at step 1
        (["11 - 6 = 5\n5 * 3 = 15", "15 + 5 = 21", "\\boxed{21}"], [1.0, 0.0, 0.0]),  # a step of two lines
        ([], []),
    ],
)
def test_the_chain_step_checker_as_step_rewards(steps, expected):
    completion = "\n".join(steps)
    assert chain_step_rewards(None, completion, steps, question=QUESTION, answer="14") == expected
    # Without a question column the prompt's question is read (the task's instruction around it, chat or text).
    from trl_credit.tasks.chain import CHAIN_INSTRUCTION

    prompt = [{"role": "user", "content": CHAIN_INSTRUCTION.format(question=QUESTION)}]
    assert chain_step_rewards(prompt, completion, steps, answer="14") == expected


# ------------------------------------------------------------------------------------------- config
def _config(**kwargs):
    from trl_credit.config import CreditConfig

    return CreditConfig("my_run", use_cpu=True, **kwargs)


def test_config_fields_defaults_and_checks():
    config = _config(credit="process", process_step_reward="chain", process_thought_delimiter="\\n")
    assert (config.process_step_reward, config.process_thought_delimiter, config.process_outcome) == (
        "chain", "\n", "none")
    assert _config(credit="process").process_step_reward is None  # a callable may come with ProcessCredit(...)
    for kwargs, message in [
        ({"process_step_reward": "prm"}, r"process_step_reward must be None or one of .*\['chain', 'environment', 'sums'\]"),
        ({"process_step_reward": len}, r"process_step_reward must be None or one of"),
        ({"process_thought_delimiter": ""}, "process_thought_delimiter must be a non-empty string"),
        ({"process_outcome": "sum"}, r"process_outcome must be one of 'none' .*'final_step'"),
    ]:
        with pytest.raises(ValueError, match=message):
            _config(credit="process", **kwargs)
    # A process field without the process credit is refused, never silently ignored.
    with pytest.raises(ValueError, match="process_outcome is a field of the 'process' credit, but credit='outcome'"):
        _config(process_outcome="final_step")
    # DATPO's trees carry only the block credit.
    with pytest.raises(ValueError, match="rollout='trees' needs credit='blocks'"):
        _config(rollout="trees", credit="process")


def test_config_from_the_command_line():
    from trl import TrlParser

    from trl_credit.config import CreditConfig

    (config,) = TrlParser(CreditConfig).parse_args_and_config(
        ["--output_dir", "x", "--use_cpu", "--credit", "process", "--process_step_reward", "chain",
         "--process_thought_delimiter", "\\n", "--process_outcome", "final_step", "--modifiers", "cue"])
    assert (config.credit, config.process_step_reward, config.process_thought_delimiter, config.process_outcome,
            config.modifiers) == ("process", "chain", "\n", "final_step", ["cue"])


def test_the_composition_refuses_trees_with_the_process_credit():
    from trl_credit.config import build_part, refusal

    credit = build_part("credit", "process")
    assert credit.name == "process"
    assert "credits assume one completion per row" in refusal("trees", "process", [])
    assert refusal("resets", "process", ["cue"]) is None


def test_the_loss_decides_per_sequence_from_the_rows_sequence_advantages():
    # TRL's per-sequence decisions (off_policy_mask_threshold, VESPO) read each row's sequence advantage while the
    # loss runs (trl_credit/core/anchors.py), as for OPPO; (B, T) advantages without them are refused.
    import torch

    from trl_credit.core.anchors import SEQUENCE_ANCHORS, _sequence_level, batch_sequence_anchors
    from trl_credit.process.parts import ProcessCredit

    assert ProcessCredit.sets_sequence_anchors  # the core hands its anchors to the loss and refuses their absence
    per_token = torch.tensor([[0.5, -0.2], [-1.0, 0.3]])
    with batch_sequence_anchors({"advantages": per_token, SEQUENCE_ANCHORS: torch.tensor([0.3, -0.7])}, "process"):
        assert _sequence_level(per_token).flatten().tolist() == pytest.approx([0.3, -0.7])
    assert torch.equal(_sequence_level(per_token), per_token)  # outside: TRL's per-token decision
    with pytest.raises(RuntimeError, match="process: per-token advantages .* without their rows' sequence anchors"):
        with batch_sequence_anchors({"advantages": per_token}, "process"):
            pass
    with batch_sequence_anchors({"advantages": per_token}):  # a credit without anchors (DATPO's): TRL's decision
        assert torch.equal(_sequence_level(per_token), per_token)


# ------------------------------------------------------------------------------------------- the docs say what the code does
def _process_page():
    import pathlib

    return (pathlib.Path(__file__).resolve().parents[1] / "docs" / "process.md").read_text()


def test_every_built_in_step_reward_is_listed_in_the_help_and_the_docs():
    from trl_credit.process.config import ProcessFields

    built_ins = sorted(name for name, target in STEP_REWARDS.items() if isinstance(target, str))  # "module:function"
    assert {"chain", "sums"} <= set(built_ins)
    help_text = ProcessFields.__dataclass_fields__["process_step_reward"].metadata["help"]
    page = _process_page()
    for name in built_ins:
        assert f"'{name}'" in help_text, name
        assert f"| `{name}` |" in page, name  # a row of the built-ins' table


def test_the_worked_example_of_the_docs_uses_the_std_plus_1e_4():
    # The page's example (test_a_group_of_two_completions_by_hand): s = √0.2 + 1e-4 = 0.4473136; r~ 0.2 / s = 0.4471
    # and -0.8 / s = -1.7885; completion 1's tokens -0.4 / s = -0.8942, -0.6 / s = -1.3413, -1.7885; completion 2's
    # 0.8942 and 0.4471. Without the 1e-4 they would read 0.4472, -1.7889, -0.8944, -1.3416.
    page = _process_page()
    example = page[page.index("Worked example"):page.index("The advantages are a `(B, T)` tensor")]
    for value in ("0.4473", "0.4471", "-1.7885", "-0.8942", "-1.3413", "0.8942"):
        assert value in example, value
    for stale in ("0.447 ", "-1.789", "-0.894 ", "-1.342"):
        assert stale not in example, stale
