"""Every trainer, built one way for both engine suites: vLLM colocate (tests/engines/vllm_run.py) and DeepSpeed
(tests/mp_scripts/engine_trainers.py). Each suite says what its engine sets (an :class:`Engine`: the config fields
every trainer shares, the reward functions, SRPO's settings, the LoRA adapter, the process credit's step rewards)
and picks trainers by name; what a trainer is (its classes, its method's settings, the helpers a user loads for it)
is written here once, so a trainer added here reaches both engines (CONTRIBUTING.md, "Engines").

Names: :data:`TRAINERS` (``oppo``, ``srpo_scored``, ``prime``, ...); ``NAME_lora`` is the same trainer with the engine's
LoRA adapter (``prime_lora``: PRIME's PRM is then a second adapter); ``lora`` is ``oppo_lora`` (the DeepSpeed suite's
adapter-saving run). Multi-turn runs pass TRL's ``tools=`` / ``environment_factory=`` through ``build``'s
``trainer_kwargs``: every trainer takes them (SRPO's resets and DATPO's trees resume TRL's tool loop from a prefix;
docs/multiturn.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Engine", "Trainer", "TRAINERS", "NAMES", "resolve", "build"]


@dataclass(frozen=True)
class Engine:
    """What one engine suite sets for every trainer it builds.

    - ``args``: config fields of every trainer (batch, steps, learning rate, the engine's own flags); ``output_dir``
      is set by :func:`build`;
    - ``rewards``: the reward functions, an accuracy-like verifier first (the trainers that tell correct from
      incorrect read the first), a format reward second;
    - ``srpo``: the settings of SRPO's resets (SRPO's trainers and ``rollout="resets"``), over ``args``;
    - ``lora``: ``peft.LoraConfig`` keyword arguments of the ``NAME_lora`` trainers;
    - ``step_reward``: the process credit's step-reward function (or a registered name: ``"environment"``, the
      environment's turn rewards);
    - ``overrides``: per trainer name, fields this engine sets last (over the method's own).
    """

    args: dict
    rewards: list
    srpo: dict
    lora: dict
    step_reward: Callable | str
    overrides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Trainer:
    """One trainer: ``module.Class`` names of its trainer and config, its method's config fields, whether it takes
    SRPO's settings, and ``helpers(model, config)`` -> the trainer keyword arguments a user loads after the config
    (a judge model, an embedder: under ZeRO-3 they are born partitioned)."""

    trainer: str
    config: str
    settings: dict = field(default_factory=dict)
    resets: bool = False
    helpers: Callable | None = None


def _judge(model, config):
    from transformers import AutoModelForCausalLM

    return {"judge_model": AutoModelForCausalLM.from_pretrained(model)}  # loaded by the user, after the config


def _embedder(model, config):
    from trl_credit.models import load_default_embedder

    return {"embedder": load_default_embedder(device="cpu")}  # the documented way: loaded by the user and passed


# PRIME: the paper's prompt filter without its truncation test (the tiny models truncate most rows at a dozen tokens);
# with LoRA (prime_lora) the PRM is a second adapter, which must never reach vLLM (the vLLM suite's push check)
_PRIME = dict(credit="implicit_prm", prime_learning_rate=1e-2, prime_filter_truncated=False)

TRAINERS: dict[str, Trainer] = {
    "grpo": Trainer("trl.GRPOTrainer", "trl.GRPOConfig"),
    "cue_grpo": Trainer("trl_credit.CueGRPOTrainer", "trl_credit.CueGRPOConfig"),
    "cue_judge": Trainer("trl_credit.CueGRPOTrainer", "trl_credit.CueGRPOConfig",
                         dict(cue_partition="judge", cue_judge_max_new_tokens=8), helpers=_judge),
    "oppo": Trainer("trl_credit.OPPOTrainer", "trl_credit.OPPOConfig"),
    "oppo_teacher": Trainer("trl_credit.OPPOTrainer", "trl_credit.OPPOConfig", dict(oracle="teacher")),
    "datpo": Trainer("trl_credit.DATPOTrainer", "trl_credit.DATPOConfig", helpers=_embedder),
    "srpo_scored": Trainer("trl_credit.SRPOTrainer", "trl_credit.SRPOConfig", dict(localization="scored"),
                           resets=True),
    "srpo_generate": Trainer("trl_credit.SRPOTrainer", "trl_credit.SRPOConfig", dict(localization="generate"),
                             resets=True),
    "resets_oppo": Trainer("trl_credit.CreditTrainer", "trl_credit.CreditConfig",
                           dict(credit="oppo", rollout="resets"), resets=True),
    # its step rewards: the engine's step-reward function (build passes ProcessCredit(step_reward=...))
    "process": Trainer("trl_credit.CreditTrainer", "trl_credit.CreditConfig", dict(credit="process")),
    "prime": Trainer("trl_credit.CreditTrainer", "trl_credit.CreditConfig", _PRIME),
}

_ALIASES = {"lora": "oppo_lora"}

#: Every name :func:`build` takes.
NAMES = tuple(TRAINERS) + tuple(f"{name}_lora" for name in TRAINERS) + tuple(_ALIASES)


def resolve(name: str) -> tuple[str, bool]:
    """``name`` -> (the :data:`TRAINERS` entry, whether the engine's LoRA adapter is added)."""
    name = _ALIASES.get(name, name)
    base, lora = (name[: -len("_lora")], True) if name.endswith("_lora") else (name, False)
    if base not in TRAINERS:
        raise ValueError(f"NAME must be among {NAMES}, got {name!r}")
    return base, lora


def _load(dotted: str):
    import importlib

    module, attribute = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), attribute)


def build(name: str, model: str, output_dir: str, engine: Engine, train_dataset=None, **trainer_kwargs):
    """The trainer ``name`` on ``model`` with ``engine``'s settings: the config is ``engine.args``, then SRPO's
    settings (``engine.srpo``) for a resets trainer, the method's settings, then ``engine.overrides[name]``;
    ``train_dataset`` defaults to 8 arithmetic problems; ``trainer_kwargs`` (``tools``, ``environment_factory``, ...)
    go to the trainer as they are."""
    base, lora = resolve(name)
    spec = TRAINERS[base]
    if train_dataset is None:
        from trl_credit.tasks.data import make_arithmetic_dataset

        train_dataset = make_arithmetic_dataset(num_train=8, num_test=2, seed=0)["train"]
    fields = {**engine.args, "output_dir": output_dir, **(engine.srpo if spec.resets else {}), **spec.settings}
    if base == "oppo_teacher":
        fields["teacher_model_name_or_path"] = model  # the policy's own weights as a frozen teacher
    fields.update(engine.overrides.get(name, {}))
    config = _load(spec.config)(**fields)
    kwargs = dict(spec.helpers(model, config)) if spec.helpers else {}
    if base == "process":
        from trl_credit.process.parts import ProcessCredit

        kwargs["credit"] = ProcessCredit(step_reward=engine.step_reward)
    if lora:
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(**engine.lora)
    kwargs.update(trainer_kwargs)
    return _load(spec.trainer)(model=model, reward_funcs=list(engine.rewards), args=config,
                               train_dataset=train_dataset, **kwargs)
