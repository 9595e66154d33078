"""PRIME's math (Cui et al. 2025, "Process Reinforcement through Implicit Rewards", arXiv:2502.01456; docs/process.md,
"Implicit process rewards"): pure functions over tensors, no trainer, no model.

The implicit PRM π_φ is a causal LM. With a reference π_ref (the policy's initial weights) and β > 0 (paper §3.1):

    sequence reward     r_φ(y)   = β log π_φ(y) / π_ref(y)                      = Σ_t r_φ(y_t)
    token reward        r_φ(y_t) = β log π_φ(y_t | y_<t) / π_ref(y_t | y_<t)

π_φ learns online from the outcome labels r_o(y) ∈ {0, 1} of the current rollouts with the cross-entropy (§3.2)

    L_CE(φ) = -E[ r_o(y) log σ(r_φ(y)) + (1 - r_o(y)) log(1 - σ(r_φ(y))) ]

and the advantage of token t of rollout i among the K rollouts of its prompt is (§3.3, "RLOO with implicit process
rewards" plus "RLOO with outcome rewards", γ the discount):

    A_t^i = Σ_{s=t}^{|y^i|} γ^(s-t) [ r_φ(y_s^i) - 1/(K-1) Σ_{j≠i} r_φ(y^j) / |y^j| ]
            + r_o(y^i) - 1/(K-1) Σ_{j≠i} r_o(y^j)

(the process baseline: the leave-one-out mean of the other rollouts' *averaged* token rewards). The authors' released
recipe (verl's ``recipe/prime``) adds two scalings, kept here as options: the token rewards divided by the largest
|return| of the batch (``prime_norm="batch_norm"``: :func:`batch_max_normalized`) and the advantages whitened over
the batch's tokens (``masked_whiten``: :func:`whitened`); it also weighs the two terms (``reward_dpo_coef``,
``reward_gt_coef``, 5 each: equal, so a common scale the whitening removes).

A row "in a group" here is a credited row (scorable, in a group); a group with fewer than two credited rows has no
leave-one-out baseline and gets 0 (as GRPO gives a group without spread).
"""

from __future__ import annotations

import torch

__all__ = [
    "NORM_EPS", "WHITEN_EPS", "token_rewards", "cross_entropy_loss", "classification_accuracy",
    "pairwise_accuracy", "leave_one_out_means", "outcome_advantages", "process_returns", "prime_advantages",
    "has_baseline", "largest_return",
    "batch_max_normalized",
    "whitened",
]

#: verl's ``prime_norm="batch_norm"``: ``scores / (max |reverse cumsum| + 1e-6)``.
NORM_EPS = 1e-6
#: verl's ``masked_whiten``: ``(x - mean) * rsqrt(var + 1e-8)``, ``var`` unbiased.
WHITEN_EPS = 1e-8


