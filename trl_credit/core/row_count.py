"""A generation batch whose training rows a rollout builds itself (``Rollout.builds_rows``: DATPO's trees, a row per
base rollout and per branch), so its row count is not the one TRL expects: how the core splits it into micro-batches
without dropping a row, and how it weighs every row the same in the loss (docs/design.md#the-credit-core).

The rollout marks its training batch with :data:`NUM_ROWS` (the real rows of the generation batch on all processes;
rows added only to even out the row count across processes are not counted and are outside the loss mask), and
keeps the row count equal on every process (TRL's loss gathers per-row tensors). The rest is here and in the core:
:func:`micro_batch` replaces TRL's split, :func:`renormalized_loss` TRL's per-micro-batch averaging.
"""

from __future__ import annotations

import torch

from trl_credit.trl_bridge import privates as bridge
from trl_credit.trl_bridge.compat import shuffle_sequence_dict

__all__ = ["NUM_ROWS", "split_rows", "micro_batch", "renormalized_loss"]

NUM_ROWS = "credit_num_rows"
"""Key of a training batch of rows a rollout built: the real rows of the generation batch on all processes."""

# Loss types whose TRL loss is a mean over the rows of the micro-batch (dr_grpo: over rows × max_completion_length).
_ROW_AVERAGED_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")
_PROMPT_KEYS = ("prompt_ids", "prompt_mask")


def split_rows(batch: dict, num_chunks: int, pad_to_multiple_of: int | None = None) -> list[dict]:
    """Split a batch of B rows into ``num_chunks`` micro-batches of ⌊B/n⌋ or ⌈B/n⌉ rows, dropping none, and trim
    each to its own longest prompt and completion (prompts are left-padded, completions right-padded), keeping
    widths multiples of ``pad_to_multiple_of`` when it is set. Trimmed with the completion: every other 2-D tensor
    as wide as the completion (advantages, log-probs, per-token ratios)."""

    def round_up(cols: int, limit: int) -> int:
        if not pad_to_multiple_of:
            return cols
        return min(limit, -(-cols // pad_to_multiple_of) * pad_to_multiple_of)

    num_rows = batch["completion_ids"].size(0)
    if num_rows < num_chunks:
        raise ValueError(f"{num_rows} rows cannot fill {num_chunks} micro-batches (steps_per_generation)")
    sizes = [num_rows // num_chunks + (1 if c < num_rows % num_chunks else 0) for c in range(num_chunks)]
    chunks, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        start += size
        chunk = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                chunk[key] = value[rows]
            elif isinstance(value, list):
                chunk[key] = value[rows]
            else:
                chunk[key] = value
        prompt_cols = int(chunk["prompt_mask"].sum(dim=0).nonzero().min()) if chunk["prompt_mask"].any() else 0
        used = (chunk["completion_mask"].sum(dim=0) > 0).nonzero()
        completion_cols = int(used.max()) + 1 if used.numel() else 1
        width = chunk["completion_ids"].size(1)
        prompt_width = chunk["prompt_ids"].size(1)
        prompt_cols = prompt_width - round_up(prompt_width - prompt_cols, prompt_width)
        completion_cols = round_up(completion_cols, width)
        for key in _PROMPT_KEYS:
            chunk[key] = chunk[key][:, prompt_cols:]
        for key, value in chunk.items():
            per_token = isinstance(value, torch.Tensor) and value.dim() == 2 and value.size(1) == width
            if per_token and key not in _PROMPT_KEYS:
                chunk[key] = value[:, :completion_cols]
        chunks.append(chunk)
    return chunks


def micro_batch(trainer, generation_batch) -> dict:
    """TRL's ``_prepare_inputs`` in training (trl 1.16.0), with the split replaced by :func:`split_rows`: a new
    generation batch every ``steps_per_generation * num_iterations`` optimizer steps, shuffled, then this step's
    micro-batch."""
    steps = trainer.args.steps_per_generation
    step = bridge.optimizer_step(trainer)
    if step % (steps * trainer.num_iterations) == 0 or bridge.buffered_inputs(trainer) is None:
        batch = shuffle_sequence_dict(bridge.generate_and_score(trainer, generation_batch))
        bridge.set_buffered_inputs(trainer, split_rows(batch, steps, trainer.pad_to_multiple_of))
    return bridge.buffered_inputs(trainer)[bridge.optimizer_step(trainer) % steps]


def renormalized_loss(trainer, loss, inputs: dict):
    """TRL's loss of a micro-batch of built rows, renormalized to the whole generation batch. TRL's row-averaging
    loss types divide by the rows (bnpo: the tokens) of the micro-batch; these micro-batches differ in size and hold
    empty filler rows (row counts are evened out across processes), so that would weight a row by the size of the
    micro-batch it landed in. As dapo's ``num_items_in_batch`` does, every row (token, for bnpo) then weighs the same
    whatever the split, the number of processes or the fillers, and equal micro-batches give TRL's value."""
    per_generation = trainer.accelerator.num_processes * trainer.args.steps_per_generation
    if trainer.loss_type in _ROW_AVERAGED_LOSSES:
        rows = inputs["completion_ids"].size(0)
        loss = loss * (rows * per_generation / inputs[NUM_ROWS].clamp(min=1))
    elif trainer.loss_type == "bnpo":
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:  # multi-turn rows: TRL's bnpo averages over completion_mask * tool_mask
            mask = mask * inputs["tool_mask"]
        tokens = mask.sum().clamp(min=1)
        loss = loss * (tokens * per_generation / inputs["num_items_in_batch"].clamp(min=1))
    return loss
