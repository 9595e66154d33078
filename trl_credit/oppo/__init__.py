"""OPPO: token-level advantages by Bayesian value recursion with a self- or teacher-oracle (docs/oppo.md, oppo.md).

- :mod:`trl_credit.oppo.recursion`: the pure math (evidence, prior, recursion, anchoring, group normalization).
- :mod:`trl_credit.oppo.oracle`: oracle prompts and the batched scoring pass.
- :mod:`trl_credit.oppo.parts`: :class:`~trl_credit.oppo.parts.ValueRecursion`, OPPO's credit part of the credit core.
- :class:`OPPOConfig`, :class:`OPPOTrainer`: the config and the preset (GRPO's rollouts + ValueRecursion).
"""

from trl_credit.oppo.config import OPPOConfig
from trl_credit.oppo.oracle import DEFAULT_ORACLE_TEMPLATE, build_oracle_prompt, build_oracle_prompts
from trl_credit.oppo.recursion import (
    TokenCredit,
    bayesian_token_advantages,
    bayesian_value_recursion,
    normalize_per_group,
    normalize_with_group_moments,
)
from trl_credit.oppo.trainer import OPPOTrainer

__all__ = [
    "OPPOConfig",
    "OPPOTrainer",
    "DEFAULT_ORACLE_TEMPLATE",
    "build_oracle_prompt",
    "build_oracle_prompts",
    "TokenCredit",
    "bayesian_token_advantages",
    "bayesian_value_recursion",
    "normalize_per_group",
    "normalize_with_group_moments",
]
