"""The tiny testbed's task: running sums mod 10, one checkable step per line, two solution structures.

A problem is a string of 4-7 digits; the answer is their sum mod 10. The prompt is ``S`` + the digits + a newline,
and a solution adds the digits one per line, each line ``x+y=z`` with ``z = (x + y) mod 10``, then an answer line
``A`` + the result::

    S35281            forward (the common structure)      backward (the rare one)
                      3+5=8                               1+8=9
                      8+2=0                               9+2=1
                      0+8=8                               1+5=6
                      8+1=9                               6+3=9
                      A9                                  A9

Both structures are correct: forward adds left to right starting from the first digit, backward right to left
starting from the last. A solution's structure is read off its first line (:func:`solution_structure`), which is
what Cue-GRPO's partition by structure uses (:func:`structure_partition`).

Step checker (:func:`first_wrong_step`): the completion's non-empty lines are steps 1, 2, ...; the first line that
starts with ``A`` is the answer line and the last step. A step line is wrong when it is not ``x+y=z`` with single
digits (``"unparseable"``), when ``x`` is not the previous line's ``z`` (or the structure's first digit) or ``y``
not the structure's next digit (``"off path"``: a skipped, repeated or reordered digit), or when ``z != (x + y) mod
10`` (``"arithmetic"``). The answer line is wrong when its digit is not the answer (``"wrong answer"``, e.g. after an
arithmetic error or a chain that stopped early), any line after it is ``"text after answer"``, and a completion
without an answer line is wrong at ``"no answer"``, one past its last line. None means no line is wrong, and then
:func:`accuracy_reward` is 1.

Training data for the from-scratch model (:func:`trl_credit.testbed.model.sft_examples`) has the base model's flaws built in, at known steps:
60% of the plain solutions carry one arithmetic slip (``z`` off by one) and the chain continues correctly from the
wrong value, so the answer is wrong; the slip lands on a carry step (``x + y >= 10``) four times as often as on
another, so where a sampled solution goes wrong is predictable from its content. 15% of the plain solutions are
backward. The mix also holds oracle-prompted examples (the answer given in the prompt, ``T`` + answer, solution
error-free: OPPO's self-oracle, :data:`ORACLE_TEMPLATE`) and self-localization examples in the form SRPO sends them
(:data:`LOCALIZATION_TEMPLATE`, answered ``\\boxed{k}`` with the first wrong step): so ``SRPOTrainer(reset="self")``
is the paper's method on this model, not a prompt the model never saw.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

__all__ = [
    "ORACLE_TEMPLATE",
    "LOCALIZATION_TEMPLATE",
    "STRUCTURES",
    "SumsProblem",
    "make_problems",
    "make_dataset",
    "solution_lines",
    "solve",
    "check_steps",
    "first_wrong_step",
    "step_line",
    "solution_structure",
    "structure_partition",
    "accuracy_reward",
    "format_reward",
    "step_checker",
    "step_rewards",
    "question_digits",
]

#: OPPO's oracle prompt for this task: appended to the prompt (``oracle_template`` of OPPOConfig).
ORACLE_TEMPLATE = "T{answer}\n"
#: SRPO's self-localization prompt for this task (``localization_template`` of SRPOConfig): ``L``, the problem, the
#: number of steps and the seed's steps as SRPO renders them (``Step 1: 3+5=8`` one per line); the answer the model
#: learned to give is ``\boxed{k}``, k the first wrong step.
LOCALIZATION_TEMPLATE = "L{question}N{num_steps}\n{steps}\n"
STRUCTURES = ("forward", "backward")

_STEP = re.compile(r"^(\d)\+(\d)=(\d)$")
_ANSWER = re.compile(r"^A(\d)$")


@dataclass(frozen=True)
class SumsProblem:
    digits: tuple[int, ...]

    @property
    def question(self) -> str:
        """The prompt: ``S`` + the digits + a newline."""
        return "S" + "".join(map(str, self.digits)) + "\n"

    @property
    def answer(self) -> int:
        return sum(self.digits) % 10

    def order(self, structure: str) -> tuple[int, ...]:
        """The digits in the order ``structure`` adds them."""
        if structure not in STRUCTURES:
            raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}")
        return self.digits if structure == "forward" else self.digits[::-1]


def question_digits(question: str) -> tuple[int, ...]:
    """The digits of a prompt ``S<digits>`` (with or without its newline, or the oracle line after it)."""
    match = re.match(r"^L?S(\d+)", str(question).strip())
    if match is None:
        raise ValueError(f"question {question!r} is not a sums problem: expected 'S' followed by digits")
    return tuple(int(c) for c in match.group(1))


def make_problems(count: int, rng: random.Random, min_digits: int = 4, max_digits: int = 7,
                  exclude: set | None = None) -> list[SumsProblem]:
    """``count`` distinct problems of ``min_digits``-``max_digits`` digits (1-9), none in ``exclude``."""
    exclude = set() if exclude is None else exclude
    seen, problems = set(), []
    while len(problems) < count:
        digits = tuple(rng.randint(1, 9) for _ in range(rng.randint(min_digits, max_digits)))
        if digits in seen or digits in exclude:
            continue
        seen.add(digits)
        problems.append(SumsProblem(digits))
    return problems


def make_dataset(num_train: int = 2000, num_test: int = 256, seed: int = 0):
    """``DatasetDict`` with ``train``/``test`` splits of ``prompt`` (text), ``answer`` (a digit, as text) and
    ``question`` (the prompt): the columns OPPO's oracle and SRPO's localization read. The test split is drawn
    first and the train split excludes it."""
    from datasets import Dataset, DatasetDict

    rng = random.Random(seed)
    test = make_problems(num_test, rng)
    train = make_problems(num_train, rng, exclude={p.digits for p in test})

    def rows(problems):
        return {"prompt": [p.question for p in problems], "question": [p.question for p in problems],
                "answer": [str(p.answer) for p in problems]}

    return DatasetDict(train=Dataset.from_dict(rows(train)), test=Dataset.from_dict(rows(test)))


def solve(problem: SumsProblem, structure: str = "forward", slip_at: int | None = None,
          slip: int = 1) -> list[tuple[int, int, int]]:
    """The step lines ``(x, y, z)`` of a solution; with ``slip_at`` (1-indexed) that step's ``z`` is off by ``slip``
    and the chain continues correctly from the wrong value."""
    order = problem.order(structure)
    steps, x = [], order[0]
    for index, y in enumerate(order[1:], start=1):
        z = (x + y) % 10
        if index == slip_at:
            z = (z + slip) % 10
        steps.append((x, y, z))
        x = z
    return steps


def solution_lines(steps: list[tuple[int, int, int]]) -> list[str]:
    """``x+y=z`` lines and the answer line ``A<z>`` of the last step."""
    return [f"{x}+{y}={z}" for x, y, z in steps] + [f"A{steps[-1][2]}"]


def _lines(completion: str) -> list[str]:
    return [line.strip() for line in str(completion).split("\n") if line.strip()]


def check_steps(question: str, completion: str) -> tuple[int | None, str | None, int]:
    """``(first wrong step, reason, number of step lines)``; ``(None, None, n)`` when no line is wrong (module
    docstring for the reasons)."""
    problem = SumsProblem(question_digits(question))
    lines = _lines(completion)
    alive = {s: problem.order(s) for s in STRUCTURES}  # structures the steps so far agree with
    x = {s: order[0] for s, order in alive.items()}
    step_lines = 0
    for number, line in enumerate(lines, start=1):
        answer = _ANSWER.match(line)
        if answer is not None:
            if int(answer.group(1)) != problem.answer:
                return number, "wrong answer", step_lines
            if number != len(lines):
                return number + 1, "text after answer", step_lines
            return None, None, step_lines
        step = _STEP.match(line)
        if step is None:
            return number, "unparseable", step_lines
        sx, sy, sz = map(int, step.groups())
        on_path = {s: order for s, order in alive.items()
                   if number < len(order) and sx == x[s] and sy == order[number]}
        if not on_path:
            return number, "off path", step_lines
        if sz != (sx + sy) % 10:
            return number, "arithmetic", step_lines
        alive = on_path
        x = {s: sz for s in alive}
        step_lines += 1
    return len(lines) + 1, "no answer", step_lines


def step_line(completion: str, number: int) -> tuple[int, int, int] | None:
    """``(x, y, z)`` of the step line ``x+y=z`` that :func:`check_steps` numbers ``number`` (1-indexed over the
    non-empty lines), or None where that line is no step line or does not exist."""
    lines = _lines(completion)
    step = _STEP.match(lines[number - 1]) if 1 <= number <= len(lines) else None
    return None if step is None else tuple(map(int, step.groups()))


def first_wrong_step(question: str, completion: str) -> int | None:
    """The 1-indexed first wrong line (module docstring), or None."""
    return check_steps(question, completion)[0]


def step_checker(question: str, thoughts: list[str]) -> int | None:
    """SRPO's ``step_checker`` (``(question, thoughts) -> int | None``): the thought holding the first wrong line of a
    chain split at newlines (an empty thought holds none), a missing answer line blamed on the last thought."""
    owner = [k for k, text in enumerate(thoughts, start=1) for line in text.splitlines() if line.strip()]
    if not owner:
        return None
    wrong = first_wrong_step(question, "\n".join(thoughts))
    if wrong is None:
        return None
    return owner[wrong - 1] if wrong <= len(owner) else len(thoughts)


def step_rewards(prompt: str, completion: str, steps: list[str], **row) -> list[float]:
    """The process credit's step rewards (``process_step_reward="sums"``, docs/process.md): 1.0 for every step before
    the checker's first wrong one, 0.0 for it and every step after it (``steps``: the completion's thoughts, the
    answer line the last; a missing answer line is charged to the last step, as :func:`step_checker` does)."""
    if not steps:
        return []
    wrong = step_checker(prompt, list(steps))
    if wrong is None:
        return [1.0] * len(steps)
    return [1.0] * (wrong - 1) + [0.0] * (len(steps) - wrong + 1)


def solution_structure(question: str, completion: str) -> str:
    """``forward``, ``backward`` or ``other``, from the first line (a problem whose two structures share their first
    line, a palindrome's head, reads as forward)."""
    problem = SumsProblem(question_digits(question))
    lines = _lines(completion)
    first = _STEP.match(lines[0]) if lines else None
    if first is not None:
        x, y = int(first.group(1)), int(first.group(2))
        for structure in STRUCTURES:
            order = problem.order(structure)
            if (x, y) == (order[0], order[1]):
                return structure
    return "other"


def structure_partition(completions: list[str], prompt) -> list[str]:
    """Cue-GRPO's ``partition_fn`` (``cue_partition="callable"``): a correct completion's cluster is its structure."""
    return [solution_structure(prompt, text) for text in completions]


def _completion_text(completion) -> str:
    if isinstance(completion, list):  # chat completions: the assistant's content
        return "".join(m.get("content", "") for m in completion)
    return str(completion)


def accuracy_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the first answer line ``A<d>`` gives the answer, else 0.0 (the outcome: intermediate steps are not
    checked, as an outcome verifier does not)."""
    rewards = []
    for completion, truth in zip(completions, answer):
        value = next((m.group(1) for m in map(_ANSWER.match, _lines(_completion_text(completion))) if m), None)
        rewards.append(1.0 if value is not None and value == str(truth) else 0.0)
    return rewards


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when every line but the last is ``x+y=z`` (single digits; the arithmetic is not checked), there is at
    least one, and the last is ``A<d>``; else 0.0."""
    rewards = []
    for completion in completions:
        lines = _lines(_completion_text(completion))
        ok = (len(lines) >= 2 and all(_STEP.match(line) for line in lines[:-1])
              and _ANSWER.match(lines[-1]) is not None)
        rewards.append(1.0 if ok else 0.0)
    return rewards
