"""Group-relative advantages over SRPO's sub-groups (docs/srpo.md#advantages, paper §4.3).

A prompt's buffer holds a base group (``base`` iid rollouts from the question) and ``reset_groups`` shared-prefix
groups (``suffixes_per_reset`` suffixes each, resampled from one reset state). Advantages are normalized within
each of these groups separately, never across them. Only torch/stdlib.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["srpo_group_ids", "grouped_advantages"]


def srpo_group_ids(num_prompts: int, base: int, reset_groups: int, suffixes_per_reset: int) -> list[int]:
    """Group id of every row of ``num_prompts`` consecutive prompt blocks laid out as
    ``[base rows][reset group 1 rows]...[reset group R rows]`` (the trainer's row layout).

    Prompt ``p``'s base group is ``p * (R + 1)``; its reset group ``j`` (1-indexed) is ``p * (R + 1) + j``.
    """
    ids = []
    for prompt in range(num_prompts):
        first = prompt * (reset_groups + 1)
        ids.extend([first] * base)
        for group in range(1, reset_groups + 1):
            ids.extend([first + group] * suffixes_per_reset)
    return ids


def grouped_advantages(
    rewards: torch.Tensor,
    group_ids: Sequence[int] | torch.Tensor,
    *,
    scale: str = "group",
    valid: Sequence[bool] | torch.Tensor | None = None,
    eps: float = 1e-4,
) -> torch.Tensor:
    """``A_i = (r_i - mean_g) / (std_g + eps)`` within each group ``g`` (docs/srpo.md#advantages), as TRL 1.16 computes GRPO's.

    - ``mean_g``/``std_g`` are over the group's rows with a finite reward that are ``valid``; ``std`` is TRL's
      ``nanstd``: unbiased (Bessel, divides by n - 1).
    - ``scale``: ``"group"`` divides by the group's std, ``"batch"`` by the std of all valid rewards (TRL's
      ``scale_rewards="batch"``; the mean stays per group), ``"none"`` does not divide (Dr. GRPO).
    - A group whose std is 0 (all rewards equal) or that has fewer than two usable rows gets 0 everywhere, as do
      rows with a NaN reward (TRL's "unscorable" rows) and rows that are not ``valid`` (fallback rows, docs/srpo.md#seeds).
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}.")
    rewards = rewards.detach().to(torch.float64).flatten()
    groups = torch.as_tensor(list(group_ids) if not isinstance(group_ids, torch.Tensor) else group_ids)
    groups = groups.to(rewards.device).flatten()
    if groups.numel() != rewards.numel():
        raise ValueError(f"group_ids has {groups.numel()} entries but rewards has {rewards.numel()}.")
    usable = ~torch.isnan(rewards)
    if valid is not None:
        valid_tensor = torch.as_tensor(list(valid) if not isinstance(valid, torch.Tensor) else valid, dtype=torch.bool)
        usable &= valid_tensor.to(rewards.device).flatten()

    advantages = torch.zeros_like(rewards)
    batch_std = None
    if scale == "batch":
        batch_values = rewards[usable]
        batch_std = batch_values.std(unbiased=True) if batch_values.numel() > 1 else rewards.new_tensor(0.0)
    for group in torch.unique(groups):
        rows = (groups == group) & usable
        values = rewards[rows]
        if values.numel() < 2:
            continue
        std = values.std(unbiased=True)
        if torch.isclose(std, std.new_tensor(0.0)):
            continue  # all rewards equal: no signal (TRL gives 0 here too)
        centred = values - values.mean()
        if scale == "group":
            centred = centred / (std + eps)
        elif scale == "batch":
            centred = centred / (batch_std + eps)
        advantages[rows] = centred
    return advantages.to(torch.float32)
