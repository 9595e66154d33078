"""DATPOTrainer: GRPOTrainer with DATPO's difficulty-adaptive tree rollouts (docs/datpo.md, paper Alg. 3), a preset of
the credit core: the :class:`~.parts.Trees` rollout and the :class:`~.parts.BlockCredit` credit (trl_credit/datpo/
parts.py has what changes relative to GRPOTrainer and how). Evaluation stays GRPO on the base rollouts."""

from __future__ import annotations

from trl_credit.core.setup import resolve_method_args
from trl_credit.core.context import hook_context
from trl_credit.core.trainer import CreditTrainer
from .config import DATPOConfig
from .parts import BlockCredit, Trees, diversity_alpha

__all__ = ["DATPOTrainer"]


class DATPOTrainer(CreditTrainer):
    """Drop-in GRPOTrainer for DATPO (Yu et al., 2026). Takes a :class:`DATPOConfig`; ``embedder`` optionally gives
    a sentence-transformers model instance (anything with ``encode(texts, batch_size=, convert_to_tensor=)``) for the
    sibling-diversity embeddings instead of ``args.embedding_model``."""

    _tag_names = ["trl", "grpo", "datpo", "trl_credit"]
    _name = "DATPO"
    _paper = {
        "title": "Difficulty-Adaptive Tree-Structured Policy Optimization for Expanding Reasoning Coverage in RLVR",
        "id": "2609.08650",
        "citation": "@article{yu2026datpo, title={Difficulty-Adaptive Tree-Structured Policy Optimization for "
        "Expanding Reasoning Coverage in RLVR}, author={Yu, Youngjun and Jang, Sanghwan and Yu, Hwanjo}, "
        "journal={arXiv preprint arXiv:2609.08650}, year={2026}}",
    }

    def __init__(self, model, reward_funcs=None, args: DATPOConfig | None = None, *pargs, embedder=None, **kwargs):
        args = resolve_method_args(args, DATPOConfig, model, "DATPOTrainer", "DATPO")
        super().__init__(model, reward_funcs, args, *pargs, rollout=Trees(), credit=BlockCredit(embedder), **kwargs)

    # What callers and tests read, kept on the trainer; the state lives on the parts.
    @property
    def embedder(self):
        """The sentence embedder of the sibling-diversity bonus (None without ``use_diversity``)."""
        return self.credit.embedder

    @property
    def _datpo_branching(self) -> bool:
        """True while the branches of phase 2 are generated (else: the base rollouts, or evaluation)."""
        ctx = self._batch_context
        return ctx is not None and ctx.scratch(self.rollout).get("branching", False)

    def _diversity_alpha(self) -> float:
        """α_t at the current optimizer step."""
        return diversity_alpha(hook_context(self))
