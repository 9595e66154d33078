"""Answer extraction, normalization and TRL-style reward functions (docs/design.md#answer-checking, Cue-GRPO Appendix C).

Every reward function here follows TRL's signature ``f(completions, <dataset columns>, **kwargs) -> list[float]``
and accepts both plain-string completions and chat completions (``[{"role": "assistant", "content": ...}]``).
A completion with no parseable answer scores 0; these functions never raise on model output.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

__all__ = [
    "extract_boxed",
    "extract_final_answer",
    "normalize_answer",
    "is_correct",
    "accuracy_reward",
    "math_verify_reward",
    "final_number_reward",
    "completion_text",
    "extract_final_number",
]


def completion_text(completion: Any) -> str:
    """Text of one completion, whether TRL passed a string or a list of chat messages (``None`` -> ``""``)."""
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content", ""))
    if isinstance(completion, Sequence):
        # Chat completion: the assistant turns, in order (tool turns are not the model's answer).
        parts = [
            _content_text(message.get("content", ""))
            for message in completion
            if isinstance(message, dict) and message.get("role", "assistant") == "assistant"
        ]
        return "\n".join(parts)
    return str(completion)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # typed content blocks
        return "".join(block.get("text", "") for block in content if isinstance(block, dict))
    return "" if content is None else str(content)


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or None."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for pos in range(start, len(text)):
            char = text[pos]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[start:pos]
        # Unbalanced (e.g. truncated completion): try the previous \boxed.
    return None


def extract_final_answer(text: str) -> str | None:
    """The last ``\\boxed{}`` with balanced braces, else the last non-empty line; None if the text is empty."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


_LATEX_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox|operatorname|displaystyle)\s*\{([^{}]*)\}")
_LATEX_SPACING = re.compile(r"\\[,;:!]|\\quad|\\qquad|~")
_LEADING_ASSIGNMENT = re.compile(r"^[a-zA-Z]\w*\s*=\s*(?!=)")


def normalize_answer(answer: str | None) -> str:
    """Normalize an answer string for exact-match comparison (Cue-GRPO Appendix C).

    Strips LaTeX wrappers (``$``, ``\\(\\)``, ``\\text{}``, ``\\left/\\right``, spacing commands), a leading
    variable assignment (``x = 3`` -> ``3``), ``%`` signs, a trailing period; normalizes whitespace (runs of
    spaces become one; none around commas or just inside brackets); lowercases;
    replaces the word ``and`` with a comma; deduplicates commas. Returns ``""`` for ``None``.
    """
    if answer is None:
        return ""
    s = str(answer).strip()
    s = s.replace("$", "").replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "")
    previous = None
    while previous != s:  # nested wrappers: \text{\textbf{x}}
        previous = s
        s = _LATEX_WRAPPERS.sub(r"\1", s)
    s = _LATEX_SPACING.sub(" ", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip()
    s = _LEADING_ASSIGNMENT.sub("", s)
    s = s.rstrip(".").strip()
    s = s.lower()
    s = re.sub(r"\band\b", ",", s)
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"\s*,\s*", ",", s)
    # Spaces just inside brackets carry no meaning: "\left( 1, 2 \right)" and "(1, 2)" both become "(1,2)".
    s = re.sub(r"([(\[{])\s+", r"\1", s)
    s = re.sub(r"\s+([)\]}])", r"\1", s)
    s = re.sub(r",{2,}", ",", s).strip(",")
    # Thousands separators in a plain number ("1,000") are not list commas.
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def is_correct(text: str, answer: Any) -> bool:
    """Exact match of the normalized extracted answer against the normalized reference."""
    predicted = extract_final_answer(text)
    if predicted is None or answer is None:
        return False
    normalized = normalize_answer(predicted)
    return bool(normalized) and normalized == normalize_answer(str(answer))


def _check_answers(completions: list, answer: list | None) -> None:
    if answer is None:
        raise ValueError(
            "accuracy_reward needs the reference answers: the dataset must have an `answer` column "
            "(TRL passes every dataset column to reward functions by name)."
        )
    if len(answer) != len(completions):
        raise ValueError(f"accuracy_reward got {len(completions)} completions but {len(answer)} answers.")


def accuracy_reward(completions: list, answer: list | None = None, **kwargs) -> list[float]:
    """1.0 when the extracted, normalized answer equals the normalized reference, else 0.0 (docs/design.md#answer-checking)."""
    _check_answers(completions, answer)
    return [float(is_correct(completion_text(c), a)) for c, a in zip(completions, answer)]


def math_verify_reward(completions: list, answer: list | None = None, **kwargs) -> list[float]:
    """Like :func:`accuracy_reward`, but a mismatch gets a second chance through math-verify's symbolic check.

    ``math_verify.verify(gold, pred)`` is asymmetric: the reference goes first. Its timeouts only work in the
    main thread, so they are disabled here; any parser error counts as wrong.
    """
    _check_answers(completions, answer)
    from math_verify import parse, verify

    rewards = []
    for completion, reference in zip(completions, answer):
        text = completion_text(completion)
        if is_correct(text, reference):
            rewards.append(1.0)
            continue
        predicted = extract_final_answer(text)
        if predicted is None or reference is None:
            rewards.append(0.0)
            continue
        try:
            gold = parse(f"${reference}$", parsing_timeout=None)
            pred = parse(f"${predicted}$", parsing_timeout=None)
            rewards.append(float(bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)))
        except Exception:  # noqa: BLE001 - model output may break any parser; that is a wrong answer, not a crash
            rewards.append(0.0)
    return rewards


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_final_number(text: str | None) -> str | None:
    """The number :func:`final_number_reward` reads: the last number inside the last balanced ``\\boxed{}`` when
    there is one, else the last number anywhere in the text; canonical (``"07.50"`` -> ``"7.5"``), or None.

    Thousands separators are dropped first (``"1,000"`` -> ``1000``).
    """
    if not text:
        return None
    boxed = extract_boxed(text)
    candidates = _NUMBER.findall((boxed if boxed is not None else text).replace(",", ""))
    if not candidates:
        return None
    return _canonical_number(candidates[-1])


def _canonical_number(number: str) -> str:
    # Decimal keeps integers of any size exact (float would merge 2**53 and 2**53 + 1).
    value = Decimal(number)
    if value == value.to_integral_value():
        return str(int(value))  # also maps "-0" to "0"
    return format(value.normalize(), "f")


def final_number_reward(completions: list, answer: list | None = None, **kwargs) -> list[float]:
    """Reward for numeric tasks (the built-in arithmetic task): the ``\\boxed{}`` answer when there is one,
    else the last number anywhere in the text, compared numerically (exactly) with the reference.

    Small models (SmolLM2-135M) rarely box their answer or end on a bare number line, so the strict `accuracy`
    checker (:func:`accuracy_reward`, docs/design.md#answer-checking) gives them almost no signal; this lenient
    reader gives RL one.
    A reference that is not exactly one number scores every completion 0.
    """
    _check_answers(completions, answer)
    rewards = []
    for completion, reference in zip(completions, answer):
        predicted = extract_final_number(completion_text(completion))
        reference_numbers = _NUMBER.findall(str(reference).replace(",", "")) if reference is not None else []
        if predicted is None or len(reference_numbers) != 1:
            rewards.append(0.0)
            continue
        rewards.append(float(predicted == _canonical_number(reference_numbers[0])))
    return rewards
