"""Group-normalized outcome advantages over any groups of rows (docs/design.md#the-credit-core): what
:class:`trl_credit.core.trainer.GroupOutcome` computes when the groups are not TRL's consecutive ones (SRPO's base and
shared-prefix sub-groups, docs/srpo.md#advantages). Only torch/stdlib.

Two ways to combine several reward functions, as TRL's ``multi_objective_aggregation``:
:func:`grouped_advantages` normalizes the weighted total reward ("sum_then_normalize"),
:func:`normalize_then_sum_advantages` normalizes each reward function within the group first ("normalize_then_sum",
GDPO). :func:`trl_advantages` is TRL's own computation over its consecutive groups, restated operation by operation
so that it gives TRL's float32 values bit for bit: every row's, before TRL cuts them to a process's rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["grouped_advantages", "normalize_then_sum_advantages", "trl_advantages"]


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


def trl_advantages(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, num_generations: int,
                   scale_rewards: str = "group", multi_objective_aggregation: str = "sum_then_normalize",
                   eps: float = 1e-4) -> torch.Tensor:
    """GRPO's advantages of every row (N,) as ``GRPOTrainer._generate_and_score_completions`` computes them from the
    global reward matrix (N, K) before it keeps its process's slice: groups of ``num_generations`` consecutive rows,
    the same float32 operations in the same order as trl 1.14.2, 1.15 and 1.16 (whose code is the same), so the values
    are TRL's bit for bit (tests/test_trl_contract.py checks it against the installed TRL). Unlike
    :func:`grouped_advantages` (float64, any groups) it must not be "improved": its one job is to equal TRL's.

    Rows every reward function returned None for (NaN) stay out of the means and stds and get 0, as TRL's."""
    device = rewards_per_func.device
    weights = reward_weights.to(device).unsqueeze(0)
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    size = num_generations
    if multi_objective_aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        mean = torch.nanmean(rewards.view(-1, size), dim=1).repeat_interleave(size, dim=0)
        if scale_rewards in ("group", "none"):  # "none": TRL computes the std only for its logs
            std = (_trl_nanstd(rewards.view(-1, size), dim=1).repeat_interleave(size, dim=0) if size > 1
                   else torch.zeros_like(rewards))
        elif scale_rewards == "batch":
            std = _trl_nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        else:
            raise ValueError(f"scale_rewards must be 'batch', 'group' or 'none', got {scale_rewards!r}.")
        advantages = rewards - mean
        if scale_rewards != "none":
            advantages = advantages / (std + eps)
    elif multi_objective_aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, size, rewards_per_func.size(1))
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = _trl_nanstd(grouped, dim=1, keepdim=True) if size > 1 else torch.zeros_like(mean_k)
        reward_k = ((grouped - mean_k) / (std_k + eps)).view(-1, rewards_per_func.size(1))
        rewards = (reward_k * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = _trl_nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std + eps)
    else:
        raise ValueError("multi_objective_aggregation must be 'sum_then_normalize' or 'normalize_then_sum', got "
                         f"{multi_objective_aggregation!r}.")
    return torch.nan_to_num(advantages, nan=0.0)


def _trl_nanstd(tensor: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """``trl.trainer.utils.nanstd`` (trl 1.14.2-1.16), restated: the unbiased std ignoring NaNs (NaN below two
    values)."""
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction
    std = torch.sqrt(variance)
    if keepdim:
        return std
    return std.squeeze() if dim is None else std.squeeze(dim)
