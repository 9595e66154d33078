"""What a method reports through TRL's logging: a metric next to GRPO's (:func:`log_metric`), a warning once when it
cannot do its job on some input (:func:`warn_once`, with a rate metric each step), groups with a ±inf reward
(:func:`nonfinite_reward_groups`, :func:`zero_nonfinite_groups`), and its own advantages in TRL's completions table
(:func:`replace_logged_advantages`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch

from trl_credit.core.setup import trainer_mode

__all__ = [
    "log_metric",
    "warn_once",
    "warned_keys",
    "warn_once_among",
    "nonfinite_reward_groups",
    "zero_nonfinite_groups",
    "replace_logged_advantages",
]


def log_metric(trainer, name: str, value: float) -> None:
    """Append a scalar to TRL's metric buffer; TRL averages the buffer over the logging window and sends it to
    every ``report_to`` backend next to ``reward``, ``kl``, ... Callers pass values already reduced over processes
    (as TRL does) so every rank logs the same number."""
    trainer._metrics[trainer_mode(trainer)][name].append(float(value))


def warn_once(trainer, key: str, message: str) -> None:
    """Warn (on the main process, once per trainer and ``key``) that a method could not do its job on some input.
    The caller also logs the matching rate metric every step, so the warning is never the only trace."""
    warn_once_among(warned_keys(trainer), key, message, trainer.accelerator.is_main_process, stacklevel=3)


def warned_keys(trainer) -> set:
    """The keys ``trainer`` has warned about (shared by :func:`warn_once` and its batches' contexts)."""
    return trainer.__dict__.setdefault("_trl_credit_warned", set())


def warn_once_among(seen: set, key: str, message: str, is_main_process: bool, stacklevel: int) -> None:
    """The rule of :func:`warn_once` over a set of keys already warned about: the first time ``key`` is seen, a
    ``UserWarning`` on the main process (``stacklevel`` as ``warnings.warn`` would take it in the caller)."""
    if key in seen:
        return
    seen.add(key)
    if is_main_process:
        warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)


def nonfinite_reward_groups(ctx, rewards_per_func: torch.Tensor, group_ids, metric: str, part=None) -> torch.Tensor:
    """(N,) bool: the rows (of the global ``rewards_per_func``) whose group (``group_ids``, one per row) holds a
    reward of ±inf from a reward function of non-zero weight.

    TRL 1.16 has no rule for them; its arithmetic decides. With ``sum_then_normalize`` the group's mean and std
    become non-finite, every advantage of the group NaN, and GRPOTrainer's ``nan_to_num(advantages, nan=0.0)`` sets
    them to 0: the group takes no step (``scale_rewards="batch"``: no group does, the batch std being inf;
    ``"none"``: the other rows get ±3.4e38 and the model turns NaN, which our trainers avoid by giving the group 0).
    With ``normalize_then_sum`` only that reward function drops out of the group. The caller applies this; here the
    reward function is named in a warning (once, speaking as ``ctx.speaker(part)``) and ``metric``, the share of
    groups with such a reward, is logged (``ctx``: the batch's :class:`~trl_credit.core.context.BatchContext`).
    """
    weights = ctx.reward_weights.to(rewards_per_func.device) != 0
    infinite = torch.isinf(rewards_per_func) & weights.unsqueeze(0)
    groups = torch.as_tensor(group_ids, device=rewards_per_func.device).flatten()
    _, owner = torch.unique(groups, return_inverse=True)
    counts = torch.zeros(int(owner.max()) + 1 if owner.numel() else 0, device=groups.device)
    bad_groups = counts.index_add_(0, owner, infinite.any(dim=1).float()) > 0
    ctx.metric(metric, bad_groups.float().mean().item() if bad_groups.numel() else 0.0)
    if bad_groups.any():
        names = [name for k, name in enumerate(ctx.reward_func_names) if infinite[:, k].any()]
        ctx.warn(
            "nonfinite_reward",
            f"{ctx.speaker(part)}: reward function(s) {', '.join(map(repr, names))} returned ±inf. As in TRL's "
            "GRPO, a group holding such a reward gets advantage 0 (with multi_objective_aggregation="
            f"'normalize_then_sum': that function counts 0 in the group). `{metric}` logs the share of such groups.",
        )
    return bad_groups[owner]


def zero_nonfinite_groups(ctx, advantages: torch.Tensor, rewards_per_func: torch.Tensor, metric: str, part=None):
    """TRL's advantages of every row or of this process's rows (TRL's layout: groups of ``num_generations``
    consecutive global rows), 0 on every row of a group with a ±inf reward under ``sum_then_normalize``
    (:func:`nonfinite_reward_groups`): what TRL gives them with its default scaling, also with
    ``scale_rewards="none"``, where TRL's own are ±3.4e38."""
    group_ids = torch.arange(rewards_per_func.size(0)) // ctx.group_size
    bad = nonfinite_reward_groups(ctx, rewards_per_func, group_ids, metric, part)
    if ctx.multi_objective_aggregation == "normalize_then_sum":
        return advantages  # TRL's are finite: the function only drops out of the group
    rows = bad if advantages.size(0) == bad.numel() else ctx.cut(bad, advantages.size(0))
    rows = rows.to(advantages.device)
    return advantages.masked_fill(rows.view(-1, *([1] * (advantages.dim() - 1))), 0.0)


def replace_logged_advantages(trainer, values: Sequence[float]) -> None:
    """TRL appends GRPO's advantages of every row of the generation batch (all processes, in process order) to its
    completions table (``trainer._logs["advantages"]``, shown with ``log_completions``); a method whose advantages
    differ writes its own over them: ``values``, one per global row. The table keeps at most
    ``generation_batch_size`` entries, so when ``values`` is longer (an evaluation batch) only its last entries,
    which are the table's last, are written."""
    logged = trainer._logs.get("advantages") if hasattr(trainer, "_logs") else None
    if logged is None:
        return
    count = min(len(logged), len(values))
    tail = list(values)[len(values) - count :]
    for i in range(count):
        logged[len(logged) - count + i] = tail[i]
