"""OPPO's Bayesian value recursion and per-group normalization (docs/oppo.md#algorithm; paper §3–4, App. B, E).

Pure tensor functions, no trainer state. Shapes: ``B`` completions (rows), ``T`` completion positions (TRL's
right-padded completion layout); ``completion_mask`` is 1 on real tokens, 0 on padding. Everything is vectorized
over tokens (cumulative sums), and computed in at least float32 (float64 inputs stay float64).

Notation (paper Eq. 20 and docs/oppo.md):
    o_t = log π̂(y_t | x, y*, y_<t)          oracle log-prob (answer in context)
    s_t = log π̂(y_t | x, y_<t)              plain log-prob
    log λ_t = clip(o_t − s_t, −C, C)         evidence (Bayes factor), C = ``evidence_clip``
    ℓ_0 = log((k + α) / (G − k + α))         prior log-odds, k correct out of G, α = ``prior_strength``
    ℓ_1 = ℓ_0,  ℓ_{t+1} = ℓ_t + log λ_t       log-odds of success before token t
    V_t = σ(ℓ_t)                             running value
    A_t^raw = σ(ℓ_t + log λ_t) − σ(ℓ_t)      = V_{t+1} − V_t
    Â_t = sign(A^seq) · |A_t^raw|            direction anchoring (sign(A^seq) from the rewards: sequence_anchor_signs)
    Ã_t = (Â_t − mean_g) / (std_g + ε)       over the valid tokens of the group g (prompt)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trl_credit.core.success import total_rewards, unscorable_rows

__all__ = [
    "TokenCredit",
    "group_index",
    "group_totals",
    "sequence_anchor_signs",
    "evidence_log_ratio",
    "prior_log_odds",
    "group_success_counts",
    "value_recursion",
    "anchor_direction",
    "bayesian_value_recursion",
    "bayesian_token_advantages",
    "row_token_moments",
    "group_moments",
    "normalize_with_group_moments",
    "normalize_per_group",
    "evidence_ranking",
]


def _work_dtype(tensor: torch.Tensor) -> torch.dtype:
    # bf16/fp16 log-probs would lose the small differences o_t - s_t; float64 inputs keep float64.
    return torch.promote_types(tensor.dtype, torch.float32)


def evidence_log_ratio(
    oracle_logps: torch.Tensor,
    student_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    evidence_clip: float = 3.0,
    clipping: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token evidence log λ_t = clip(o_t − s_t, −C, C) (docs/oppo.md#evidence, paper Eq. 20).

    Returns ``(log_lambda, clipped)``, both (B, T): ``log_lambda`` is 0 on padding; ``clipped`` marks the valid
    tokens whose raw evidence |o_t − s_t| exceeded C (reported even when ``clipping=False``, the "remove clipping"
    ablation of Table 2, in which case log λ_t = o_t − s_t unclipped).
    """
    dtype = _work_dtype(oracle_logps)
    mask = completion_mask.to(torch.bool)
    raw = (oracle_logps.to(dtype) - student_logps.to(dtype)).masked_fill(~mask, 0.0)
    clipped = (raw.abs() > evidence_clip) & mask
    log_lambda = raw.clamp(-evidence_clip, evidence_clip) if clipping else raw
    return log_lambda, clipped


def prior_log_odds(
    num_correct: torch.Tensor, group_size: int | torch.Tensor, prior_strength: float = 1.0
) -> torch.Tensor:
    """ℓ_0 = log((k + α) / (G − k + α)), the log-odds of the Beta(α, α)-smoothed group success rate
    V̂_0 = (k + α) / (G + 2α) (docs/oppo.md#prior, paper Eq. 20). ``num_correct`` k is per row (B,) so any layout works;
    ``group_size`` G is an int or per row (B,)."""
    if prior_strength <= 0:
        raise ValueError(f"prior_strength (α) must be > 0, got {prior_strength}: α = 0 gives infinite log-odds.")
    k = num_correct.to(torch.float64)
    group = torch.as_tensor(group_size, dtype=torch.float64, device=k.device)
    return torch.log((k + prior_strength) / (group - k + prior_strength))