def token_rewards(prm_logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """r_φ(y_t) = β (log π_φ(y_t|y_<t) - log π_ref(y_t|y_<t)) on the tokens of ``mask`` (B, T), 0 elsewhere."""
    return beta * (prm_logps - ref_logps) * mask.to(prm_logps.dtype)


def cross_entropy_loss(sequence_rewards: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """L_CE (§3.2) summed over the rows: ``-[r_o log σ(r_φ(y)) + (1 - r_o) log(1 - σ(r_φ(y)))]`` per row, with
    ``sequence_rewards`` r_φ(y) = β Σ_t (log π_φ - log π_ref) (B,) and ``labels`` r_o (B,) in [0, 1]. A sum, so
    that pieces of one batch (micro-batches, processes) add up; divide by the batch's row count for the mean."""
    return torch.nn.functional.binary_cross_entropy_with_logits(
        sequence_rewards, labels.to(sequence_rewards.dtype), reduction="sum")


def classification_accuracy(sequence_rewards: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per row, 1.0 where σ(r_φ(y)) is on the label's side of 1/2 (r_φ(y) > 0 for a correct row, < 0 for a wrong
    one), 0.0 on the other side, 0.5 at r_φ(y) = 0 exactly (σ = 1/2 predicts neither: the PRM at its
    initialization): the CE's own prediction."""
    agree = ((sequence_rewards > 0) == labels.bool()).to(torch.float64)
    return torch.where(sequence_rewards == 0, torch.full_like(agree, 0.5), agree)


def pairwise_accuracy(sequence_rewards: torch.Tensor, labels: torch.Tensor, group_ids: list[int]) -> float | None:
    """verl's ``compute_dpo_accuracy`` over the groups whose labels vary: of the pairs of rows of a group with
    different labels, the (label-difference-weighted) fraction that r_φ orders as the labels do. None when no group
    has such a pair (verl then counts 0.5)."""
    members: dict[int, list[int]] = {}
    for row, group in enumerate(group_ids):
        members.setdefault(group, []).append(row)
    agree = total = 0.0
    for rows in members.values():
        for a in range(len(rows)):
            for b in range(a + 1, len(rows)):
                label_gap = float(labels[rows[a]] - labels[rows[b]])
                if label_gap == 0:
                    continue
                score_gap = float(sequence_rewards[rows[a]] - sequence_rewards[rows[b]])
                agree += abs(label_gap) * float((score_gap > 0) == (label_gap > 0))
                total += abs(label_gap)
    return None if total == 0 else agree / total


def leave_one_out_means(values: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per row i, 1/(K-1) Σ_{j≠i} values_j over the valid rows j of i's group (K its valid rows); 0 for an invalid
    row and for a group with fewer than two valid rows. ``values`` (N,), ``group_ids`` (N,), ``valid`` (N,) bool."""
    values = values.double()
    result = torch.zeros_like(values)
    for group in torch.unique(group_ids[valid]).tolist():
        rows = valid & (group_ids == group)
        count = int(rows.sum())
        if count < 2:
            continue
        total = values[rows].sum()
        result[rows] = (total - values[rows]) / (count - 1)
    return result


def outcome_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """RLOO with outcome rewards: ``r_o(y^i) - 1/(K-1) Σ_{j≠i} r_o(y^j)`` per valid row (N,); 0 for the others and
    for a group with fewer than two valid rows."""
    baseline = leave_one_out_means(rewards, group_ids, valid)
    enough = _in_groups_of_two_or_more(group_ids, valid)
    return torch.where(enough, rewards.double() - baseline, torch.zeros_like(baseline))


def process_returns(rewards: torch.Tensor, mask: torch.Tensor, baselines: torch.Tensor, gamma: float = 1.0
                    ) -> torch.Tensor:
    """RLOO with implicit process rewards: ``Σ_{s>=t} γ^(s-t) (r_φ(y_s) - b)`` for each token t of ``mask`` (B, T),
    with b the row's baseline (``baselines`` (B,): :func:`leave_one_out_means` of the rows' mean token rewards);
    0 off the mask."""
    mask = mask.to(torch.float64)
    centred = (rewards.double() - baselines.double()[:, None]) * mask
    returns = torch.zeros_like(centred)
    running = torch.zeros(centred.size(0), dtype=torch.float64, device=centred.device)
    for t in reversed(range(centred.size(1))):
        running = centred[:, t] + gamma * running
        returns[:, t] = running
    return returns * mask


def prime_advantages(returns: torch.Tensor, outcome: torch.Tensor, mask: torch.Tensor, has_baseline: torch.Tensor,
                     process_coef: float = 1.0, outcome_coef: float = 1.0) -> torch.Tensor:
    """A_t^i (§3.3): ``process_coef * returns + outcome_coef * outcome`` on the tokens of ``mask`` (B, T), with
    ``returns`` from :func:`process_returns` and ``outcome`` (B,) from :func:`outcome_advantages`; 0 for a row
    without a leave-one-out baseline (``has_baseline`` (B,) False: invalid, or fewer than two valid rows in its
    group), as GRPO gives a group it cannot compare."""
    mask = mask.to(torch.float64)
    values = process_coef * returns.double() + outcome_coef * outcome.double()[:, None] * mask
    return values * has_baseline.to(values)[:, None]


def has_baseline(group_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(N,) bool: valid rows with at least one other valid row in their group (a leave-one-out baseline)."""
    return _in_groups_of_two_or_more(group_ids, valid)


def batch_max_normalized(rewards: torch.Tensor, largest_return: float) -> torch.Tensor:
    """verl's ``prime_norm="batch_norm"``: the token rewards divided by ``largest_return + 1e-6``, with
    ``largest_return`` the largest |Σ_{s>=t} r_s| over every token of the batch (all processes)."""
    return rewards / (largest_return + NORM_EPS)


def largest_return(rewards: torch.Tensor) -> float:
    """max over rows and tokens of |Σ_{s>=t} r_s| (the reverse cumulative sum), 0.0 for an empty batch."""
    if rewards.numel() == 0:
        return 0.0
    return float(rewards.flip(dims=[1]).cumsum(dim=1).abs().max())


def whitened(values: torch.Tensor, mask: torch.Tensor, total: float, total_squares: float, count: float
             ) -> torch.Tensor:
    """verl's ``masked_whiten``: ``(x - mean) / sqrt(var + 1e-8)`` on the tokens of ``mask``, 0 elsewhere; ``mean``
    and the unbiased ``var`` from the batch's (all processes') ``total``, ``total_squares`` and ``count`` of the
    masked values. Fewer than two values: the values as they are (no statistics)."""
    if count < 2:
        return values * mask
    mean = total / count
    variance = (total_squares - count * mean * mean) / (count - 1)
    return (values - mean) / (max(variance, 0.0) + WHITEN_EPS) ** 0.5 * mask


def _in_groups_of_two_or_more(group_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    enough = torch.zeros_like(valid)
    for group in torch.unique(group_ids[valid]).tolist():
        rows = valid & (group_ids == group)
        if int(rows.sum()) >= 2:
            enough |= rows
    return enough
