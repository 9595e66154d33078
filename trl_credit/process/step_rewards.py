"""Step-reward functions of the process credit (docs/process.md#step-reward-functions): the registry a config names
one from, the built-ins, and the check of what a function returns. Stdlib only.

A step-reward function scores the steps of one completion::

    step_reward(prompt, completion, steps, **row) -> list[float | None]

- ``prompt``: the row's prompt (a string or chat messages), as TRL's reward functions get it (with an
  ``environment_factory``, the last message carries the environment's ``reset()`` observation);
- ``completion``: the completion's text (special tokens removed);
- ``steps``: the completion's steps, as the process credit split it (the thought delimiter, SRPO's token-exact
  splitting; each step's text with the delimiter removed and whitespace stripped);
- ``row``: the dataset row's other columns (``answer``, ``question``, ...), and with an ``environment_factory`` the
  row's environment instance as ``env`` (the one its rollout ran in; docs/multiturn.md#turn-rewards).

It returns one reward per step, in order: a step checker 1.0 up to the first wrong step and 0.0 from it on, a
process reward model its scores; None for a step it does not score. A new built-in is one entry of
:data:`STEP_REWARDS` (``"name": "module:function"``, imported when first used) or one call of
:func:`register_step_reward`; a config names it with ``process_step_reward="name"``.
"""

from __future__ import annotations

import importlib
import math
import warnings
import numbers
from collections.abc import Callable, Sequence

__all__ = [
    "STEP_REWARDS", "register_step_reward", "resolve_step_reward", "chain_step_rewards", "environment_turn_rewards",
    "checked_rewards",
]

StepReward = Callable[..., "list[float | None]"]

#: Step-reward functions a config can name (``process_step_reward``): a callable, or ``"module:function"``.
STEP_REWARDS: dict[str, StepReward | str] = {
    "chain": "trl_credit.process.step_rewards:chain_step_rewards",
    "sums": "trl_credit.tasks.sums:step_rewards",  # the tiny testbed's checker (docs/testbed.md#the-tiny-testbed)
    "environment": "trl_credit.process.step_rewards:environment_turn_rewards",  # docs/multiturn.md#turn-rewards
}