def group_index(groups: int | torch.Tensor, num_rows: int) -> torch.Tensor:
    """(N,) long: each row's group id, from ``groups`` as given ((N,) ids, any layout; a negative id, ``NO_GROUP``,
    puts the row in no group) or, for an int, groups of that many consecutive rows (TRL's layout)."""
    if isinstance(groups, int):
        if groups <= 0 or num_rows % groups:
            raise ValueError(f"{num_rows} rows do not form groups of {groups} consecutive rows.")
        return torch.arange(num_rows) // groups
    ids = torch.as_tensor(groups).flatten()
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.numel() != num_rows:
        raise ValueError(f"groups must be an int group size or {num_rows} integer group ids, got {groups!r:.80}.")
    return ids.long()


def group_totals(values: torch.Tensor, groups: int | torch.Tensor) -> torch.Tensor:
    """Per group (ids 0 .. max id, :func:`group_index`), the sum of ``values`` (bool or int, one per row) over its
    rows, (num_groups,) long; rows in no group count nowhere."""
    ids = group_index(groups, values.numel()).to(values.device)
    in_group = ids >= 0
    num_groups = int(ids.max()) + 1 if bool(in_group.any()) else 0
    totals = torch.zeros(num_groups, dtype=torch.long, device=values.device)
    return totals.index_add_(0, ids[in_group], values.flatten()[in_group].long())


