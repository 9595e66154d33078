"""The per-row record of one generation batch that every part of a credit method reads (docs/design.md#the-credit-core).

TRL builds a generation batch as rows of every process in process order, the same number per process; each process
keeps its own slice. A :class:`RowBatch` describes every row of the *global* batch once: the reward matrix TRL
computed, which (sub-)group's statistics the row shares, what kind of row it is, whether the verifier calls it
correct and whether any reward function scored it; for this process's rows, what parts read beside the rewards
(the prompts, the completion texts, the token ids and masks, the loss mask). Rollouts build it (:func:`trl_groups` for GRPO's groups of
``num_generations`` consecutive rows; SRPO's resets and DATPO's trees their own), the core fills what the rollout
left unset from TRL's batch once (``core.fill_record``), credits and modifiers read it, and it alone does the moves
every method makes around TRL's batch: the cut of a global tensor to this process's rows
(:meth:`RowBatch.local_rows`), the group lists (:meth:`RowBatch.groups`) and the advantages TRL's completions table
shows (:meth:`RowBatch.log_advantages`). What one rollout hands its own credit beyond the rows travels as a typed
payload (:meth:`RowBatch.attach` / :meth:`RowBatch.payload`), one dataclass per kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

import torch

from trl_credit.core.collectives import process_rows
from trl_credit.core.steps import is_multi_turn, model_turns_text
from trl_credit.core.success import unscorable_rows
from trl_credit.tasks.rewards import completion_text

__all__ = [
    "ROW_BASE", "ROW_SUFFIX", "ROW_FALLBACK", "ROW_BRANCH", "NO_GROUP", "RowBatch", "Outcomes", "MissingPayload",
    "trl_groups", "generated_lengths", "fill_record", "model_texts",
]

# Row kinds. A base row is an iid rollout of the prompt (GRPO's rows, DATPO's trunks, SRPO's base group); a suffix
# row continues a shared prefix (SRPO's reset groups); a fallback row fills a reset group that found no seed (zero
# advantage, no loss); a branch row is a subtree's completion from a fork point (DATPO).
ROW_BASE, ROW_SUFFIX, ROW_FALLBACK, ROW_BRANCH = 0, 1, 2, 3
NO_GROUP = -1  # group id of a row that shares no group's statistics (fallback rows)

P = TypeVar("P")


class MissingPayload(LookupError):
    """A part asked the record for a payload type no rollout attached (:meth:`RowBatch.payload`)."""


@dataclasses.dataclass
class Outcomes:
    """The outcomes a credit aggregates, for a rollout whose credit values outcomes rather than rows (DATPO's trees:
    the leaves, whose rewards the block Monte Carlo values average). The rollout builds them
    (``Rollout.leaf_outcomes``) when a modifier acts at the outcome stage; the core hands them to every such
    modifier (``Modifier.outcomes``) and keeps the result in the record (``RowBatch.outcomes``) for the credit. Global
    (the same on every process) except ``local_texts``."""

    groups: dict[int, list[int]]
    """Group (the prompt's tree) -> its outcomes, in order."""
    rewards: torch.Tensor
    """(L,) float64: each outcome's reward as the credit uses it (NaN: unscorable); a modifier returns new ones."""
    correct: torch.Tensor
    """(L,) bool: the verifier (``success_reward`` >= ``success_threshold``) calls the outcome correct."""
    in_loss: torch.Tensor
    """(L,) bool: the outcome's own last tokens reach the loss (not truncated and masked)."""
    local_texts: dict[int, tuple[str, object]]
    """This process's outcomes: (the full completion text, the dataset prompt)."""
    rows: list
    """(L,): the id of the generated sequence (training row) each outcome ends."""
    unit_rows: list
    """One per unit of the credit's advantages (DATPO: per block): the id of the sequence it belongs to, so a
    modifier can scale the units of an outcome's row (Cue-GRPO's ``cue_tree_credit="rows"``)."""


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
    VESPO) when the credit's advantages are per token (trl_credit/core/anchors.py); set by such a credit, written into
    TRL's batch by the core."""
    prompts: list | None = None
    """This process's rows: the prompt each completion was generated from (a rollout that rewrites TRL's prompts, as
    SRPO's rollout template does, sets its own; the core fills the dataset's ``inputs[i]["prompt"]`` otherwise). Local
    rows, like the texts: the core would otherwise gather every prompt and text every step although most steps need
    none of them; a part that needs another process's rows gathers those (Cue-GRPO gathers P's texts)."""
    completions: list[str] | None = None
    """This process's rows: the model's text of each completion as TRL decoded it (``rewards.completion_text`` of a
    conversational completion: its assistant turns; a plain-text completion without its environment tokens:
    :func:`model_texts`), filled by the core from TRL's ``_generate``; None when TRL's ``_generate`` was not captured."""
    loss_mask: torch.Tensor | None = None
    """(B, T) this process's rows: the tokens TRL's loss trains, TRL's ``completion_mask`` after the rollout's prefix
    masking (``tool_mask``: SRPO's shared prefixes, fallback rows); filled by the core from TRL's batch."""
    model_mask: torch.Tensor | None = None
    """(B, T) this process's rows: 0 on a tool result or environment token (not the model's action: TRL's ``tool_mask``
    of its tool loop, or the ``env_mask`` of a user's ``rollout_func``), 1 elsewhere, padding included (combine with
    ``completion_mask``). Such tokens get no advantage and enter no statistic (docs/multiturn.md). Filled by the core
    from TRL's batch; a rollout whose ``env_mask`` masks its own model tokens (SRPO's shared prefixes) sets it to 1."""
    prompt_ids: torch.Tensor | None = None
    """(B, P) this process's rows: the prompt's token ids, left-padded, as TRL tokenized it (TRL's ``prompt_ids``);
    filled by the core from TRL's batch, as are ``prompt_mask``, ``completion_ids`` and ``completion_mask``."""
    prompt_mask: torch.Tensor | None = None
    """(B, P) this process's rows: 1 on the prompt's tokens, 0 on its left padding (TRL's ``prompt_mask``)."""
    completion_ids: torch.Tensor | None = None
    """(B, T) this process's rows: the completion's token ids, right-padded (TRL's ``completion_ids``)."""
    completion_mask: torch.Tensor | None = None
    """(B, T) this process's rows: 1 on the completion's tokens up to its EOS (TRL's ``completion_mask``), the whole
    completion including a shared prefix (``loss_mask`` is what the loss trains)."""
    block_ids: list | None = None
    """Per training row of this process, each token's block (the credit heatmap draws its boundaries: DATPO's forks);
    None: one block per row."""
    outcomes: Outcomes | None = None
    """The outcomes after the outcome-stage modifiers (:class:`Outcomes`), for the credit; None when no modifier acts
    on outcomes or the rollout declares none."""
    payloads: dict[type, Any] = dataclasses.field(default_factory=dict, repr=False)
    """Typed payloads a rollout hands its credit beyond the rows (:meth:`attach`): payload type -> the payload."""
    table_advantages: list[float] | None = None
    """One value per row of TRL's completions table (each global row; DATPO: each base rollout) (``log_completions``), set by a part whose advantages
    differ from GRPO's (:meth:`log_advantages`); the core writes it into the table once, after every part ran.
    None: the table keeps TRL's."""

    @property
    def num_rows(self) -> int:
        return int(self.group_ids.numel())

    @property
    def local(self) -> slice:
        """This process's rows of the global batch (TRL's ``process_slice``: ``collectives.process_rows``)."""
        return process_rows(self.process_index, self.num_local)

    def local_rows(self, values):
        """A global tensor (rows first) or list, cut to this process's rows."""
        return values[self.local]

    def is_global(self, values) -> bool:
        """``values`` (rows first) hold every row of the record, not only this process's. With one process both are
        the same rows, and the answer does not matter."""
        return len(values) == self.num_rows

    def groups(self) -> dict[int, list[int]]:
        """Group id -> its global rows, in row order (rows of :data:`NO_GROUP` left out)."""
        members: dict[int, list[int]] = {}
        for row, group in enumerate(self.group_ids.tolist()):
            if group != NO_GROUP:
                members.setdefault(group, []).append(row)
        return members

    def attach(self, payload: Any) -> None:
        """Hand ``payload`` (a dataclass instance: DATPO's ``TreeBatch``, SRPO's ``ResetRows``) to the parts that read
        it by its type (:meth:`payload`). One payload per type."""
        if isinstance(payload, type) or not dataclasses.is_dataclass(payload):
            raise TypeError(f"RowBatch.attach: payload must be a dataclass instance, got {type(payload).__name__}")
        if type(payload) in self.payloads:
            raise ValueError(f"RowBatch.attach: a {type(payload).__name__} payload is already attached")
        self.payloads[type(payload)] = payload

    def payload(self, kind: type[P]) -> P:
        """The payload of type ``kind`` a rollout attached; :class:`MissingPayload` naming the type when none was."""
        try:
            return self.payloads[kind]
        except KeyError:
            attached = ", ".join(sorted(t.__name__ for t in self.payloads)) or "none"
            raise MissingPayload(
                f"The batch record has no {getattr(kind, '__name__', kind)} payload (attached: {attached}): the "
                "part reading it needs the rollout that attaches it."
            ) from None

    def has_payload(self, kind: type) -> bool:
        return kind in self.payloads

    def log_advantages(self, values: Sequence[float]) -> None:
        """``values`` (one per global row) replace GRPO's advantages in TRL's completions table (``log_completions``).
        A later part's values replace an earlier one's; the core writes the last into the table once."""
        self.table_advantages = [float(v) for v in values]


