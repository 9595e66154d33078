"""The per-row record of one generation batch that every part of a credit method reads (docs/design.md#the-credit-core).

TRL builds a generation batch as rows of every process in process order, the same number per process; each process
keeps its own slice. A :class:`RowBatch` describes every row of the *global* batch once: the reward matrix TRL
computed, which (sub-)group's statistics the row shares, what kind of row it is, whether the verifier calls it
correct and whether any reward function scored it. Rollouts build it (:func:`trl_groups` for GRPO's groups of
``num_generations`` consecutive rows; SRPO's resets and DATPO's trees their own), credits and modifiers read it, and
it alone does the three moves every method makes around TRL's batch: the cut of a global tensor to this process's
rows (:meth:`RowBatch.local_rows`), the group lists (:meth:`RowBatch.groups`) and the advantages TRL's completions
table shows (:meth:`RowBatch.log_advantages`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from trl_credit.success import unscorable_rows

__all__ = ["ROW_BASE", "ROW_SUFFIX", "ROW_FALLBACK", "ROW_BRANCH", "NO_GROUP", "RowBatch", "trl_groups"]

# Row kinds. A base row is an iid rollout of the prompt (GRPO's rows, DATPO's trunks, SRPO's base group); a suffix
# row continues a shared prefix (SRPO's reset groups); a fallback row fills a reset group that found no seed (zero
# advantage, no loss); a branch row is a subtree's completion from a fork point (DATPO).
ROW_BASE, ROW_SUFFIX, ROW_FALLBACK, ROW_BRANCH = 0, 1, 2, 3
NO_GROUP = -1  # group id of a row that shares no group's statistics (fallback rows)


@dataclasses.dataclass
class RowBatch:
    """Every row of one generation batch (all processes, TRL's global order)."""

    rewards_per_func: torch.Tensor
    """(N, F) what ``GRPOTrainer._calculate_rewards`` returned for the rows: one column per reward function, NaN where
    a function returned None."""
    group_ids: torch.Tensor
    """(N,) long (CPU): the group whose statistics the row shares (group-normalized outcome, OPPO's k / G and token
    moments, Cue-GRPO's clusters); :data:`NO_GROUP` for a row in none."""
    row_kinds: torch.Tensor
    """(N,) long (CPU): :data:`ROW_BASE`, :data:`ROW_SUFFIX`, :data:`ROW_FALLBACK` or :data:`ROW_BRANCH`."""
    success: torch.Tensor | None
    """(N,) bool (CPU): the verifier (``success_reward``) scored the row >= ``success_threshold``; None under a
    config without a verifier setting (a plain ``GRPOConfig``)."""
    scorable: torch.Tensor
    """(N,) bool (CPU): some reward function scored the row (not every one returned None)."""
    num_local: int
    """Rows this process holds: its slice is ``[process_index * num_local, (process_index + 1) * num_local)``."""
    process_index: int
    group_size: int | None = None
    """When the groups are TRL's own (``group_size`` consecutive rows each, the advantages TRL computed are the
    group-normalized outcome), that size; None for other groups (sub-groups, trees)."""
    prefix_lengths: torch.Tensor | None = None
    """(N,) long (CPU): leading completion tokens that are a shared prefix, masked out of the loss (SRPO's suffix
    rows); None when no row has one."""
    sequence_signs: torch.Tensor | None = None
    """(N,) (CPU): each row's sequence-level direction when the credit's advantages are per token (OPPO's anchor
    sign(A^seq)), for the modifiers that act per row (Cue-GRPO's positive set); set by such a credit."""
    sequence_anchors: torch.Tensor | None = None
    """(N,) (CPU): each row's sequence-level advantage for TRL's per-sequence decisions (``off_policy_mask_threshold``,
    VESPO) when the credit's advantages are per token (trl_credit/anchors.py); set by such a credit, written into
    TRL's batch by the core."""
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What a rollout hands its credit beyond the rows (DATPO's trees)."""
    table_advantages: list[float] | None = None
    """One value per row of TRL's completions table (each global row; DATPO: each base rollout) (``log_completions``), set by a part whose advantages
    differ from GRPO's (:meth:`log_advantages`); the core writes it into the table once, after every part ran.
    None: the table keeps TRL's."""

    @property
    def num_rows(self) -> int:
        return int(self.group_ids.numel())

    @property
    def local(self) -> slice:
        """This process's rows of the global batch (TRL's ``process_slice``)."""
        start = self.process_index * self.num_local
        return slice(start, start + self.num_local)

    def local_rows(self, values):
        """A global tensor (rows first) or list, cut to this process's rows."""
        return values[self.local]

    def groups(self) -> dict[int, list[int]]:
        """Group id -> its global rows, in row order (rows of :data:`NO_GROUP` left out)."""
        members: dict[int, list[int]] = {}
        for row, group in enumerate(self.group_ids.tolist()):
            if group != NO_GROUP:
                members.setdefault(group, []).append(row)
        return members

    def log_advantages(self, values: Sequence[float]) -> None:
        """``values`` (one per global row) replace GRPO's advantages in TRL's completions table (``log_completions``).
        A later part's values replace an earlier one's; the core writes the last into the table once."""
        self.table_advantages = [float(v) for v in values]


def trl_groups(ctx, rewards_per_func: torch.Tensor, num_local: int) -> RowBatch:
    """The record of a batch TRL generated itself: groups of ``ctx.group_size`` (TRL's ``num_generations``, or
    ``num_generations_eval`` in evaluation) consecutive global rows, every row a base row. ``ctx``: the batch's
    :class:`~trl_credit.context.BatchContext`."""
    from trl_credit.success import success_rows

    size = ctx.group_size
    num_rows = rewards_per_func.size(0)
    if num_rows % size:
        raise RuntimeError(f"{ctx.speaker()}: {num_rows} rows do not form groups of {size}.")
    success = (None if ctx.success_index is None
               else success_rows(rewards_per_func, ctx.success_index, ctx.args.success_threshold).cpu())
    return RowBatch(
        rewards_per_func=rewards_per_func,
        group_ids=torch.arange(num_rows) // size,
        row_kinds=torch.full((num_rows,), ROW_BASE, dtype=torch.long),
        success=success,
        scorable=(~unscorable_rows(rewards_per_func)).cpu(),
        num_local=num_local,
        process_index=ctx.process_index,
        group_size=size,
    )
