"""What every method trainer does at construction, and the mode it runs in: a config of the right class
(:func:`resolve_method_args`), who speaks in its messages (:func:`speaker`), no multi-turn rollouts for a part
that generates its own (:func:`check_single_turn`), the verifier column that decides correct/incorrect (:func:`bind_success` /
:func:`rollout_success`, :mod:`trl_credit.core.success`), and frozen helper models loaded whole under ZeRO-3
(:func:`outside_zero3_init`), or made whole when the user loaded them partitioned (:func:`whole_copy`)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch

from trl_credit.trl_bridge.compat import check_trl_can_train

__all__ = [
    "trainer_mode",
    "speaker",
    "is_composed",
    "resolve_method_args",
    "grpo_arguments",
    "check_single_turn",
    "MULTI_TURN_ALTERNATIVES",
    "user_rollout_func",
    "bind_success",
    "rollout_success",
    "outside_zero3_init",
    "whole_copy",
]


def trainer_mode(trainer) -> str:
    return "train" if trainer.model.training else "eval"


def is_composed(trainer) -> bool:
    """Whether ``trainer``'s class composes its parts from its config (``CreditTrainer`` and subclasses that name no
    method of their own) rather than being a preset that fixes them (``SRPOTrainer``, ``OPPOTrainer``, ...: each
    sets the class attribute ``_name``)."""
    return getattr(type(trainer), "_name", None) in (None, "GRPO")


def speaker(trainer, part=None) -> str:
    """Who a warning, refusal or metric note speaks as: the class the user built, and in a composed trainer also the
    part that speaks (``part``: a part or its name). ``SRPOTrainer(...)`` -> ``"SRPOTrainer"``;
    ``CreditTrainer(rollout="resets")`` -> ``"CreditTrainer (resets rollout)"``; OPPO's credit in it ->
    ``"CreditTrainer (oppo credit)"``; Cue-GRPO's weights -> ``"CreditTrainer (cue modifier)"``."""
    name = type(trainer).__name__
    if part is None or not is_composed(trainer):
        return name
    part_name = getattr(part, "name", part)
    kinds = [("rollout", getattr(trainer, "rollout", None)), ("credit", getattr(trainer, "credit", None))]
    kinds += [("modifier", m) for m in getattr(trainer, "modifiers", None) or []]
    kind = next((kind for kind, p in kinds if p is not None and (p is part or p.name == part_name)), None)
    return f"{name} ({part_name} {kind})" if kind else f"{name} ({part_name})"


def resolve_method_args(args, config_class, model, trainer_name: str, run_suffix: str):
    """GRPOTrainer's behaviour for ``args=None`` (a default config named after the model), and a clear refusal of a
    config of another class (a plain GRPOConfig would silently lack the method's fields). Also refuses a TRL that
    cannot train in this environment (``trl_compat.check_trl_can_train``), before any model is loaded."""
    check_trl_can_train(trainer_name)
    if args is None:
        name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", None) or "model"
        return config_class(f"{str(name).split('/')[-1]}-{run_suffix}")
    if not isinstance(args, config_class):
        raise TypeError(
            f"{trainer_name} needs `args` to be a {config_class.__name__} (got {type(args).__name__}); build one with "
            f"the same GRPO arguments, e.g. {config_class.__name__}(**grpo_args.to_dict())."
        )
    return args


def grpo_arguments(model, reward_funcs, args, pargs: tuple, kwargs: dict) -> dict:
    """GRPOTrainer's arguments by name, as a preset with TRL's signature ``(model, reward_funcs=None, args=None,
    *pargs, **kwargs)`` received them (``pargs`` in ``GRPOTrainer.__init__``'s order), to check one before any model
    is loaded. An argument GRPOTrainer does not take raises its ``TypeError`` here."""
    from trl import GRPOTrainer

    bound = inspect.signature(GRPOTrainer.__init__).bind(None, model, reward_funcs, args, *pargs, **kwargs)
    return bound.arguments


#: What accepts TRL's multi-turn rollouts (``tools``, ``environment_factory``, a user's ``rollout_func``): every credit
#: rule that needs no generation of its own (docs/multiturn.md). Named in the refusals of those that do.
MULTI_TURN_ALTERNATIVES = ("credit='outcome' (GRPO)", "credit='oppo'", "credit='process'", "credit='implicit_prm'",
                           "modifiers=['cue']")