def register_step_reward(name: str, function: StepReward | str | None = None):
    """Register ``function`` (a callable or ``"module:function"``) under ``name``; without ``function``, a decorator.
    Registering a name that exists is refused (a built-in is never replaced by accident)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a step-reward function's name must be a non-empty string, got {name!r}.")

    def register(target):
        if name in STEP_REWARDS and STEP_REWARDS[name] is not target:
            raise ValueError(f"a step-reward function named {name!r} is already registered.")
        STEP_REWARDS[name] = target
        return target

    return register if function is None else register(function)


def resolve_step_reward(value) -> StepReward | None:
    """A callable is returned as is, a registered name as its function, None as None."""
    if value is None or callable(value):
        return value
    if isinstance(value, str) and value in STEP_REWARDS:
        target = STEP_REWARDS[value]
        if isinstance(target, str):
            module, _, attribute = target.partition(":")
            target = getattr(importlib.import_module(module), attribute)
        return target
    raise ValueError(
        f"process_step_reward must be one of the registered step-reward functions {sorted(STEP_REWARDS)} (or a "
        f"callable passed as ProcessCredit(step_reward=...)), got {value!r}."
    )


def checked_rewards(rewards, num_steps: int, name: str, where: str) -> list[float | None]:
    """What a step-reward function returned, checked: one entry per step, each a finite number or None (NaN reads
    as None: no reward)."""
    if isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence):
        raise TypeError(f"step-reward function {name} returned {type(rewards).__name__} for {where}; it must return "
                        "a list with one float (or None) per step.")
    if len(rewards) != num_steps:
        raise ValueError(f"step-reward function {name} returned {len(rewards)} rewards for the {num_steps} steps of "
                         f"{where}; it must return one per step (the `steps` it is given).")
    checked: list[float | None] = []
    for reward in rewards:
        if reward is None:
            checked.append(None)
            continue
        original = reward
        reward = _number(reward)
        if reward is None:
            raise TypeError(f"step-reward function {name} returned {original!r} ({type(original).__name__}) for a "
                            f"step of {where}; a step reward is a float or None (a string or a bool is not read as "
                            "a number).")
        if math.isnan(reward):
            checked.append(None)
        elif math.isinf(reward):
            raise ValueError(f"step-reward function {name} returned {reward} for a step of {where}: step rewards "
                             "must be finite (None for a step without a reward).")
        else:
            checked.append(reward)
    return checked


def _number(value) -> float | None:
    """``value`` as a float when it is a real number (a Python int or float, a numpy or 0-d torch scalar of a numeric
    dtype); None for anything else: a string (even "1.0"), a bool (of Python, numpy or torch), a container."""
    if hasattr(value, "item") and not isinstance(value, numbers.Real):
        try:
            value = value.item()  # a 0-d tensor or array: its Python scalar (a bool stays a bool)
        except (TypeError, ValueError, RuntimeError):
            return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or type(value).__name__ == "bool_":
        return None
    return float(value)


def chain_step_rewards(prompt, completion, steps, **row) -> list[float]:
    """The built-in ``chain`` task's step checker as step rewards (trl_credit/tasks/chain.py, docs/testbed.md): 1.0 for
    every step before the first wrong one, 0.0 for it and every step after it.

    The checker numbers the completion's non-empty lines; with the delimiter ``"\\n"`` line k is step k (a step of
    several lines owns all of them) and the answer line ``\\boxed{N}`` is the last step. A wrong answer is the answer
    line's step; text after the answer, the step holding it; a completion without an answer line is wrong at the
    missing step after its last line, which is charged to its last step (the step that stopped without an answer:
    its tokens hold the stop), as SRPO's ``chain`` step checker does. The question is the row's ``question`` column
    when it has one, else the prompt (with or without the task's instruction)."""
    from trl_credit.srpo.localization import chain_step_checker
    from trl_credit.srpo.prompts import question_of

    if not steps:
        return []
    question = row.get("question") or question_of(prompt)
    wrong = chain_step_checker(str(question), list(steps))
    if wrong is None:
        return [1.0] * len(steps)
    return [1.0] * (wrong - 1) + [0.0] * (len(steps) - wrong + 1)


def environment_turn_rewards(prompt, completion, steps, env=None, **row) -> list:
    """The turn rewards the row's environment reports (docs/multiturn.md#turn-rewards): ``env.turn_rewards``, an
    attribute or property (not a method: TRL exposes every public method of an environment as a tool) holding one
    float (or None: not scored) per model turn of the rollout, in order (``process_steps="turns"`` or ``"auto"`` makes
    each model turn a step). A list of another length cannot be aligned with the turns (e.g. a malformed tool call
    never reached the environment, or the episode ended on a tool call): that row is left unscored, with a warning, and
    the process credit's ``process/unscored_row_rate`` counts it; never a reward on the wrong turn."""
    if env is None:
        raise ValueError("process_step_reward='environment' reads the turn rewards of the rollout's environment: it "
                         "needs an environment_factory (the trainer has none).")
    rewards = getattr(env, "turn_rewards", None)
    if rewards is None or callable(rewards) or isinstance(rewards, (str, bytes)):
        raise ValueError(f"process_step_reward='environment': the environment {type(env).__name__} has no "
                         "turn_rewards list; set one in reset() and append one float (or None) per model turn (an "
                         "attribute or a property: a public method would be offered to the model as a tool).")
    rewards = list(rewards)
    if len(rewards) != len(steps):
        warnings.warn(f"process_step_reward='environment': {type(env).__name__}.turn_rewards holds "
                      f"{len(rewards)} rewards for a rollout of {len(steps)} model turns; the turns cannot be aligned, "
                      "so the rollout gets no turn reward (process/unscored_row_rate counts such rows). Give one "
                      "value per model turn (None for a turn you do not score).", UserWarning, stacklevel=2)
        return [None] * len(steps)
    return rewards
