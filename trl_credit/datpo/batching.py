"""DATPO's micro-batches: a generation batch holds a variable number of rows (they depend on the trees), which the
core splits without dropping any (``trl_credit.core.row_count.split_rows``, for every rollout that builds its rows);
:func:`sort_rows_by_length` lets rows of similar length share a forward (``Trees.micro_batch_loss``)."""

from __future__ import annotations

import torch

__all__ = ["sort_rows_by_length"]


def sort_rows_by_length(batch: dict) -> dict:
    """The rows of ``batch`` ordered by prompt + completion length (masks), so consecutive rows pad little."""
    lengths = batch["prompt_mask"].sum(dim=1) + batch["completion_mask"].sum(dim=1)
    order = torch.argsort(lengths.cpu(), stable=True)
    num_rows = lengths.size(0)
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.size(0) == num_rows:
            out[key] = value[order.to(value.device)]
        elif isinstance(value, list) and len(value) == num_rows:
            out[key] = [value[k] for k in order.tolist()]
        else:
            out[key] = value
    return out
