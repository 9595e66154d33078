"""trl_credit: credit-assignment trainers for RL on LLM reasoning, as drop-in replacements for TRL's GRPOTrainer.

| trainer           | config           | method                                              |
| ----------------- | ---------------- | --------------------------------------------------- |
| CueGRPOTrainer    | CueGRPOConfig    | Cue-GRPO: rarity-aware credit redistribution        |
| OPPOTrainer       | OPPOConfig       | OPPO: token advantages by Bayesian value recursion  |
| DATPOTrainer      | DATPOConfig      | DATPO: difficulty-adaptive tree rollouts            |
| SRPOTrainer       | SRPOConfig       | SRPO / RRPO: reset-and-resample rollouts            |

Each trainer is a preset of ``CreditTrainer``, the credit core: a rollout, a credit and modifiers over one per-row
batch record (docs/design.md#the-credit-core). ``CreditConfig`` is one config over every part's fields, with
``rollout``, ``credit`` and ``modifiers`` choosing the parts. Trainers and configs are imported lazily (TRL and transformers are heavy), so ``import trl_credit`` is cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "CueGRPOTrainer": "trl_credit.cue_grpo",
    "CueGRPOConfig": "trl_credit.cue_grpo",
    "OPPOTrainer": "trl_credit.oppo",
    "OPPOConfig": "trl_credit.oppo",
    "DATPOTrainer": "trl_credit.datpo",
    "DATPOConfig": "trl_credit.datpo",
    "SRPOTrainer": "trl_credit.srpo",
    "SRPOConfig": "trl_credit.srpo",
    "CreditTrainer": "trl_credit.core.trainer",
    "CreditConfig": "trl_credit.config",
}

__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trl_credit' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