def group_success_counts(
    correct: torch.Tensor, scorable: torch.Tensor, groups: int | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group (``groups``: a size of consecutive groups, or per-row group ids of any layout, :func:`group_index`):
    k = number of correct completions (the verifier's decision) and G = number of *scorable* completions, the trials
    of the Beta-smoothed success rate V̂_0 = (k + α)/(G + 2α) of Eq. 20. A completion no reward function could score
    is no trial: it is neither a success nor a failure, so it counts in neither k nor G; nor does a row in no group."""
    correct = correct.to(torch.bool) & scorable.to(torch.bool)
    return group_totals(correct, groups), group_totals(scorable.to(torch.bool), groups)


def sequence_anchor_signs(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    groups: int | torch.Tensor,
    success_index: int,
    aggregation: str = "sum_then_normalize",
    rtol: float = 1e-6,
) -> torch.Tensor:
    """sign(A^seq) of every row, (N,) float64 in {−1, 0, +1} (docs/oppo.md#direction-anchoring, paper Eq. 21): where
    TRL's group-normalized advantage of the row points, computed from the raw rewards so that a tie is a tie, within
    each group of ``groups`` (a size of consecutive groups, TRL's layout, or per-row group ids of any layout,
    :func:`group_index`; a row in no group gets 0).

    TRL's advantage is the reward minus the group mean (``"sum_then_normalize"``: of the weighted total; or
    ``"normalize_then_sum"``: the weighted sum of each reward function's z-score in the group), times a positive
    scale, so its sign is that of the deviation. TRL computes it in float32, where a row that ties the group mean gets
    ±1e-7 instead of 0, and the anchoring would turn that into full-size credit. Here a deviation within ``rtol`` of
    the group's reward scale (its largest |reward|, per summed column; 1e-6 is about 8 float32 ulps, the rewards' own
    precision) is round-off and counts as 0; so is a weighted sum of z-scores within ``rtol`` of the sum of their
    magnitudes. Unscorable rows (every function returned None) get 0. A scorable row whose verifier (column
    ``success_index``) returned None is not correct (docs/design.md#success-and-unscorable-rows): its verifier reward
    counts as 0, as TRL's weighted sum counts it under ``"sum_then_normalize"`` (under ``"normalize_then_sum"`` TRL
    would put it at the group's mean verifier score).
    """
    rewards = rewards_per_func.to(torch.float64).clone()
    unscorable = unscorable_rows(rewards)
    verifier = rewards[:, success_index]
    rewards[:, success_index] = torch.where(torch.isnan(verifier) & ~unscorable, 0.0, verifier)
    weights = reward_weights.to(device=rewards.device, dtype=torch.float64)
    if aggregation == "sum_then_normalize":
        columns, weights = total_rewards(rewards, weights).unsqueeze(1), weights.new_ones(1)
    elif aggregation == "normalize_then_sum":
        columns = rewards
    else:
        raise ValueError(f"Unknown multi_objective_aggregation {aggregation!r}.")
    ids = group_index(groups, rewards.size(0)).to(rewards.device)
    signs = torch.zeros(rewards.size(0), dtype=torch.float64, device=rewards.device)
    for group in torch.unique(ids[ids >= 0]).tolist():
        rows = (ids == group).nonzero().flatten()
        signs[rows] = _group_anchor_signs(columns[rows].unsqueeze(0), weights, rtol)
    return signs.masked_fill(unscorable, 0.0)


def _group_anchor_signs(grouped: torch.Tensor, weights: torch.Tensor, rtol: float) -> torch.Tensor:
    """sign(A^seq) of the rows of one group, ``grouped`` (1, G, columns) float64, NaN where not scored."""
    valid = ~torch.isnan(grouped)
    values = grouped.nan_to_num(0.0)
    count = valid.sum(dim=1, keepdim=True)
    mean = values.sum(dim=1, keepdim=True) / count.clamp(min=1)
    deviation = torch.where(valid, values - mean, 0.0)
    scale = values.abs().amax(dim=1, keepdim=True)
    deviation = deviation.masked_fill(deviation.abs() <= rtol * scale, 0.0)
    std = (deviation.square().sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
    terms = deviation / (std + 1e-4) * weights  # TRL's z-scores (a positive per-group factor for a single column)
    direction = terms.sum(dim=2)
    direction = direction.masked_fill(direction.abs() <= rtol * terms.abs().sum(dim=2), 0.0)
    return torch.sign(direction).reshape(-1)


def value_recursion(
    log_lambda: torch.Tensor, initial_log_odds: torch.Tensor, completion_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recursion ℓ_1 = ℓ_0, ℓ_{t+1} = ℓ_t + log λ_t and A_t^raw = σ(ℓ_t + log λ_t) − σ(ℓ_t) (docs/oppo.md#value-recursion,
    paper Eq. 10/B.2–B.3), vectorized: ℓ_t = ℓ_0 + Σ_{s<t} log λ_s is an exclusive cumulative sum.

    Returns ``(values, raw_advantages)``, both (B, T): V_t = σ(ℓ_t) and A_t^raw, 0 on padding. Σ_t A_t^raw
    telescopes to σ(ℓ_{T+1}) − σ(ℓ_0) (App. B.4), and |A_t^raw| ≤ |log λ_t| / 4 (App. B.5).
    """
    dtype = _work_dtype(log_lambda)
    mask = completion_mask.to(torch.bool)
    log_lambda = log_lambda.to(dtype).masked_fill(~mask, 0.0)  # padding carries no evidence
    inclusive = torch.cumsum(log_lambda, dim=1)
    exclusive = torch.cat([torch.zeros_like(inclusive[:, :1]), inclusive[:, :-1]], dim=1)
    log_odds_before = initial_log_odds.to(dtype).unsqueeze(1) + exclusive  # ℓ_t
    log_odds_after = log_odds_before + log_lambda  # ℓ_{t+1}
    values = torch.sigmoid(log_odds_before).masked_fill(~mask, 0.0)
    raw_advantages = (torch.sigmoid(log_odds_after) - torch.sigmoid(log_odds_before)).masked_fill(~mask, 0.0)
    return values, raw_advantages


def anchor_direction(
    raw_advantages: torch.Tensor, seq_advantages: torch.Tensor, completion_mask: torch.Tensor, anchoring: bool = True
) -> torch.Tensor:
    """Â_t = sign(A^seq) · |A_t^raw| (docs/oppo.md#direction-anchoring, paper Eq. 21): the verifier decides the sign of every token of a
    completion, the recursion only its magnitude; A^seq = 0 (zero-variance group) gives 0 everywhere. The sign holds
    for Â only: the group normalization after it (Eq. 21) shifts every token by the group mean, so a small token of a
    wrong answer can end positive (docs/oppo.md#group-normalization).
    ``anchoring=False`` is the "remove anchoring" ablation: the sign comes from log λ_t (Â_t = A_t^raw)."""
    mask = completion_mask.to(torch.bool)
    if not anchoring:
        return raw_advantages.masked_fill(~mask, 0.0)
    sign = torch.sign(seq_advantages.to(raw_advantages.dtype)).unsqueeze(1)
    return (sign * raw_advantages.abs()).masked_fill(~mask, 0.0)


@dataclass
class TokenCredit:
    """What the recursion computed for a batch (all (B, T) tensors are 0 on padding)."""

    advantages: torch.Tensor  # Â_t, anchored, before normalization
    values: torch.Tensor  # V_t = σ(ℓ_t), the running success probability before token t
    log_lambda: torch.Tensor  # evidence log λ_t as used (clipped unless clipping is off)
    evidence_clipped: torch.Tensor  # bool: |o_t − s_t| > C
    prior_values: torch.Tensor  # (B,) V_0 = σ(ℓ_0)


def bayesian_value_recursion(
    oracle_logps: torch.Tensor,
    student_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    seq_advantages: torch.Tensor,
    num_correct: torch.Tensor,
    group_size: int | torch.Tensor,
    evidence_clip: float = 3.0,
    prior_strength: float = 1.0,
    *,
    anchoring: bool = True,
    state_tracking: bool = True,
    clipping: bool = True,
    use_prior: bool = True,
    log_lambda_only: bool = False,
) -> TokenCredit:
    """OPPO's per-token advantages Â (B, T) before normalization, with the recursion's by-products (docs/oppo.md#algorithm).

    Args:
        oracle_logps, student_logps: o_t and s_t, (B, T).
        completion_mask: (B, T), 1 on real completion tokens.
        seq_advantages: (B,) the group-normalized sequence advantage A^seq; only its sign is used (anchoring).
        num_correct: (B,) k of each row's group (completions with reward ≥ the success threshold).
        group_size: G (int, or (B,) per row).
        evidence_clip: C. prior_strength: α.

    Ablation switches (docs/oppo.md#ablations, paper Table 2), each changing only what it names:
        anchoring=False: Â_t = A_t^raw (sign from log λ_t).
        state_tracking=False: A_t^raw = log λ_t / 4 (the state weight V(1−V) fixed at its maximum 1/4).
        clipping=False: log λ_t = o_t − s_t unclipped.
        use_prior=False: ℓ_0 = 0 (V_0 = 1/2).
        log_lambda_only=True: A_t^raw = o_t − s_t (neither tracking nor clipping; anchoring still applies):
            the anchored-distillation signal of App. E, Table 4 (SDPO row).
    """
    if log_lambda_only:
        state_tracking, clipping = False, False
    log_lambda, clipped = evidence_log_ratio(
        oracle_logps, student_logps, completion_mask, evidence_clip=evidence_clip, clipping=clipping
    )
    if use_prior:
        initial = prior_log_odds(num_correct, group_size, prior_strength).to(device=log_lambda.device)
    else:
        initial = torch.zeros(log_lambda.size(0), dtype=torch.float64, device=log_lambda.device)
    values, raw = value_recursion(log_lambda, initial, completion_mask)
    if log_lambda_only:
        raw = log_lambda.clone()
    elif not state_tracking:
        raw = log_lambda / 4.0
    advantages = anchor_direction(raw, seq_advantages, completion_mask, anchoring=anchoring)
    return TokenCredit(
        advantages=advantages,
        values=values,
        log_lambda=log_lambda,
        evidence_clipped=clipped,
        prior_values=torch.sigmoid(initial).to(log_lambda.dtype),
    )


def bayesian_token_advantages(
    oracle_logps: torch.Tensor,
    student_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    seq_advantages: torch.Tensor,
    num_correct: torch.Tensor,
    group_size: int | torch.Tensor,
    evidence_clip: float = 3.0,
    prior_strength: float = 1.0,
    **switches,
) -> torch.Tensor:
    """The anchored per-token advantages Â (B, T) before normalization (docs/oppo.md#algorithm); see
    :func:`bayesian_value_recursion` for the arguments and the ablation switches."""
    return bayesian_value_recursion(
        oracle_logps,
        student_logps,
        completion_mask,
        seq_advantages,
        num_correct,
        group_size,
        evidence_clip,
        prior_strength,
        **switches,
    ).advantages


def row_token_moments(advantages: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Per-row (sum, sum of squares, count) of the valid tokens, (B, 3) float64: the sufficient statistics of
    docs/oppo.md#group-normalization, small enough to gather across processes when a group spans several of them."""
    mask = completion_mask.to(torch.float64)
    values = advantages.to(torch.float64) * mask
    return torch.stack([values.sum(1), (values * values).sum(1), mask.sum(1)], dim=1)


def group_moments(row_moments: torch.Tensor, group_ids: torch.Tensor, num_groups: int | None = None) -> torch.Tensor:
    """Sum the per-row moments (R, 3) into per-group moments (num_groups, 3); ``group_ids`` (R,) in [0, num_groups),
    or negative (``NO_GROUP``) for a row in no group, whose moments count nowhere."""
    group_ids = group_ids.to(device=row_moments.device, dtype=torch.long)
    in_group = group_ids >= 0
    if num_groups is None:
        num_groups = int(group_ids.max().item()) + 1 if bool(in_group.any()) else 0
    totals = torch.zeros(num_groups, 3, dtype=torch.float64, device=row_moments.device)
    return totals.index_add_(0, group_ids[in_group], row_moments.to(torch.float64)[in_group])


def normalize_with_group_moments(
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    group_ids: torch.Tensor,
    moments: torch.Tensor,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Ã = (Â − mean_g) / (std_g + eps) on valid tokens, 0 on padding (docs/oppo.md#group-normalization, paper Eq. 21), with the mean and
    population standard deviation of group g taken over all its valid tokens (``moments`` from
    :func:`group_moments`, possibly gathered from other processes). A group whose tokens are all 0 stays 0; a row
    in no group (negative id, ``NO_GROUP``) gets 0."""
    group_ids = group_ids.to(device=advantages.device, dtype=torch.long)
    in_group = group_ids >= 0
    sums, sumsq, counts = moments[group_ids.clamp(min=0)].unbind(dim=1)
    counts = counts.clamp(min=1.0)
    mean = sums / counts
    std = (sumsq / counts - mean * mean).clamp(min=0.0).sqrt()
    normalized = (advantages.to(torch.float64) - mean.unsqueeze(1)) / (std.unsqueeze(1) + eps)
    normalized = normalized.masked_fill(~(completion_mask.to(torch.bool) & in_group.unsqueeze(1)), 0.0)
    return normalized.to(_work_dtype(advantages))


def normalize_per_group(
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    group_ids: torch.Tensor,
    eps: float = 1e-6,
    statistics_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-group token normalization (docs/oppo.md#group-normalization) when all rows of every group are at hand; ``group_ids`` (B,)
    labels each row's group (any layout: groups need not be contiguous nor equal in size; a negative id, ``NO_GROUP``:
    in none, advantage 0). ``statistics_mask`` (B, T): the tokens each group's mean and std are taken over, when
    not all of ``completion_mask``'s (the trained tokens: SRPO's suffix rows train only their suffix)."""
    moments_mask = completion_mask if statistics_mask is None else statistics_mask
    moments = group_moments(row_token_moments(advantages, moments_mask), group_ids)
    return normalize_with_group_moments(advantages, completion_mask, group_ids, moments, eps)


def evidence_ranking(
    evidence_totals: torch.Tensor, correct: torch.Tensor, credited: torch.Tensor, group_ids: torch.Tensor
) -> tuple[float, int]:
    """Does the oracle read the answer? (docs/oppo.md#metrics, ``oppo/evidence_auc``.) Over every pair (i, j) of
    credited rows of one group (the same prompt) with i correct and j not: the number of pairs whose totals
    Σ_t log λ_{i,t} > Σ_t log λ_{j,t}, plus half the ties, and the number of pairs. Their ratio is the AUC of the
    total evidence, 0.5 for a scorer whose evidence ignores the answer.

    Why the total: by Bayes, log π̂(y | x, y*) − log π̂(y | x) = log P(y* | x, y) − log P(y* | x), so an oracle that
    reads y* gives a completion that reaches it the larger total (the recursion's last log-odds ℓ_{T+1} − ℓ_0, and
    ℓ_0 is the group's). ``evidence_totals`` (N,): the evidence as the recursion used it (clipped), summed over the
    tokens that carry it; ``correct``, ``credited`` (N,) bool; ``group_ids`` (N,) long, negative for a row in none."""
    group_ids = group_ids.to(device=evidence_totals.device, dtype=torch.long)
    credited = credited.to(device=evidence_totals.device, dtype=torch.bool) & (group_ids >= 0)
    correct = correct.to(device=evidence_totals.device, dtype=torch.bool)
    right, wrong = credited & correct, credited & ~correct
    pairs = (group_ids.unsqueeze(1) == group_ids.unsqueeze(0)) & right.unsqueeze(1) & wrong.unsqueeze(0)
    difference = evidence_totals.unsqueeze(1) - evidence_totals.unsqueeze(0)  # row i (correct) minus row j
    wins = (difference > 0).to(torch.float64) + 0.5 * (difference == 0).to(torch.float64)
    return float((wins * pairs).sum()), int(pairs.sum())
