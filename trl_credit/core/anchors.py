"""Sequence anchors in TRL's per-sequence decisions: ``off_policy_mask_threshold`` keeps a sequence when its
advantage is >= 0 and VESPO picks its gamma weighting by the advantage's sign, both meant per sequence. With (B, T)
advantages TRL would decide per token; a credit that sets anchors (OPPO: sign(A^seq), paper Eq. 21; process credit:
the row's sequence advantage) has them decided per sequence. The credit puts them in the record
(``RowBatch.sequence_anchors``), the core writes this process's rows into TRL's batch under the one key
:data:`SEQUENCE_ANCHORS`, and around TRL's loss (:func:`batch_sequence_anchors`) hands them to TRL's static methods
through a context variable. Without anchors (GRPO's (B,) advantages, DATPO's (B, T) ones) TRL decides as it always
does."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect

import torch
from trl import GRPOTrainer

__all__ = ["SEQUENCE_ANCHORS", "batch_sequence_anchors", "loss_sequence_anchors", "decided_per_sequence"]

#: The key of TRL's batch dict that carries each row's sequence anchor (B,), whichever credit set it.
SEQUENCE_ANCHORS = "sequence_anchors"


_LOSS_ANCHORS: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("loss_sequence_anchors",
                                                                                     default=None)


@contextlib.contextmanager
def loss_sequence_anchors(anchors: torch.Tensor | None):
    """While inside, (B, T) advantages given to ``CreditTrainer.get_off_policy_mask`` / ``get_gamma_weights`` are
    decided per sequence by ``anchors`` (B,), those of the batch in the loss (:func:`batch_sequence_anchors`)."""
    token = _LOSS_ANCHORS.set(anchors)
    try:
        yield
    finally:
        _LOSS_ANCHORS.reset(token)


@contextlib.contextmanager
def batch_sequence_anchors(inputs: dict, required_by: str | None = None):
    """While inside, TRL's per-sequence decisions over ``inputs`` (a micro-batch reaching ``_compute_loss``) use its
    :data:`SEQUENCE_ANCHORS`. ``required_by``: who set them (a credit whose (B, T) advantages need them); then (B, T)
    advantages without them are refused, since TRL would silently decide per token."""
    anchors = inputs.get(SEQUENCE_ANCHORS)
    if anchors is None and required_by is not None and inputs["advantages"].dim() == 2:
        raise RuntimeError(
            f"{required_by}: per-token advantages reached the loss without their rows' sequence anchors "
            f"(`{SEQUENCE_ANCHORS}` of the batch, written by the credit core from the credit's record), so TRL's "
            "per-sequence decisions (off_policy_mask_threshold / loss_type='vespo') could not be made per sequence. "
            "A subclass or modifier that rebuilds the batch must keep that key."
        )
    with loss_sequence_anchors(anchors):
        yield


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
