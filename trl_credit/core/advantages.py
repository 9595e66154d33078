"""Group-normalized outcome advantages over any groups of rows (docs/design.md#the-credit-core): what
:class:`trl_credit.core.trainer.GroupOutcome` computes when the groups are not TRL's consecutive ones (SRPO's base and
shared-prefix sub-groups, docs/srpo.md#advantages). Only torch/stdlib.

Two ways to combine several reward functions, as TRL's ``multi_objective_aggregation``:
:func:`grouped_advantages` normalizes the weighted total reward ("sum_then_normalize"),
:func:`normalize_then_sum_advantages` normalizes each reward function within the group first ("normalize_then_sum",
GDPO).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["grouped_advantages", "normalize_then_sum_advantages"]


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
      rows with a NaN reward (TRL's "unscorable" rows) and rows that are not ``valid`` (rows in no group, e.g.
      SRPO's fallback rows, docs/srpo.md#seeds).
    - A group with a reward of ±inf gets 0 everywhere (TRL: its mean and std are non-finite, its advantages NaN, then
      0); with ``scale="batch"`` every group does (TRL's batch std is then inf), whatever ``scale``, never ±inf.
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
        if not torch.isfinite(batch_values).all():
            return advantages.to(torch.float32)
        batch_std = batch_values.std(unbiased=True) if batch_values.numel() > 1 else rewards.new_tensor(0.0)
    for group in torch.unique(groups):
        rows = (groups == group) & usable
        values = rewards[rows]
        if values.numel() < 2 or not torch.isfinite(values).all():
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


def normalize_then_sum_advantages(
    rewards_per_func: torch.Tensor,
    group_ids: Sequence[int] | torch.Tensor,
    weights: Sequence[float] | torch.Tensor,
    *,
    valid: Sequence[bool] | torch.Tensor | None = None,
    eps: float = 1e-4,
) -> torch.Tensor:
    """TRL 1.16's ``multi_objective_aggregation="normalize_then_sum"`` (GRPOTrainer._generate_and_score_completions;
    GDPO, arXiv 2601.05242) over any groups (SRPO's: each base or shared-prefix group, never across them, paper
    §4.3). For ``rewards_per_func`` of shape (N, K):

    1. per group ``g`` and reward function ``k``: ``z_ik = (r_ik - mean_gk) / (std_gk + eps)`` over the group's
       usable rows where function ``k`` returned a number (``std`` unbiased, TRL's ``nanstd``). A function whose
       values in the group are all equal (std 0), or that scored fewer than two of its rows, contributes 0 there
       (TRL: ``0 / (0 + eps)``, and a NaN that ``nansum`` drops); so does a function that returned None for a row,
       and one that returned ±inf for a row of the group (TRL: NaN for the whole group, dropped by ``nansum``).
    2. ``s_i = sum_k w_k z_ik``.
    3. batch: ``A_i = (s_i - mean(s)) / (std(s) + eps)`` over all usable rows of the batch (every prompt, every
       group). ``mean(s)`` is 0 up to rounding (each ``z_k`` is centred within its group), so this only rescales by
       one batch-wide factor: no group's advantages move relative to another's. ``scale_rewards`` plays no part, as in TRL.

    Usable rows: ``valid`` (in a group; not SRPO's fallback rows) and scorable (some reward function returned a
    number); the others get advantage 0 and are left out of every statistic. Fewer than two usable rows: 0 everywhere.
    """
    values = rewards_per_func.detach().to(torch.float64)
    if values.dim() != 2:
        raise ValueError(f"rewards_per_func must have shape (rows, reward functions), got {tuple(values.shape)}.")
    num_rows, num_funcs = values.shape
    weights = torch.as_tensor(
        list(weights) if not isinstance(weights, torch.Tensor) else weights.detach(), dtype=torch.float64
    ).to(values.device).flatten()
    if weights.numel() != num_funcs:
        raise ValueError(f"weights has {weights.numel()} entries but rewards_per_func has {num_funcs} columns.")
    groups = torch.as_tensor(list(group_ids) if not isinstance(group_ids, torch.Tensor) else group_ids)
    groups = groups.to(values.device).flatten()
    if groups.numel() != num_rows:
        raise ValueError(f"group_ids has {groups.numel()} entries but rewards_per_func has {num_rows} rows.")
    usable = ~torch.isnan(values).all(dim=1)
    if valid is not None:
        valid_tensor = torch.as_tensor(list(valid) if not isinstance(valid, torch.Tensor) else valid, dtype=torch.bool)
        usable &= valid_tensor.to(values.device).flatten()

    normalized = torch.zeros_like(values)  # z_ik; 0 where a function has no signal or no value
    for group in torch.unique(groups):
        in_group = (groups == group) & usable
        for k in range(num_funcs):
            rows = in_group & ~torch.isnan(values[:, k])
            scored = values[rows, k]
            if scored.numel() < 2 or not torch.isfinite(scored).all():
                continue
            std = scored.std(unbiased=True)
            if torch.isclose(std, std.new_tensor(0.0)):
                continue  # all equal: no signal from this function in this group (TRL: 0 / (0 + eps))
            normalized[rows, k] = (scored - scored.mean()) / (std + eps)
    summed = (normalized * weights.unsqueeze(0)).sum(dim=1)

    advantages = torch.zeros(num_rows, dtype=torch.float64, device=values.device)
    batch = summed[usable]
    if batch.numel() < 2:
        return advantages.to(torch.float32)
    advantages[usable] = (batch - batch.mean()) / (batch.std(unbiased=True) + eps)
    return advantages.to(torch.float32)