def check_single_turn(trainer, method: str, why: str = "it generates its own rollouts",
                      tool_loop: bool = False) -> None:
    """Refuse TRL's multi-turn rollouts for a part that generates rows itself: a tool loop, an environment or a user's
    ``rollout_func`` would bypass or replace its generation. ``method``: who refuses (:func:`speaker`); ``why``: what
    it generates itself; ``tool_loop``: the part resumes TRL's tool loop in its own rows (SRPO's resets, DATPO's
    branches: ``core.tool_loop``), so only a ``rollout_func`` is refused. Credit rules that only read the rows accept
    all three (docs/multiturn.md)."""
    instead = ", ".join(MULTI_TURN_ALTERNATIVES)
    if tool_loop:
        if user_rollout_func(trainer) is not None:
            raise ValueError(f"{method} does not support a custom `rollout_func`: {why}. A rollout_func is accepted "
                             f"by {instead}.")
        return
    # environment_factory first: TRL turns an environment's methods into `tools`, so the tools check would name the
    # wrong argument.
    if getattr(trainer, "environment_factories", None) is not None:
        raise ValueError(f"{method} does not support `environment_factory`: {why}, and does not yet resume an "
                         f"environment's episode from a prefix. Multi-turn rollouts train with {instead}.")
    if getattr(trainer, "tools", None):
        raise ValueError(f"{method} does not support `tools` (multi-turn tool calling): {why}, and does not yet resume "
                         f"TRL's tool loop from a prefix; pass tools=None, or train with {instead}.")
    if user_rollout_func(trainer) is not None:
        raise ValueError(f"{method} does not support a custom `rollout_func`: {why}. A rollout_func is accepted by "
                         f"{instead}.")


def user_rollout_func(trainer):
    """The ``rollout_func`` the user passed to the trainer, or None: none, or the core's own (a rollout's
    ``Rollout.rollout_rows``, installed by ``CreditTrainer``: a method of the trainer itself, which no user can
    have passed since the trainer did not exist yet)."""
    rollout_func = getattr(trainer, "rollout_func", None)
    if rollout_func is None or getattr(rollout_func, "__self__", None) is trainer:
        return None
    return rollout_func


def bind_success(trainer) -> int:
    """Resolve ``args.success_reward`` against TRL's ``reward_func_names`` once, at construction, so a wrong name or
    index fails before any training. Stored as ``trainer._success_index``."""
    from trl_credit.core.success import resolve_success_index

    trainer._success_index = resolve_success_index(trainer.args.success_reward, trainer.reward_func_names)
    return trainer._success_index


def rollout_success(trainer, rewards_per_func: torch.Tensor) -> torch.Tensor:
    """(N,) bool: rows whose verifier reward (``args.success_reward``) is >= ``args.success_threshold``."""
    from trl_credit.core.success import success_rows

    return success_rows(rewards_per_func, trainer._success_index, trainer.args.success_threshold)


@contextlib.contextmanager
def outside_zero3_init() -> Iterator[None]:
    """Load a frozen helper model (DATPO's embedder, Cue-GRPO's judge) as a whole copy on each process.

    Under DeepSpeed ZeRO-3, transformers partitions every model created while its DeepSpeed config is registered
    (``zero.Init``), and a partitioned model only runs inside a DeepSpeed engine. Small frozen helpers that run plain
    forward passes must not be partitioned: the config is unregistered while they load, then registered again.
    Outside ZeRO-3 this does nothing.
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    config = saved() if saved is not None else None
    if config is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(config)


def whole_copy(module):
    """``module`` (a frozen helper the user loaded: DATPO's embedder, Cue-GRPO's judge) with every parameter whole on
    each process, in place; ``module`` itself when nothing is partitioned (always so outside ZeRO-3).

    A model created while a ZeRO-3 config is registered (``accelerate launch`` with ``zero3_init_flag``, once the
    training config exists: the usual order of a script) is partitioned by ``zero.Init``: each process holds an empty
    placeholder per parameter, which runs only inside a DeepSpeed engine (a plain forward fails, e.g. "'weight' must
    be 2-D"). The parameters are gathered once (a collective: every process constructs the trainer) and replaced by
    ordinary ones, as :func:`outside_zero3_init` would have loaded them.
    """
    if not isinstance(module, torch.nn.Module):
        return module
    partitioned = [p for p in module.parameters() if hasattr(p, "ds_id")]  # deepspeed's `is_zero_param`
    if not partitioned:
        return module
    import deepspeed

    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
        # one new Parameter per gathered one, so weights tied between modules stay tied
        whole = {id(p): torch.nn.Parameter(p.data.clone(), requires_grad=p.requires_grad) for p in partitioned}
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is not None and id(param) in whole:
                sub._parameters[name] = whole[id(param)]
    return module
