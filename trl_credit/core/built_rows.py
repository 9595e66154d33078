"""The generic moves of a rollout that builds its own training rows (``Rollout.builds_rows``: DATPO's branch rows),
offered to parts through the batch context (docs/design.md#the-batch-context): what TRL's batch needs of rows TRL did
not generate, whatever the method decides about their advantages and masks.

- :func:`pad_built_rows`: this process's rows in TRL's layout, with filler rows up to the largest row count of any
  process (TRL's ``_compute_loss`` gathers per-row tensors, so every process needs the same count).
- :func:`score_collectively`: no-grad log-probs of built rows (TRL's old / ref passes for them), with the same number
  of forwards on every process.
- :func:`sampling_logprobs_rows`: vLLM's sampling log-probs of built rows as TRL's ``sampling_per_token_logps``.
- :func:`importance_sampling_ratio`: TRL's vLLM importance-sampling correction of built rows.

Every function but the last two takes the batch context (``ctx``) and is a collective call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from trl_credit.core.collectives import fill_rows
from trl_credit.core.scoring import pad_rows

__all__ = ["PaddedRows", "pad_built_rows", "score_collectively", "sampling_logprobs_rows", "importance_sampling_ratio"]


class PaddedRows(NamedTuple):
    """Built rows in TRL's layout (prompts left-padded, completions right-padded), filler rows last, outside the
    loss mask; ``row_counts``: the real rows of every process, in process order."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    row_counts: list[int]


def pad_built_rows(ctx, prompt_rows: Sequence[Sequence[int]], completion_rows: Sequence[Sequence[int]]) -> PaddedRows:
    """This process's rows (``prompt_rows[i]`` + ``completion_rows[i]``) padded as TRL pads (``ctx.rows``:
    ``pad_token_id``, ``pad_to_multiple_of``), then filler rows up to the largest row count of any process: a
    one-token prompt (so attention stays finite) and one completion token outside the loss mask, so they add nothing
    to the loss or to ``num_items_in_batch``. A collective call (the row counts are gathered)."""
    if len(prompt_rows) != len(completion_rows):
        raise ValueError(f"pad_built_rows: prompt_rows has {len(prompt_rows)} rows, completion_rows "
                         f"{len(completion_rows)}; they must pair up.")
    real = len(completion_rows)
    row_counts = ctx.gather_counts(real)
    n_rows = max(row_counts)
    pad_id = ctx.rows.pad_token_id
    p_ids, p_mask, c_ids, c_mask = pad_rows(
        fill_rows(list(prompt_rows), n_rows, [pad_id]), fill_rows(list(completion_rows), n_rows, [pad_id]), pad_id,
        ctx.device, ctx.rows.pad_to_multiple_of,
    )
    if n_rows > real:
        c_mask[real:] = 0
    return PaddedRows(p_ids, p_mask, c_ids, c_mask, row_counts)


def score_collectively(ctx, model, prompt_rows: Sequence[Sequence[int]], completion_rows: Sequence[Sequence[int]]):
    """Log-probs ``(rows, T)`` of ``completion_rows`` after ``prompt_rows`` under ``model`` (``ctx.logprobs``), in
    batches of ``per_device_train_batch_size`` rows; None when no process has rows.

    Every process runs the same number of forward passes (ZeRO-3 gathers parameters in each): a process with
    fewer rows scores a one-token filler row instead and drops the result.
    """
    counts = ctx.gather_counts(len(completion_rows))
    most = max(counts)
    if most == 0:
        return None
    batch_size = ctx.args.per_device_train_batch_size
    pad_id = ctx.rows.pad_token_id
    pieces = []
    for start in range(0, most, batch_size):
        prompts = list(prompt_rows[start : start + batch_size])
        completions = list(completion_rows[start : start + batch_size])
        real = len(completions)
        if real == 0:
            prompts, completions = [[pad_id]], [[pad_id]]
        p_ids, p_mask, c_ids, c_mask = pad_rows(prompts, completions, pad_id, ctx.device)
        logps, _ = ctx.logprobs(p_ids, p_mask, c_ids, c_mask, model=model, batch_size=len(completions))
        if real:
            pieces.append(logps)
    if not pieces:
        return torch.zeros(0, 1, device=ctx.device)
    width = max(p.size(1) for p in pieces)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.size(1))) for p in pieces], dim=0)


def sampling_logprobs_rows(logprobs: Sequence[Sequence[float | None]], width: int, device) -> torch.Tensor:
    """vLLM's sampling log-probs of built rows as a ``(rows, width)`` tensor (right-padded with 0); a token vLLM
    could not score (None) is NaN, as TRL writes it."""
    values = torch.zeros(len(logprobs), width, device=device)
    for r, row in enumerate(logprobs):
        values[r, : len(row)] = torch.tensor([float("nan") if x is None else float(x) for x in row], device=device)
    return values


def importance_sampling_ratio(settings, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio of rows (``settings``: ``vllm_importance_sampling_mode``,
    ``vllm_importance_sampling_clip_min`` / ``_clip_max``, as ``ctx.rows`` holds them): the same formula as
    ``GRPOTrainer._generate_and_score_completions`` (trl 1.16.0) for its own rows. Sequence modes give ``(rows, 1)``,
    token modes ``(rows, T)``; ``*_truncate`` clamps to the bounds, ``*_mask`` zeroes what falls outside them."""
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    mode = settings.vllm_importance_sampling_mode
    log_ratio = diff.sum(dim=-1, keepdim=True) if mode in ("sequence_mask", "sequence_truncate") else diff
    ratio = torch.exp(log_ratio)
    low, high = settings.vllm_importance_sampling_clip_min, settings.vllm_importance_sampling_clip_max
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=low, max=high)
    low = -math.inf if low is None else low
    high = math.inf if high is None else high
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
