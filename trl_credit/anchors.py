"""Sequence anchors in TRL's per-sequence decisions: ``off_policy_mask_threshold`` keeps a sequence when its
advantage is >= 0 and VESPO picks its gamma weighting by the advantage's sign, both meant per sequence. With (B, T)
advantages TRL would decide per token; a credit that sets anchors (OPPO: sign(A^seq), paper Eq. 21) has them decided
per sequence, handed to TRL's static methods through a context variable while the loss runs. Without anchors
(GRPO's (B,) advantages, DATPO's (B, T) ones) TRL decides as it always does."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect

import torch
from trl import GRPOTrainer

__all__ = ["loss_sequence_anchors", "decided_per_sequence"]


_LOSS_ANCHORS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("oppo_loss_anchors", default=None)


@contextlib.contextmanager
def loss_sequence_anchors(anchors: torch.Tensor | None):
    """While inside, (B, T) advantages given to ``OPPOTrainer.get_off_policy_mask`` / ``get_gamma_weights`` are
    decided per sequence by ``anchors`` (B,), sign(A^seq) of the batch in the loss (``_compute_loss`` sets it)."""
    token = _LOSS_ANCHORS.set(anchors)
    try:
        yield
    finally:
        _LOSS_ANCHORS.reset(token)


def _sequence_level(advantages: torch.Tensor) -> torch.Tensor:
    if advantages.dim() < 2 or advantages.size(1) == 1:
        return advantages  # already one advantage per sequence: TRL's own case
    anchors = _LOSS_ANCHORS.get()
    if anchors is None:
        return advantages  # no part anchors its rows: TRL's per-token decision
    if anchors.numel() != advantages.size(0):
        raise RuntimeError(
            f"{anchors.numel()} sequence anchors for a batch of {advantages.size(0)} rows reached a per-sequence "
            "decision of TRL's loss (off_policy_mask_threshold / loss_type='vespo')."
        )
    return anchors.to(device=advantages.device, dtype=advantages.dtype).view(-1, 1)


def decided_per_sequence(name: str) -> staticmethod:
    """GRPOTrainer's static method ``name``, same signature, with OPPO's (B, T) advantages replaced by their sequences'
    anchors. TRL's method is looked up at each call, so a patched or subclassed GRPOTrainer is honoured."""
    signature = inspect.signature(getattr(GRPOTrainer, name))

    @functools.wraps(getattr(GRPOTrainer, name))
    def decide(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments["advantages"] = _sequence_level(bound.arguments["advantages"])
        return getattr(GRPOTrainer, name)(**bound.arguments)  # by keyword, as TRL's _compute_loss calls it

    return staticmethod(decide)
