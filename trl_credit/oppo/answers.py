"""OPPO's ground-truth answers y*: the oracle prompt appends them as text, so each must be a non-empty string or a
finite number. Refused at construction for map-style datasets (naming the row), batch by batch for iterable ones."""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["ANSWER_COLUMNS", "answer_problem", "check_answers", "refuse_answer", "resolve_answer_column"]

#: The columns `answer_column=None` reads, in order: the paper's `answer`, then TRL's `solution` (its datasets and
#: trl.rewards.accuracy_reward).
ANSWER_COLUMNS = ("answer", "solution")


def _dataset_columns(dataset) -> list[str] | None:
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, dict):  # DatasetDict
        return None
    return list(columns) if columns is not None else None


def answer_problem(answer) -> str | None:
    """Why ``answer`` cannot condition the oracle (None when it can): y* is appended to the prompt as text, so it
    must be a non-empty string or a finite number."""
    if answer is None:
        return "is None"
    if isinstance(answer, str):
        return None if answer.strip() else f"is an empty string ({answer!r})"
    if isinstance(answer, numbers.Number):
        try:
            finite = math.isfinite(float(answer))
        except (TypeError, ValueError):  # complex numbers
            return f"is a {type(answer).__name__}, not a real number"
        return None if finite else f"is {answer!r}"
    return f"is a {type(answer).__name__} ({answer!r:.60}), not a string or a number"


def refuse_answer(column: str, where: str, answer, problem: str, who: str = "OPPOTrainer",
                  config: str = "OPPOConfig") -> None:
    """``who`` / ``config``: the trainer (and part, ``trainer_setup.speaker``) and the config class the user built."""
    raise ValueError(
        f"{who}: OPPO conditions its oracle on the ground-truth answer y* from the column `{column}` "
        f"({config}.answer_column), but the answer of {where} {problem}. Every answer must be a non-empty string "
        "or a finite number (a scalar): fix or drop that row (e.g. `dataset.filter(...)`)."
    )


def check_answers(dataset, column: str, argument: str, who: str = "OPPOTrainer", config: str = "OPPOConfig") -> None:
    """Refuse a dataset without the answer column, and empty/None/NaN/non-scalar answers of a map-style dataset, at
    construction, naming the row. Iterable datasets cannot be read ahead: their rows are checked batch by batch,
    before the first step uses them. ``who`` / ``config``: as :func:`refuse_answer`."""
    if dataset is None:
        return
    if isinstance(dataset, dict):
        for name, split in dataset.items():
            check_answers(split, column, f"{argument}[{name!r}]", who, config)
        return
    columns = _dataset_columns(dataset)
    if columns is not None and column not in columns:
        raise ValueError(
            f"{who}: OPPO conditions its oracle on the ground-truth answer, read from the column `{column}` "
            f"({config}.answer_column), but `{argument}` has columns {columns}. Add that column or set "
            f"`answer_column` to the column holding the answers (with an environment_factory that owns the data, "
            f"give a dataset whose rows hold each episode's answer: docs/multiturn.md#oppo)."
        )
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        return
    try:
        import datasets

        if isinstance(dataset, datasets.IterableDataset):
            return
        if isinstance(dataset, datasets.Dataset):
            answers = dataset[column]
        else:
            answers = (dataset[i][column] for i in range(len(dataset)))
    except (KeyError, TypeError):
        return  # no readable column: the column check and TRL report it
    for row, answer in enumerate(answers):
        problem = answer_problem(answer)
        if problem is not None:
            refuse_answer(column, f"row {row} of `{argument}`", answer, problem, who, config)


def resolve_answer_column(args, dataset, who: str = "OPPOTrainer", config: str = "OPPOConfig") -> str:
    """Set ``args.answer_column`` when it is None: ``answer`` if ``dataset`` has that column, else ``solution``;
    say which, once (at construction). An explicit name is kept as it is (and checked by :func:`check_answers`).
    A dataset whose columns cannot be read ahead (iterable) gets ``answer``, as before."""
    if args.answer_column is not None:
        return args.answer_column
    if isinstance(dataset, dict):  # a DatasetDict passed as train_dataset: its first split's columns
        dataset = next(iter(dataset.values()), None)
    columns = _dataset_columns(dataset) if dataset is not None else None
    found = [name for name in ANSWER_COLUMNS if columns is not None and name in columns]
    if columns is not None and not found:
        raise ValueError(
            f"{who}: OPPO conditions its oracle on the ground-truth answer, read from the column `answer`, else "
            f"`solution` ({config}.answer_column) when none is named, but `train_dataset` has columns {columns}. Add "
            "one of them or set `answer_column` to the column holding the answers (with an environment_factory that "
            "owns the data, give a dataset whose rows hold each episode's answer: docs/multiturn.md#oppo)."
        )
    args.answer_column = found[0] if found else ANSWER_COLUMNS[0]
    message = (f"{who}: OPPO reads the ground-truth answer y* from the column `{args.answer_column}` "
               f"({config}.answer_column=None: `answer` if the dataset has it, else `solution`; set it to choose).")
    if args.answer_column == "answer":
        import logging

        logging.getLogger(__name__).info(message)  # the paper's column, the long-standing default: no warning
    else:
        import warnings

        warnings.warn(message, UserWarning, stacklevel=3)
    return args.answer_column
