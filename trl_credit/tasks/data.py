"""The built-in arithmetic task: seeded, procedurally generated, with a dial for difficulty.

Each row has ``prompt`` (chat format: one user message), ``answer`` (the exact result as a string) and
``question`` (the bare expression). Difficulty is set by ``digits`` (operand size) and ``num_operands``;
``operators`` picks from ``+``/``-``/``*``. Train and test problems never overlap.

Base accuracy of SmolLM2-135M-Instruct (offline default), measured by ``benchmarks/learning/base_accuracy.py``
(16 problems x 4 samples, temperature 0.7, 64 new tokens, which are ``trl-credit-eval``'s sampling defaults; lenient
``final_number_reward``; the default setting measured again with 32 problems x 8 samples: 44.5%, pass@8 87.5%):

    1 digit, 2 operands, ``+`` (the default)   ~47%      1 digit, 2 operands, ``+-``   ~41%
    1 digit, 3 operands, ``+``                 ~2%       2 digits, 2 operands, ``+``   ~8%

The default is the only setting in the useful range for RL (reward variance within groups), but it has only
100 distinct problems, hence the default 80/20 split; ``operators="+-"`` doubles the pool at similar accuracy.
The strict docs/design.md#answer-checking ``accuracy_reward`` scores SmolLM2-135M at ~0% on every setting: the model writes "The final
answer is 11." instead of boxing its answer, so use ``final_number_reward`` for this task.

``load_task_dataset("chain")`` builds the multi-step task of :mod:`trl_credit.tasks.chain` instead: chains of 3-6
checkable steps, one per line, with a step checker (``first_wrong_step``) that gives each wrong completion its
first wrong step; see docs/testbed.md.
"""

from __future__ import annotations

import random

from trl_credit.tasks.chain import CHAIN_DATASET, make_chain_dataset

__all__ = ["ARITHMETIC_INSTRUCTION", "make_arithmetic_problems", "make_arithmetic_dataset", "load_task_dataset"]

ARITHMETIC_INSTRUCTION = "What is {question}? Put the final answer in \\boxed{{}}."

BUILTIN_DATASET = "arithmetic"


def make_arithmetic_problems(
    num_problems: int,
    digits: int = 1,
    num_operands: int = 2,
    operators: str = "+",
    seed: int = 0,
    exclude: set[str] | None = None,
) -> list[tuple[str, str]]:
    """``num_problems`` distinct ``(question, answer)`` pairs, e.g. ``("3 + 4", "7")``; deterministic in ``seed``."""
    if isinstance(num_problems, bool) or not isinstance(num_problems, int) or num_problems < 0:
        raise ValueError(f"num_problems must be an integer >= 0, got {num_problems!r}")
    if digits < 1 or num_operands < 2:
        raise ValueError(f"digits must be >= 1 and num_operands >= 2, got digits={digits}, num_operands={num_operands}")
    if not operators or set(operators) - set("+-*"):
        raise ValueError(f"operators must be a non-empty string over '+-*', got {operators!r}")
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = 10**digits - 1
    distinct_possible = len(set(operators)) ** (num_operands - 1) * (high - low + 1) ** num_operands
    exclude = exclude or set()
    if num_problems > distinct_possible - len(exclude):
        raise ValueError(
            f"Asked for {num_problems} distinct problems but only {distinct_possible - len(exclude)} exist at "
            f"digits={digits}, num_operands={num_operands}, operators={operators!r}"
            + (f" once the {len(exclude)} excluded (test) problems are removed" if exclude else "")
            + "; ask for fewer or raise digits/num_operands/operators."
        )
    rng = random.Random(seed)
    seen = set(exclude)
    problems = []
    while len(problems) < num_problems:
        numbers = [rng.randint(low, high) for _ in range(num_operands)]
        ops = [rng.choice(operators) for _ in range(num_operands - 1)]
        question = str(numbers[0]) + "".join(f" {op} {n}" for op, n in zip(ops, numbers[1:]))
        if question in seen:
            continue
        seen.add(question)
        # eval on a string we built from digits and +-* only: standard precedence, exact integers.
        problems.append((question, str(eval(question))))  # noqa: S307
    return problems


def make_arithmetic_dataset(
    num_train: int = 80,
    num_test: int = 20,
    digits: int = 1,
    num_operands: int = 2,
    operators: str = "+",
    seed: int = 0,
    instruction: str = ARITHMETIC_INSTRUCTION,
    system_prompt: str | None = None,
):
    """A ``datasets.DatasetDict`` with disjoint ``train``/``test`` splits of arithmetic problems."""
    from datasets import Dataset, DatasetDict

    if "{question}" not in instruction:
        raise ValueError(f"instruction must contain the placeholder '{{question}}', got {instruction!r}")
    test = make_arithmetic_problems(num_test, digits, num_operands, operators, seed=seed + 1)
    train = make_arithmetic_problems(
        num_train, digits, num_operands, operators, seed=seed, exclude={q for q, _ in test}
    )

    def rows(problems):
        prompts = []
        for question, _ in problems:
            messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
            messages.append({"role": "user", "content": instruction.format(question=question)})
            prompts.append(messages)
        return {
            "prompt": prompts,
            "answer": [answer for _, answer in problems],
            "question": [question for question, _ in problems],
        }

    return DatasetDict({"train": Dataset.from_dict(rows(train)), "test": Dataset.from_dict(rows(test))})


def load_task_dataset(dataset_name: str | None = BUILTIN_DATASET, dataset_config: str | None = None, **builtin_kwargs):
    """``"arithmetic"`` (or None) builds the built-in arithmetic task, ``"chain"`` the built-in multi-step task
    (:func:`trl_credit.tasks.chain.make_chain_dataset`; ``builtin_kwargs`` go to the builder); any other name goes to
    ``datasets.load_dataset``."""
    if dataset_name in (None, "", BUILTIN_DATASET):
        return make_arithmetic_dataset(**builtin_kwargs)
    if dataset_name == CHAIN_DATASET:
        return make_chain_dataset(**builtin_kwargs)
    from datasets import load_dataset

    return load_dataset(dataset_name, dataset_config)
