"""Group-relative advantages over SRPO's sub-groups (docs/srpo.md#advantages, paper §4.3).

A prompt's buffer holds a base group (``base`` iid rollouts from the question) and ``reset_groups`` shared-prefix
groups (``suffixes_per_reset`` suffixes each, resampled from one reset state). Advantages are normalized within
each of these groups separately, never across them (:class:`trl_credit.core.trainer.GroupOutcome` over the group ids of
:func:`srpo_group_ids`). Only torch/stdlib.

The group-normalized advantages themselves are generic (:mod:`trl_credit.core.advantages`; re-exported here):
``grouped_advantages`` ("sum_then_normalize") and ``normalize_then_sum_advantages`` ("normalize_then_sum", GDPO).
"""

from __future__ import annotations

from trl_credit.core.advantages import grouped_advantages, normalize_then_sum_advantages

__all__ = ["srpo_group_ids", "grouped_advantages", "normalize_then_sum_advantages"]


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
