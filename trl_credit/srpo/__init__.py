"""SRPO / RRPO: credit assignment with resets (docs/srpo.md; Samanta et al. 2026, arXiv:2605.25507).

Public API: :class:`SRPOTrainer`, :class:`SRPOConfig` (``reset="self"`` = SRPO, ``reset="random"`` = RRPO).
Pure pieces: :mod:`.thoughts` (token-exact thought splitting), :mod:`.prompts` (Appendix D prompts, localization
parsing), :mod:`.resets` (seeds, reset indices, masked rows), :mod:`.advantages` (sub-group advantages).
The trainer and config are imported lazily (TRL is heavy); the pure modules import only torch/stdlib.
"""

from __future__ import annotations

import importlib

from trl_credit.srpo.advantages import grouped_advantages, srpo_group_ids
from trl_credit.srpo.prompts import (
    LINES_ROLLOUT_TEMPLATE,
    LOCALIZATION_TEMPLATE,
    THOUGHT_MDP_ROLLOUT_TEMPLATE,
    localization_prompt,
    parse_reset_step,
    wrap_prompt,
)
from trl_credit.srpo.resets import choose_reset_step, incorrect_indices, prompt_rows, random_reset_step
from trl_credit.core.steps import reset_prefix_length, split_thoughts, thought_texts

_LAZY = {"SRPOTrainer": "trl_credit.srpo.trainer", "SRPOConfig": "trl_credit.srpo.config"}

__all__ = [
    "SRPOTrainer",
    "SRPOConfig",
    "split_thoughts",
    "thought_texts",
    "reset_prefix_length",
    "parse_reset_step",
    "localization_prompt",
    "wrap_prompt",
    "grouped_advantages",
    "srpo_group_ids",
    "incorrect_indices",
    "random_reset_step",
    "choose_reset_step",
    "prompt_rows",
    "THOUGHT_MDP_ROLLOUT_TEMPLATE",
    "LINES_ROLLOUT_TEMPLATE",
    "LOCALIZATION_TEMPLATE",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_credit.srpo' has no attribute {name!r}")
