"""The built-in multi-step task ``chain``: short arithmetic chains solved one checkable step per line.

A problem is a *core* followed by 2-3 operations applied in order (3-6 steps), e.g.::

    6 * 3 + 6 * 5, then subtract 7, then add 4

The core is either a plain ``a op b`` (``12 - 3``) or a distributive ``a * b + a * c`` / ``a * b - a * c``, which
has two equally valid solution structures: term by term (``6 * 3 = 18``, ``6 * 5 = 30``, ``18 + 30 = 48``) or
factored (``3 + 5 = 8``, ``6 * 8 = 48``). Numbers are small (operands up to 9, multipliers 2-3, every
intermediate value in ``[0, 60]`` by default) because a 135M model's arithmetic is weak (docs/testbed.md has the
warm-started model's accuracy). The expected completion (the prompt says exactly this, :data:`CHAIN_INSTRUCTION`)
is one step ``x op y = z`` per line and a last line ``\\boxed{N}``::

    6 * 3 = 18
    6 * 5 = 30
    18 + 30 = 48
    48 - 7 = 41
    41 + 4 = 45
    \\boxed{45}

Rows have ``prompt`` (one user message), ``answer`` and ``question`` like the arithmetic task, so
``accuracy_reward`` (the boxed answer) scores it; train and test problems never overlap.

Step checker (:func:`check_steps`, :func:`first_wrong_step`). The completion's non-empty lines, stripped, are
numbered from 1; the first line containing ``\\boxed{`` is the *answer line* and counts as the last step. Line ``k``
is wrong, with the first reason that applies, when it is

- ``"unparseable"``: before the answer line and not exactly ``x op y = z`` (integers, ``op`` one of ``+ - *``,
  optional trailing period): garbage, prose, ``Step 1: ...``;
- ``"arithmetic"``: ``x op y != z``;
- ``"unknown number"``: ``x`` or ``y`` is neither a number written in the question nor the result ``z`` of an
  earlier line;
- ``"off path"``: the steps so far are not the beginning of any correct solution, i.e. of the plain or one of the
  two structures above, following the operations in the order given (``+`` and ``*`` steps may swap operands, the
  two products of the term-by-term structure may come in either order). This catches a skipped or repeated
  operation, operations done out of order, and ``a * b * c`` for ``a * (b + c)``, even when each step is true;
- ``"wrong answer"``: the answer line, when its boxed value is not the answer (e.g. after a chain that stopped
  early). It is checked against the answer only: a right answer after right steps is right even when the last
  operation has no line of its own;
- ``"text after answer"``: any non-empty line after the answer line.

A completion without an answer line is wrong at ``"no answer"``, step ``len(lines) + 1`` (the missing final step;
one past the last line). :func:`first_wrong_step` is None exactly when no line is wrong, and then the boxed answer
is right: a None here always means reward 1 from ``accuracy_reward``. With one step per line, SRPO's thoughts
(``thought_delimiter="\\n"``) and DATPO's PySBD sentences are the lines, so step ``k`` is thought/sentence ``k``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from trl_credit.tasks.rewards import completion_text, extract_boxed

__all__ = [
    "CHAIN_DATASET",
    "CHAIN_INSTRUCTION",
    "ChainProblem",
    "parse_question",
    "make_chain_problems",
    "make_chain_dataset",
    "chain_solutions",
    "solution_text",
    "check_steps",
    "first_wrong_step",
    "StepVerdict",
    "chain_format_reward",
]

#: The task's name for ``--dataset_name`` (``trl_credit.tasks.data.load_task_dataset``, which imports it from here).
CHAIN_DATASET = "chain"

CHAIN_INSTRUCTION = (
    "Compute {question}. Write one step per line as `x op y = z` (op: +, -, *), then the answer as \\boxed{{N}}."
)

_VERBS = {"+": "add", "-": "subtract", "*": "multiply by"}
_OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}


@dataclass(frozen=True)
class ChainProblem:
    """``core`` is ``(a, op, b)`` (plain) or ``(a, op, b, c)`` meaning ``a * b op a * c`` (distributive, op +/-);
    ``ops`` the ``(op, y)`` applied afterwards, in order."""

    core: tuple
    ops: tuple

    @property
    def distributive(self) -> bool:
        return len(self.core) == 4

    @property
    def question(self) -> str:
        if self.distributive:
            a, op, b, c = self.core
            text = f"{a} * {b} {op} {a} * {c}"
        else:
            text = "{} {} {}".format(*self.core)
        return text + "".join(f", then {_VERBS[op]} {y}" for op, y in self.ops)

    @property
    def answer(self) -> int:
        return chain_solutions(self)[0][-1][3]


_CORE = re.compile(r"^(\d+) \* (\d+) ([+-]) (\d+) \* (\d+)$|^(\d+) ([-+*]) (\d+)$")
_THEN = re.compile(r"^then (add|subtract|multiply by) (\d+)$")


def parse_question(question: str) -> ChainProblem:
    """The :class:`ChainProblem` a ``question`` string (as written by :attr:`ChainProblem.question`) describes."""
    parts = [part.strip() for part in str(question).split(",")]
    core = _CORE.match(parts[0])
    ops = [_THEN.match(part) for part in parts[1:]]
    if core is None or not all(ops) or (core.group(1) and core.group(1) != core.group(4)):
        raise ValueError(
            f"question {question!r} is not a chain problem: expected 'a op b' or 'a * b +/- a * c' followed by "
            "', then add|subtract|multiply by N' clauses"
        )
    if core.group(1):
        parsed_core = (int(core.group(1)), core.group(3), int(core.group(2)), int(core.group(5)))
    else:
        parsed_core = (int(core.group(6)), core.group(7), int(core.group(8)))
    verbs = {verb: op for op, verb in _VERBS.items()}
    return ChainProblem(parsed_core, tuple((verbs[m.group(1)], int(m.group(2))) for m in ops))


def _step(x: int, op: str, y: int) -> tuple[int, str, int, int]:
    return (x, op, y, _OPS[op](x, y))


def chain_solutions(problem: ChainProblem) -> list[list[tuple[int, str, int, int]]]:
    """The correct solutions as lists of steps ``(x, op, y, z)``: the plain one, or for a distributive core the
    term-by-term one (products in the written order) first, then the factored one."""
    if problem.distributive:
        a, op, b, c = problem.core
        term = [_step(a, "*", b), _step(a, "*", c)]
        term.append(_step(term[0][3], op, term[1][3]))
        factored = [_step(b, op, c)]
        factored.append(_step(a, "*", factored[0][3]))
        heads = [term, factored]
    else:
        heads = [[_step(*problem.core)]]
    solutions = []
    for head in heads:
        steps = list(head)
        for op, y in problem.ops:
            steps.append(_step(steps[-1][3], op, y))
        solutions.append(steps)
    return solutions


def solution_text(problem: ChainProblem, structure: str = "term") -> str:
    """The completion of a correct solution: ``structure`` ``"term"`` or ``"factored"`` (distributive cores only;
    a plain core has one structure and ignores it)."""
    if structure not in ("term", "factored"):
        raise ValueError(f"structure must be 'term' or 'factored', got {structure!r}")
    solutions = chain_solutions(problem)
    steps = solutions[1] if structure == "factored" and problem.distributive else solutions[0]
    return "\n".join(f"{x} {op} {y} = {z}" for x, op, y, z in steps) + f"\n\\boxed{{{steps[-1][3]}}}"


def _factor_friendly_pairs(max_operand: int) -> dict[str, list[tuple[int, int]]]:
    """The ``(b, c)`` of a factor-friendly distributive core: ``b + c = 10`` or ``b - c`` in 1..2, distinct operands
    in ``2..max_operand``."""
    operands = range(2, max_operand + 1)
    return {"+": [(b, c) for b in operands for c in operands if b != c and b + c == 10],
            "-": [(b, c) for b in operands for c in operands if b - c in (1, 2)]}


def _random_problem(rng: random.Random, min_ops: int, max_ops: int, max_value: int, max_operand: int,
                    distributive_fraction: float, friendly_pairs: dict | None = None) -> ChainProblem:
    while True:
        if rng.random() < distributive_fraction:
            a, op = rng.randint(2, 5), rng.choice("+-")
            if friendly_pairs:  # factor_friendly: _factor_friendly_pairs, built once per make_chain_problems
                b, c = rng.choice(friendly_pairs[op])
            else:
                b, c = sorted(rng.sample(range(2, max_operand + 1), 2), reverse=True)  # b > c: a * (b - c) > 0
                if op == "+" and rng.random() < 0.5:
                    b, c = c, b
            core = (a, op, b, c)
        else:
            op = rng.choice("+-*")
            if op == "*":
                core = (rng.randint(2, 9), op, rng.randint(2, 5))
            else:
                core = (rng.randint(max_operand + 1, max_value // 2), op, rng.randint(2, max_operand))
        value = ChainProblem(core, ()).answer
        if value > max_value:
            continue
        ops = []
        for _ in range(rng.randint(min_ops, max_ops)):
            choices = [("+", rng.randint(2, max_operand)), ("-", rng.randint(2, max_operand)), ("*", rng.randint(2, 3))]
            # "+ y" and "- y" cannot both leave [0, max_value]: max_value >= 2 * max_operand
            feasible = [(o, y) for o, y in choices if 0 <= _OPS[o](value, y) <= max_value]
            o, y = rng.choice(feasible)
            value = _OPS[o](value, y)
            ops.append((o, y))
        return ChainProblem(core, tuple(ops))


def make_chain_problems(
    num_problems: int,
    seed: int = 0,
    min_ops: int = 2,
    max_ops: int = 3,
    max_value: int = 60,
    max_operand: int = 9,
    distributive_fraction: float = 0.5,
    exclude: set[str] | None = None,
    factor_friendly: bool = False,
) -> list[ChainProblem]:
    """``num_problems`` distinct problems (by question), none of whose question is in ``exclude``; deterministic in
    ``seed``. ``min_ops``..``max_ops`` operations follow the core: add or subtract ``2..max_operand``, multiply by
    2 or 3; every intermediate value stays in ``[0, max_value]``. ``distributive_fraction`` of the cores are
    ``a * b +/- a * c`` (``a`` in 2..5, ``b``, ``c`` in ``2..max_operand``: two solution structures); the others
    ``a +/- b`` (``a`` up to ``max_value // 2``, ``b`` up to ``max_operand``) or ``a * b`` (``a`` up to 9, ``b``
    up to 5). ``factor_friendly`` keeps only distributive cores whose factored structure is the easy one (``b + c =
    10``, or ``b - c`` is 1 or 2: ``5 * 7 - 5 * 6`` is ``5 * 1``, or ``35 - 30`` term by term), so that the choice of
    structure changes how hard the problem is (docs/testbed.md); the default draws are unchanged."""
    if isinstance(num_problems, bool) or not isinstance(num_problems, int) or num_problems < 0:
        raise ValueError(f"num_problems must be an integer >= 0, got {num_problems!r}")
    if not 1 <= min_ops <= max_ops:
        raise ValueError(f"need 1 <= min_ops <= max_ops, got min_ops={min_ops}, max_ops={max_ops}")
    if max_operand < 3:
        raise ValueError(f"max_operand must be >= 3 (two distinct operands from 2), got {max_operand}")
    if max_value < max(2 * max_operand + 2, 45):
        raise ValueError(
            f"max_value must be >= max(2 * max_operand + 2, 45) (room for every core and step), got {max_value}"
        )
    if not 0 <= distributive_fraction <= 1:
        raise ValueError(f"distributive_fraction must be in [0, 1], got {distributive_fraction}")
    if factor_friendly and max_operand < 6:
        raise ValueError(f"factor_friendly needs max_operand >= 6 (b + c = 10 with distinct b, c), got {max_operand}")
    friendly_pairs = _factor_friendly_pairs(max_operand) if factor_friendly else None
    rng = random.Random(seed)
    seen = set(exclude or ())
    problems = []
    while len(problems) < num_problems:  # the pool holds millions of problems: collisions are rare
        problem = _random_problem(rng, min_ops, max_ops, max_value, max_operand, distributive_fraction,
                                  friendly_pairs)
        if problem.question not in seen:
            seen.add(problem.question)
            problems.append(problem)
    return problems


def make_chain_dataset(
    num_train: int = 1000,
    num_test: int = 200,
    seed: int = 0,
    min_ops: int = 2,
    max_ops: int = 3,
    max_value: int = 60,
    max_operand: int = 9,
    distributive_fraction: float = 0.5,
    instruction: str = CHAIN_INSTRUCTION,
    system_prompt: str | None = None,
    factor_friendly: bool = False,
):
    """A ``datasets.DatasetDict`` with disjoint ``train``/``test`` splits (``prompt``, ``answer``, ``question``).

    The test split is drawn first with ``seed + 1`` so its first m problems do not depend on ``num_train``."""
    from datasets import Dataset, DatasetDict

    if "{question}" not in instruction:
        raise ValueError(f"instruction must contain the placeholder '{{question}}', got {instruction!r}")
    settings = dict(min_ops=min_ops, max_ops=max_ops, max_value=max_value, max_operand=max_operand,
                    distributive_fraction=distributive_fraction, factor_friendly=factor_friendly)
    test = make_chain_problems(num_test, seed=seed + 1, **settings)
    train = make_chain_problems(num_train, seed=seed, exclude={p.question for p in test}, **settings)

    def rows(problems):
        prompts = []
        for problem in problems:
            messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
            messages.append({"role": "user", "content": instruction.format(question=problem.question)})
            prompts.append(messages)
        return {
            "prompt": prompts,
            "answer": [str(p.answer) for p in problems],
            "question": [p.question for p in problems],
        }

    return DatasetDict({"train": Dataset.from_dict(rows(train)), "test": Dataset.from_dict(rows(test))})


# --------------------------------------------------------------------------------------------------------------
# Step checker
# --------------------------------------------------------------------------------------------------------------

_STEP = re.compile(r"^(-?\d+)\s*([-+*])\s*(-?\d+)\s*=\s*(-?\d+)\s*\.?$")


@dataclass(frozen=True)
class StepVerdict:
    """The first wrong line of a completion: ``step`` (1-indexed), ``reason`` (see the module docstring) and the
    number of step lines before the answer line (``num_steps``)."""

    step: int | None
    reason: str | None
    num_steps: int


def _canonical(x: int, op: str, y: int, z: int) -> tuple:
    # + and * steps may be written with their operands either way round.
    return (min(x, y), op, max(x, y), z) if op in "+*" else (x, op, y, z)


def _paths(problem: ChainProblem) -> list[list[tuple]]:
    paths = [[_canonical(*s) for s in steps] for steps in chain_solutions(problem)]
    if problem.distributive:  # the two products of the term-by-term structure in either order
        term = paths[0]
        paths.append([term[1], term[0], *term[2:]])
    return paths


def check_steps(question: str, completion) -> StepVerdict:
    """Check a completion of the chain problem ``question`` line by line (rules in the module docstring)."""
    problem = parse_question(question)
    answer = problem.answer
    lines = [line.strip() for line in completion_text(completion).splitlines() if line.strip()]
    answer_line = next((i for i, line in enumerate(lines) if "\\boxed{" in line), None)
    num_steps = len(lines) if answer_line is None else answer_line
    available = {int(n) for n in re.findall(r"\d+", question)}
    paths = _paths(problem)
    done: list[tuple] = []
    for index, line in enumerate(lines[:num_steps]):
        step = index + 1
        match = _STEP.match(line)
        if match is None:
            return StepVerdict(step, "unparseable", num_steps)
        x, op, y, z = int(match.group(1)), match.group(2), int(match.group(3)), int(match.group(4))
        if _OPS[op](x, y) != z:
            return StepVerdict(step, "arithmetic", num_steps)
        if x not in available or y not in available:
            return StepVerdict(step, "unknown number", num_steps)
        done.append(_canonical(x, op, y, z))
        if not any(path[: len(done)] == done for path in paths):
            return StepVerdict(step, "off path", num_steps)
        available.add(z)
    if answer_line is None:
        return StepVerdict(len(lines) + 1, "no answer", num_steps)
    boxed = (extract_boxed(lines[answer_line]) or "").strip().rstrip(".")
    if not re.fullmatch(r"-?\d+", boxed) or int(boxed) != answer:
        return StepVerdict(answer_line + 1, "wrong answer", num_steps)
    if len(lines) > answer_line + 1:
        return StepVerdict(answer_line + 2, "text after answer", num_steps)
    return StepVerdict(None, None, num_steps)


def first_wrong_step(question: str, completion) -> int | None:
    """1-indexed line of the first wrong step of ``completion`` (a string or chat messages) for the chain problem
    ``question``, or None when every step and the boxed answer hold (rules in the module docstring)."""
    return check_steps(question, completion).step


# --------------------------------------------------------------------------------------------------------------
# Format reward
# --------------------------------------------------------------------------------------------------------------

_ANSWER_LINE = re.compile(r"^\\boxed\{\s*-?\d+\s*\}\s*\.?$")


def _is_chain_format(text: str) -> bool:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (
        len(lines) >= 2
        and all(_STEP.match(line) for line in lines[:-1])
        and _ANSWER_LINE.match(lines[-1]) is not None
    )


def chain_format_reward(completions: list, **kwargs) -> list[float]:
    """The chain task's format reward (``--reward_funcs chain_format``; with ``accuracy`` the default on
    ``--dataset_name chain``): 1.0 when the completion is in the format the prompt asks for, else 0.0.

    In format: at least one step line, every non-empty line but the last is ``x op y = z`` (the step checker's
    grammar, arithmetic not checked), the last is the answer line ``\\boxed{N}`` alone (an integer; optional
    period) and no other line has a ``\\boxed``. So a wrong but well-written chain scores 1 here and 0 on
    ``accuracy``: as with any format reward, keep ``accuracy`` first so that it stays the methods' verifier
    (``success_reward``, docs/design.md). Completions may be strings or chat messages; never raises on model output.
    """
    return [float(_is_chain_format(completion_text(c))) for c in completions]
