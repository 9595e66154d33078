"""PRIME (Cui et al. 2025, "Process Reinforcement through Implicit Rewards", arXiv:2502.01456; docs/process.md,
"Implicit process rewards"): ``credit="implicit_prm"``.

Process credit without a step checker: an implicit process reward model, initialized from the policy and updated
online with a cross-entropy on the outcome labels of the current rollouts, gives every token the reward
β log π_φ(y_t|y_<t) / π_ref(y_t|y_<t); the advantages are the returns of these rewards against a leave-one-out
baseline plus the RLOO outcome advantage. Public API: :class:`~trl_credit.prime.parts.ImplicitPRMCredit` (the credit
part, imported lazily: it needs TRL), the fields :class:`~trl_credit.prime.config.PrimeFields` and the pure math
(:mod:`.advantages`).
"""

from __future__ import annotations

import importlib

_LAZY = {"ImplicitPRMCredit": "trl_credit.prime.parts", "PrimeFields": "trl_credit.prime.config",
         "ImplicitPRM": "trl_credit.prime.prm"}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
