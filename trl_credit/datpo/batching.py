"""DATPO's micro-batches: a generation batch holds a variable number of rows (they depend on the trees), which TRL's
``split_tensor_dict`` would floor-divide, dropping the remainder. :func:`split_rows` keeps every row;
:func:`sort_rows_by_length` lets rows of similar length share a forward."""

from __future__ import annotations

import torch

__all__ = ["split_rows", "sort_rows_by_length"]

# Per-token tensors of the training batch, aligned with the completion (right-padded).
_COMPLETION_KEYS = (
    "completion_ids",
    "completion_mask",
    "advantages",
    "datpo_base_advantages",
    "datpo_diversity_bonus",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
)


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


def split_rows(batch: dict, num_chunks: int, pad_to_multiple_of: int | None = None) -> list[dict]:
    """Split a batch of B rows into ``num_chunks`` micro-batches of ⌊B/n⌋ or ⌈B/n⌉ rows, dropping none, and trim
    each to its own longest prompt and completion (prompts are left-padded, completions right-padded), keeping
    widths multiples of ``pad_to_multiple_of`` when it is set."""

    def round_up(cols: int, limit: int) -> int:
        if not pad_to_multiple_of:
            return cols
        return min(limit, -(-cols // pad_to_multiple_of) * pad_to_multiple_of)

    num_rows = batch["completion_ids"].size(0)
    if num_rows < num_chunks:
        raise ValueError(f"{num_rows} rows cannot fill {num_chunks} micro-batches (steps_per_generation)")
    sizes = [num_rows // num_chunks + (1 if c < num_rows % num_chunks else 0) for c in range(num_chunks)]
    chunks, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        start += size
        chunk = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                chunk[key] = value[rows]
            elif isinstance(value, list):
                chunk[key] = value[rows]
            else:
                chunk[key] = value
        prompt_cols = int(chunk["prompt_mask"].sum(dim=0).nonzero().min()) if chunk["prompt_mask"].any() else 0
        used = (chunk["completion_mask"].sum(dim=0) > 0).nonzero()
        completion_cols = int(used.max()) + 1 if used.numel() else 1
        width = chunk["completion_ids"].size(1)
        prompt_width = chunk["prompt_ids"].size(1)
        prompt_cols = prompt_width - round_up(prompt_width - prompt_cols, prompt_width)
        completion_cols = round_up(completion_cols, width)
        chunk["prompt_ids"] = chunk["prompt_ids"][:, prompt_cols:]
        chunk["prompt_mask"] = chunk["prompt_mask"][:, prompt_cols:]
        for key in _COMPLETION_KEYS:
            value = chunk.get(key)
            if isinstance(value, torch.Tensor) and value.dim() == 2 and value.size(1) == width:
                chunk[key] = value[:, :completion_cols]
        chunks.append(chunk)
    return chunks
