"""Answer extraction, normalization and reward functions (docs/design.md#answer-checking, Cue-GRPO Appendix C)."""

import pytest

from trl_credit.tasks.rewards import (
    accuracy_reward,
    completion_text,
    extract_boxed,
    extract_final_answer,
    extract_final_number,
    final_number_reward,
    is_correct,
    math_verify_reward,
    normalize_answer,
)


def chat(text):
    return [{"role": "assistant", "content": text}]


# ---------------------------------------------------------------------------------------------------- extraction


def test_extract_boxed_nested_braces():
    assert extract_boxed(r"so the answer is \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{\left\{1, 2\right\}}") == r"\left\{1, 2\right\}"
    assert extract_boxed(r"\boxed{{a}{b}}") == "{a}{b}"


def test_extract_boxed_takes_the_last_balanced_one():
    assert extract_boxed(r"\boxed{1} then \boxed{2}") == "2"
    # The last \boxed is cut off (truncated generation): fall back to the previous balanced one.
    assert extract_boxed(r"\boxed{5} and finally \boxed{\frac{7}{2}") == "5"
    assert extract_boxed(r"only \boxed{7 unbalanced") is None
    assert extract_boxed("no box here") is None
    assert extract_boxed(r"\fbox{9}") == "9"
    assert extract_boxed(r"\boxed {3}") == "3"


def test_extract_final_answer_boxed_else_last_nonempty_line():
    assert extract_final_answer("Work.\n\\boxed{12}\nDone.") == "12"
    assert extract_final_answer("Step 1\n\n  The answer: 42  \n\n   \n") == "The answer: 42"
    assert extract_final_answer(r"\boxed{7" + "\nlast line") == "last line"  # unbalanced box: line fallback
    assert extract_final_answer("") is None
    assert extract_final_answer(" \n \n") is None


def test_completion_text_string_chat_and_blocks():
    assert completion_text("plain") == "plain"
    assert completion_text(chat("hi")) == "hi"
    # Only assistant turns are the model's answer; several assistant turns are joined by newlines.
    messages = [
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "tool output 99"},
        {"role": "assistant", "content": "b"},
    ]
    assert completion_text(messages) == "a\nb"
    blocks = [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]
    assert completion_text([{"role": "assistant", "content": blocks}]) == "xy"
    assert completion_text([{"role": "assistant", "content": None}]) == ""
    assert completion_text(None) == ""
    assert completion_text({"role": "assistant", "content": "single"}) == "single"


# ---------------------------------------------------------------------------------------------------- normalization


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("$x = 3$", "3"),  # dollar signs, leading variable assignment
        ("y=-2", "-2"),
        (r"\(5\)", "5"),
        (r"\text{5}", "5"),  # LaTeX text wrapper
        (r"\textbf{\text{Yes}}", "yes"),  # nested wrappers, lowercase
        (r"\mathrm{cm}", "cm"),
        (r"50\%", "50"),  # percent signs
        ("50%", "50"),
        ("  Hello   World  ", "hello world"),  # whitespace and case
        ("1 and 2", "1,2"),  # "and" -> ","
        ("1 AND 2", "1,2"),
        ("1,, 2", "1,2"),  # duplicate commas
        ("1 , 2 ,", "1,2"),
        ("1,000", "1000"),  # a thousands separator is not a list comma
        (r"\left( 1, 2 \right)", "(1,2)"),
        ("[ 1 ,  2 ]", "[1,2]"),
        (r"3\,000", "3 000"),
        ("3.", "3"),  # trailing period
        ("band", "band"),  # "and" only as a whole word
        (None, ""),
        ("", ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_is_correct_compares_normalized_forms():
    assert is_correct(r"The result is \boxed{x = 3}", "3")
    assert is_correct("so\n$50\\%$", "50")
    assert not is_correct(r"\boxed{4}", "3")
    assert not is_correct("", "3")
    assert not is_correct(r"\boxed{3}", None)
    assert not is_correct(r"\boxed{}", "")  # empty answers never match


# ---------------------------------------------------------------------------------------------------- rewards


def test_accuracy_reward_strings_and_chat():
    completions = [
        r"Adding gives \boxed{7}.",
        chat(r"I think \boxed{8}"),
        chat("Work...\n7"),  # last non-empty line
        "The answer is 7",  # last line is a sentence, not the answer: strict checker says no
        r"\boxed{7",  # unbalanced, and the last line is not "7" either
        "",
        None,
    ]
    assert accuracy_reward(completions, answer=["7"] * 7) == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_accuracy_reward_never_raises_on_model_output():
    weird = [r"\boxed{", "}}}{{{", "\\", "$$", "\x00", r"\boxed{\text{", "and and ,,,", chat(None)]
    assert accuracy_reward(weird, answer=["1"] * len(weird)) == [0.0] * len(weird)


def test_accuracy_reward_argument_errors():
    with pytest.raises(ValueError, match="answer` column"):
        accuracy_reward(["1"])
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        accuracy_reward(["1", "2"], answer=["1"])


def test_final_number_reward():
    completions = [
        "3 + 4 = 7.",  # last number in the text
        r"\boxed{7} (and 8 is wrong)",  # the boxed answer wins over later numbers
        "The answer is 7.0",  # numeric comparison
        "7 apples, then 8",
        "no digits here",
        None,
        chat("Answer: 1,007"),  # thousands separator
    ]
    assert final_number_reward(completions, answer=["7", "7", "7", "7", "7", "7", "1007"]) == [
        1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0
    ]
    assert final_number_reward(["-3"], answer=["-3"]) == [1.0]
    assert final_number_reward(["so 5-8=-3"], answer=["-3"]) == [1.0]
    assert final_number_reward(["-0"], answer=["0"]) == [1.0]
    # A reference that is not exactly one number cannot be checked numerically: 0, not a crash.
    assert final_number_reward(["3"], answer=["three"]) == [0.0]
    assert final_number_reward(["3"], answer=[None]) == [0.0]
    # Exact for large integers (as floats, 2**53 + 1 == 2**53).
    assert final_number_reward([str(2**53)], answer=[str(2**53 + 1)]) == [0.0]
    assert final_number_reward([str(2**53 + 1)], answer=[str(2**53 + 1)]) == [1.0]


def test_extract_final_number():
    assert extract_final_number("a 1 b 2.50") == "2.5"
    assert extract_final_number(r"\boxed{12} 13") == "12"
    assert extract_final_number("007") == "7"
    assert extract_final_number("") is None
    assert extract_final_number(None) is None
    assert extract_final_number("none") is None


def test_math_verify_reward_accepts_equivalent_forms():
    completions = [
        r"\boxed{0.5}",
        r"\boxed{\frac{2}{4}}",
        r"\boxed{\dfrac{1}{2}}",
        r"\boxed{0.6}",
        r"\boxed{\frac{",  # broken LaTeX: wrong, no exception
        "",
        None,
    ]
    answers = [r"\frac{1}{2}"] * len(completions)
    assert math_verify_reward(completions, answer=answers) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    # The strict checker does not accept 0.5 for \frac{1}{2}: math-verify is what adds the equivalence.
    assert accuracy_reward(completions[:1], answer=answers[:1]) == [0.0]
    assert math_verify_reward([chat(r"\boxed{x = 3}")], answer=["3"]) == [1.0]
    assert math_verify_reward([r"\boxed{3}"], answer=[None]) == [0.0]
    with pytest.raises(ValueError, match="answer` column"):
        math_verify_reward(["1"])
