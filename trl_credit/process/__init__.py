"""Process supervision for GRPO (DeepSeekMath, Shao et al. 2024, §4.1.3; docs/process.md): ``credit="process"``.

Per-step rewards (a step checker, a process reward model) become per-token advantages: the step rewards of a group
are normalized together and a token's advantage is the sum of the normalized rewards of its step and every later
step. Public API: :class:`~trl_credit.process.parts.ProcessCredit` (the credit part, imported lazily: it needs TRL),
the step-reward registry (:data:`STEP_REWARDS`, :func:`register_step_reward`) and the pure math
(:mod:`.advantages`).
"""

from __future__ import annotations

import importlib

from trl_credit.process.advantages import normalized_step_rewards, token_advantages
from trl_credit.process.step_rewards import STEP_REWARDS, chain_step_rewards, register_step_reward, resolve_step_reward

_LAZY = {"ProcessCredit": "trl_credit.process.parts", "ProcessFields": "trl_credit.process.config"}

__all__ = [
    "ProcessCredit",
    "ProcessFields",
    "STEP_REWARDS",
    "register_step_reward",
    "resolve_step_reward",
    "chain_step_rewards",
    "normalized_step_rewards",
    "token_advantages",
]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