def trl_groups(ctx, rewards_per_func: torch.Tensor, num_local: int) -> RowBatch:
    """The record of a batch TRL generated itself: groups of ``ctx.group_size`` (TRL's ``num_generations``, or
    ``num_generations_eval`` in evaluation) consecutive global rows, every row a base row. ``ctx``: the batch's
    :class:`~trl_credit.core.context.BatchContext`."""
    from trl_credit.core.success import success_rows

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


def generated_lengths(completion_ids: torch.Tensor, completion_mask: torch.Tensor, pad_token_id: int) -> list[int]:
    """Each row's number of generated tokens (up to and including its EOS), truncated rows included. TRL's
    ``completion_mask`` covers them, except that ``mask_truncated_completions`` zeroes a truncated row's (one whose
    last token is neither EOS nor padding): such a row's tokens then run up to its last non-padding token."""
    lengths = completion_mask.sum(dim=1).tolist()
    for i, length in enumerate(lengths):
        if length == 0:
            real = (completion_ids[i] != pad_token_id).nonzero()
            lengths[i] = int(real[-1]) + 1 if real.numel() else 0
    return [int(length) for length in lengths]


def fill_record(batch: RowBatch, inputs, output: dict, capture, tokenizer=None) -> None:
    """What parts read of this process's rows, taken from TRL's batch once, where the rollout left it unset: the
    prompts (those TRL generated from: the dataset's, with an environment's ``reset()`` observation), the model's
    texts (TRL's ``_generate``'s, as its reward functions saw them, but the model's turns only: :func:`model_texts`), the
    token ids and masks (TRL's ``prompt_ids``, ``prompt_mask``, ``completion_ids``, ``completion_mask``: the tensors
    themselves, not copies) and the loss mask (TRL's ``completion_mask`` times its ``tool_mask``, the rollout's
    prefix masking), and the model mask (TRL's ``tool_mask``: 0 on tool results and environment tokens)."""
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        if getattr(batch, name) is None:
            setattr(batch, name, output[name])
    if batch.prompts is None:
        # what TRL generated from: with an environment_factory the last message carries the reset() observation
        generated = capture.generated_prompts
        batch.prompts = list(generated) if generated is not None and len(generated) == len(inputs) else [
            x["prompt"] for x in inputs]
    if batch.loss_mask is None:
        mask = output["completion_mask"]
        batch.loss_mask = mask * output["tool_mask"] if "tool_mask" in output else mask
    if batch.model_mask is None:
        # TRL's tool_mask: 0 on the tool results of its tool loop, or on a user's rollout_func's env_mask tokens
        tool_mask = output.get("tool_mask")
        batch.model_mask = torch.ones_like(output["completion_mask"]) if tool_mask is None else tool_mask
    if batch.completions is None and capture.generated is not None:
        # TRL's _generate returns (prompt_ids, completion_ids, tool_mask, completions, ...) (trl 1.14-1.16)
        batch.completions = [completion_text(c) for c in capture.generated[3]]
        if tokenizer is not None:
            batch.completions = model_texts(batch, capture.generated[3], tokenizer)


def model_texts(batch: RowBatch, completions: list, tokenizer) -> list[str]:
    """The model's text of each completion (``RowBatch.completions``). A chat completion's text is its assistant turns
    already (``completion_text``: TRL's tool messages are not the model's); a plain-text completion holding environment
    tokens (a ``rollout_func``'s ``env_mask``) is decoded from its model turns only, joined by newlines."""
    texts = list(batch.completions)
    mask = batch.model_mask * batch.completion_mask
    for row, completion in enumerate(completions):
        if isinstance(completion, str) and is_multi_turn(mask[row, : int(batch.completion_mask[row].sum())].tolist()):
            texts[row] = model_turns_text(tokenizer, batch.completion_ids[row].tolist(), mask[row].tolist())
    return texts
