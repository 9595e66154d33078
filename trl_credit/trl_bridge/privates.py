"""What a method's parts read on the trainer beyond its public attributes, in one place.

A part never reads ``trainer._<name>`` itself (``tests/test_trl_overrides.py`` scans the method packages for it):
it calls the function here that names what it wants. Each function documents the private it reads, either TRL's
(``GRPOTrainer``'s, registered in :mod:`trl_credit.trl_bridge.compat`'s ``ATTRIBUTES`` / ``CALLED`` / ``OVERRIDDEN`` and
checked against the installed TRL by ``tests/test_trl_contract.py``) or the credit core's own (set by
:mod:`trl_credit.core.trainer` and :mod:`trl_credit.core.setup`). So when TRL renames a private, or the core moves one
of its own, this module changes and the parts do not. Every function only reads or forwards: no copy, no default
(docs/design.md, "Shared modules").
"""

from __future__ import annotations

__all__ = [
    "batch_context",
    "buffered_inputs",
    "entropy_bonus_enabled",
    "environments",
    "generate_and_score",
    "generate_single_turn",
    "is_vlm",
    "metrics",
    "optimizer_step",
    "pad_token_id",
    "rollout_capture",
    "set_buffered_inputs",
    "success_index",
    "success_reward_name",
    "tokenize_prompts",
    "tokenize_without_tools",
    "tokenizer",
    "trl_generate_and_score",
]


# ------------------------------------------------------------------------------------------------ TRL's privates
def tokenizer(trainer):
    """The processing class's tokenizer (``GRPOTrainer._tokenizer``: the tokenizer itself, or a processor's)."""
    return trainer._tokenizer


def pad_token_id(trainer) -> int:
    """``GRPOTrainer._tokenizer.pad_token_id``, the id TRL pads its batches with."""
    return trainer._tokenizer.pad_token_id


def tokenize_prompts(trainer, prompts):
    """``GRPOTrainer._tokenize_prompts(prompts)``: ``(prompt_ids, images, multimodal_fields)``, with TRL's chat
    template and truncation."""
    return trainer._tokenize_prompts(prompts)


def tokenize_without_tools(trainer, prompts):
    """``GRPOTrainer._tokenize_prompts(prompts)`` with no tool schema rendered and any number of rows: TRL's
    ``tools`` and ``environment_factories`` (whose per-row rendering needs the batch's rows) are hidden for the call."""
    saved = trainer.tools, trainer.environment_factories
    trainer.tools, trainer.environment_factories = None, None
    try:
        return trainer._tokenize_prompts(prompts)
    finally:
        trainer.tools, trainer.environment_factories = saved


def generate_single_turn(trainer, prompt_ids, images, multimodal_fields, num_generations):
    """``trainer._generate_single_turn(...)``, through the core's override (so every part's generation hook runs)
    down to ``GRPOTrainer._generate_single_turn``: ``(completion_ids, sampling_logprobs)``."""
    return trainer._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations)


def generate_and_score(trainer, generation_batch):
    """``trainer._generate_and_score_completions(generation_batch)``: the whole chain (the core's override, every
    part, then TRL's), as ``GRPOTrainer._prepare_inputs`` calls it once per generation batch."""
    return trainer._generate_and_score_completions(generation_batch)


def environments(trainer) -> list | None:
    """``GRPOTrainer.environments``: this process's rows' environment instances of the generation batch in progress
    (one per row, in order, drawn from ``environment_factory``'s pool), None without an ``environment_factory``."""
    return trainer.environments


def is_vlm(trainer) -> bool:
    """``GRPOTrainer._is_vlm``: the model takes images."""
    return trainer._is_vlm


def metrics(trainer):
    """``GRPOTrainer._metrics``: mode (``"train"`` / ``"eval"``) -> metric name -> values of the logging window."""
    return trainer._metrics


def entropy_bonus_enabled(trainer) -> bool:
    """``GRPOTrainer._entropy_bonus_enabled``: TRL adds an entropy term to its loss."""
    return trainer._entropy_bonus_enabled


def optimizer_step(trainer) -> int:
    """``GRPOTrainer._step``: TRL's count of ``_prepare_inputs`` calls (one per micro-batch), which decides when a
    new generation batch is due."""
    return trainer._step


def buffered_inputs(trainer):
    """``GRPOTrainer._buffered_inputs``: the micro-batches of the current generation batch (None before the
    first)."""
    return trainer._buffered_inputs


def set_buffered_inputs(trainer, micro_batches) -> None:
    """Sets ``GRPOTrainer._buffered_inputs``, the list ``_prepare_inputs`` indexes by ``_step``."""
    trainer._buffered_inputs = micro_batches


# ------------------------------------------------------------------------------------------------ the core's own
def trl_generate_and_score(trainer, inputs):
    """``CreditTrainer._trl_generate_and_score_completions(inputs)`` (trl_credit.core.trainer): TRL's own generate-and-score
    of the batch, with the rollouts and the reward matrix captured, no part's credit applied."""
    return trainer._trl_generate_and_score_completions(inputs)


def rollout_capture(trainer):
    """``CreditTrainer._rollout_capture`` (trl_credit.core.trainer): the ``RolloutCapture`` of the generation batch being
    scored, None outside one."""
    return trainer._rollout_capture


def success_index(trainer) -> int:
    """``trainer._success_index`` (set by ``trainer_setup.bind_success``): the verifier's column in the reward
    matrix."""
    return trainer._success_index


def success_reward_name(trainer) -> str:
    """The verifier's name, ``trainer.reward_func_names[success_index(trainer)]``, for messages."""
    return trainer.reward_func_names[trainer._success_index]
