"""PRIME's prompt filter (Cui et al. 2025, Algorithm 1; docs/process.md#the-prompt-filter): pure functions, no trainer.

Algorithm 1 keeps a prompt for the update only when the accuracy of its K rollouts is strictly between two bounds
(0.2 and 0.8): a group that is all correct or all wrong (or nearly) carries no outcome contrast, and would feed the
PRM batches of one label. Both released codes (PRIME-RL/PRIME and verl's ``recipe/prime``,
``filter_and_downsample``) also drop a group with a truncated response (``filter_truncate: True``), and sample 4x the
prompts to refill the batch with groups that pass. TRL's generation batch holds a fixed set of prompts, so a
dropped group is not replaced here: its rows get advantage 0 and no PRM label (docs/process.md says what that costs).
"""

from __future__ import annotations

import torch

__all__ = ["kept_rows", "truncated_rows"]


def truncated_rows(last_tokens: list[int | None], eos_and_pad: list[int]) -> list[bool]:
    """TRL's truncation (``mask_truncated_completions``): a row whose last generated token (None: no token) is neither
    an EOS nor the padding id."""
    return [token is None or token not in eos_and_pad for token in last_tokens]


def kept_rows(group_ids: torch.Tensor, credited: torch.Tensor, success: torch.Tensor, truncated: torch.Tensor,
              lower: float, upper: float, drop_truncated: bool) -> tuple[torch.Tensor, int, int]:
    """Which credited rows the filter keeps, and how many groups it looked at and dropped.

    A group (its credited rows: scorable, in a group) passes when ``lower < accuracy < upper``, its accuracy the share
    of its credited rows the verifier accepts (``success``), and, with ``drop_truncated``, none of its rows (credited
    or not) is ``truncated``. Returns ``(kept, num_groups, num_dropped)``: ``kept`` (N,) bool, the credited rows of
    the groups that pass; ``num_groups`` the groups holding a credited row. All arguments (N,) over every row."""
    kept = torch.zeros_like(credited)
    num_groups = num_dropped = 0
    for group in torch.unique(group_ids[credited]).tolist():
        members = group_ids == group
        rows = credited & members
        accuracy = float(success[rows].double().mean())
        passes = lower < accuracy < upper and not (drop_truncated and bool(truncated[members].any()))
        num_groups += 1
        if passes:
            kept |= rows
        else:
            num_dropped += 1
    return kept, num_groups, num_dropped
