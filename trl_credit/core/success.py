"""What "correct" and "unscorable" mean, once for all four trainers (see ``docs/design.md``, "Success").

The papers assume one 0/1 verifier. Real GRPO scripts pass several reward functions, e.g.
``reward_funcs=[accuracy_reward, format_reward]``, and TRL sums them (weighted) into one reward. A wrong but
well-formatted answer then scores 1.0, so "reward >= 1" no longer means "solved". Every method decision that needs
correct/incorrect (SRPO seeds and pass rates, DATPO's pass rate and budget V_root, OPPO's k, Cue-GRPO's positive set)
therefore reads *one* reward function, the verifier:

    correct_i  <=>  rewards_per_func[i, success_index] >= success_threshold

``success_index`` comes from the config's ``success_reward`` (a reward function's name or index; ``None`` = the
first reward function, as open-r1 and TRL's examples put accuracy first). Values, advantages and the loss keep TRL's
weighted total reward, so the other reward functions still shape learning.

A row is *unscorable* when every reward function returned ``None`` (TRL stores NaN). TRL gives it advantage 0 and
leaves it out of the group baseline; our trainers do the same in every statistic (means, stds, k, V, cluster sizes).
An unscorable row is neither correct nor incorrect; a row whose verifier alone returned ``None`` is not correct.

Pure functions over tensors and lists; the trainer glue (resolving the index at construction) is
:func:`trl_credit.core.setup.bind_success`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = [
    "SuccessArguments",
    "resolve_success_index",
    "unscorable_rows",
    "total_rewards",
    "success_rows",
    "groups_with_reward_variance",
]

SUCCESS_REWARD_HELP = (
    "Which reward function decides whether a rollout is correct (the verifier): its name (as TRL logs it under "
    "`rewards/<name>/mean`) or its index in `reward_funcs`. None = the first reward function. A rollout is correct "
    "when that function's raw reward is >= `success_threshold`. Only the method's correct/incorrect decisions use it; "
    "values, advantages and the loss keep TRL's weighted sum of all reward functions."
)
SUCCESS_THRESHOLD_HELP = (
    "A rollout is correct when the raw reward of the `success_reward` function is >= this value (1.0 for a 0/1 "
    "verifier)."
)


@dataclass
class SuccessArguments:
    """The two config fields every method config shares (mixed into each ``GRPOConfig`` subclass)."""

    # `int | str` in this order: HfArgumentParser takes the second type of an Optional union, so the CLI passes str
    # (an index given as digits is turned into an int in validation).
    success_reward: int | str | None = field(default=None, metadata={"help": SUCCESS_REWARD_HELP})
    success_threshold: float = field(default=1.0, metadata={"help": SUCCESS_THRESHOLD_HELP})

    def _validate_success_arguments(self) -> None:
        value = self.success_reward
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = self.success_reward = int(value)  # from the command line an index arrives as a string
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int))):
            raise ValueError(
                f"`success_reward` must be a reward function's name (str), its index in `reward_funcs` (int) or None "
                f"(the first reward function), got {value!r} ({type(value).__name__})."
            )
        if isinstance(value, int) and value < 0:
            raise ValueError(f"`success_reward` as an index must be >= 0, got {value}.")
        if isinstance(value, str) and not value:
            raise ValueError("`success_reward` must be a non-empty reward function name, an index or None.")
        threshold = self.success_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ValueError(f"`success_threshold` must be a finite number, got {threshold!r}.")
        self.success_threshold = float(threshold)


def resolve_success_index(success_reward: str | int | None, reward_func_names: Sequence[str]) -> int:
    """Column of ``rewards_per_func`` that decides success. Raises ``ValueError`` naming the accepted values."""
    names = list(reward_func_names)
    if not names:
        raise ValueError("`success_reward`: there are no reward functions to decide success with.")
    if success_reward is None:
        return 0
    if isinstance(success_reward, int) and not isinstance(success_reward, bool):
        if 0 <= success_reward < len(names):
            return success_reward
        raise ValueError(
            f"`success_reward={success_reward}` is not an index of `reward_funcs` (0..{len(names) - 1}: {names})."
        )
    matches = [i for i, name in enumerate(names) if name == success_reward]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise ValueError(
            f"`success_reward={success_reward!r}` names {len(matches)} reward functions ({names}); pass its index "
            f"({matches}) instead."
        )
    raise ValueError(f"`success_reward={success_reward!r}` is not the name of a reward function; accepted: {names} or "
                     f"an index 0..{len(names) - 1}, or None for the first.")


def unscorable_rows(rewards_per_func: torch.Tensor) -> torch.Tensor:
    """(N,) bool: every reward function returned None (NaN) for the row."""
    return torch.isnan(rewards_per_func).all(dim=1)


def total_rewards(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """TRL's scalar reward (weighted ``nansum`` over reward functions), NaN for unscorable rows."""
    weights = reward_weights.to(device=rewards_per_func.device, dtype=rewards_per_func.dtype).unsqueeze(0)
    rewards = (rewards_per_func * weights).nansum(dim=1)
    rewards[unscorable_rows(rewards_per_func)] = torch.nan
    return rewards


def success_rows(rewards_per_func: torch.Tensor, success_index: int, success_threshold: float) -> torch.Tensor:
    """(N,) bool: the verifier's raw reward is >= the threshold (NaN, i.e. None, is never a success)."""
    verifier = rewards_per_func[:, success_index]
    return ~torch.isnan(verifier) & (verifier >= success_threshold)


def groups_with_reward_variance(
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    group_size: int,
    aggregation: str = "sum_then_normalize",
) -> torch.Tensor:
    """(num_groups,) bool: groups whose TRL advantages carry a signal, i.e. at least two scorable rows and rewards
    that differ. With ``aggregation="sum_then_normalize"`` the weighted total must vary (TRL's zero-std test); with
    ``"normalize_then_sum"`` (each reward function z-scored per group, then summed) some reward function must vary,
    otherwise TRL's advantage of the group is round-off around the batch mean. Unscorable rows are left out."""
    grouped = rewards_per_func.view(-1, group_size, rewards_per_func.size(1))
    scorable = ~torch.isnan(grouped).all(dim=2)
    if aggregation == "sum_then_normalize":
        values = total_rewards(rewards_per_func, reward_weights).view(-1, group_size, 1)
    elif aggregation == "normalize_then_sum":
        values = grouped
    else:
        raise ValueError(f"Unknown multi_objective_aggregation {aggregation!r}.")
    valid = ~torch.isnan(values)
    count = valid.sum(dim=1).clamp(min=1)
    mean = torch.where(valid, values, torch.zeros_like(values)).sum(dim=1, keepdim=True) / count.unsqueeze(1)
    squares = torch.where(valid, (values - mean) ** 2, torch.zeros_like(values)).sum(dim=1)
    std = (squares / (count - 1).clamp(min=1)).sqrt()  # (num_groups, columns); 0 for a column with < 2 values
    varies = ~torch.isclose(std, torch.zeros_like(std))
    return (scorable.sum(dim=1) >= 2) & varies.any(dim=1)
