"""Collective calls across processes, and the two moves every trainer makes around them.

Each process holds its slice of TRL's global batch: rows of all processes in process order, the same number per
process (:func:`process_rows` / :func:`local_rows` cut a global tensor or list to a process's slice). A collective call (a gather,
a vLLM server-mode generation, a forward under ZeRO-3, TRL's ``_calculate_rewards``) needs the same number of
calls, and often the same row count, on every process: a process with fewer rows fills up with filler rows
(:func:`fill_rows`) whose results it drops.

- :func:`gather_rows` / :func:`gather_counts`: per-process Python lists and counts, in process order.
- :func:`rewards_of_extra_rows`: reward matrices of rows outside TRL's batch through TRL's own reward path.
- :func:`trl_global_advantages`: TRL's advantages of every process's rows restated from the global rewards, so no
  part gathers what TRL already cut to each process.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
import transformers
from accelerate.utils import gather_object
from packaging.version import Version
from trl import GRPOTrainer

from trl_credit.core.advantages import trl_advantages
from trl_credit.core.logs import warn_once
from trl_credit.core.setup import speaker, trainer_mode
from trl_credit.trl_bridge.compat import is_conversational, parse_response

__all__ = [
    "trl_global_advantages",
    "gather_counts",
    "gather_rows",
    "fill_rows",
    "process_rows",
    "local_rows",
    "decode_completions",
    "rewards_of_extra_rows",
]


def gather_counts(trainer, count: int) -> list[int]:
    """``count`` of every process, in process order (a collective call)."""
    device = trainer.accelerator.device
    counts = trainer.accelerator.gather(torch.tensor([int(count)], device=device))
    return [int(c) for c in counts.tolist()]


def gather_rows(trainer, rows: list) -> list:
    """Concatenate per-process Python lists in process order (a collective call; lists may differ in length)."""
    if trainer.accelerator.num_processes == 1:
        return list(rows)
    return gather_object(list(rows))


def fill_rows(rows: Sequence, size: int, filler) -> list:
    """``rows`` followed by copies of ``filler`` up to ``size`` rows: the row count a collective call needs on every
    process. The caller drops what the filler rows produce."""
    return list(rows) + [filler] * (size - len(rows))


def process_rows(process_index: int, num_local: int) -> slice:
    """Process ``process_index``'s rows of a global batch of ``num_local`` rows per process, in process order (TRL's
    ``process_slice``): the one place the cut is written (``RowBatch.local_rows``, ``BatchContext.cut`` and
    :func:`local_rows` all use it)."""
    start = process_index * num_local
    return slice(start, start + num_local)


def local_rows(trainer, num_local: int) -> slice:
    """This process's rows of TRL's global batch (``num_local`` rows per process, in process order: TRL's
    ``process_slice``), to cut a gathered tensor or list back to them."""
    return process_rows(trainer.accelerator.process_index, num_local)


def decode_completions(trainer, prompts: list, prompt_ids: Sequence, completion_ids: Sequence) -> list:
    """Completions in the form reward functions get them, decoded as ``GRPOTrainer._generate`` (trl 1.16.0) does
    for single-turn rollouts without tools: chat messages for conversational prompts, else plain strings."""
    completion_ids = [list(ids) for ids in completion_ids]
    if is_conversational({"prompt": prompts[0]}):
        tokenizer = trainer._tokenizer
        if Version(transformers.__version__) >= Version("5.0.0") and (
            getattr(tokenizer, "response_template", None) is not None
            or getattr(tokenizer, "response_schema", None) is not None
        ):
            return [
                [parse_response(tokenizer, ids, prefix=prefix, tools=None)]
                for ids, prefix in zip(completion_ids, prompt_ids)
            ]
        contents = trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        return [[{"role": "assistant", "content": content}] for content in contents]
    return trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)


def rewards_of_extra_rows(
    trainer,
    inputs: list,
    prompts: list,
    prompt_ids: Sequence,
    completion_ids: Sequence,
    filler: tuple,
    counts: list[int] | None = None,
    completions: list | None = None,
    environments: list | None = None,
) -> list[torch.Tensor]:
    """Reward matrices of rollouts outside TRL's batch (DATPO branches, SRPO seed candidates), through TRL's own
    ``_calculate_rewards``, so every reward function, its weights and its kwargs apply as for the batch.

    A collective call: ``_calculate_rewards`` ends with an ``accelerate.gather`` that needs the same row count on
    every process, so each process pads its rows to the largest count with ``filler`` = ``(input, prompt,
    prompt_ids, completion_ids)`` of one real row, and the padding is dropped. What reward functions log through
    ``log_extra``/``log_metric`` during the call is discarded: those rows are not the batch TRL's table describes.
    Multi-turn rows (TRL's tool loop) give their ``completions`` (the messages reward functions get) and, with an
    ``environment_factory``, their ``environments`` (TRL's ``environments`` for the call, as reward functions and an
    environment's ``get_reward`` read them); ``filler`` then ends with a real row's completion and environment.
    Returns the ``(rows of process q, num_reward_funcs)`` matrix of every process q, in process order.
    """
    counts = counts if counts is not None else gather_counts(trainer, len(completion_ids))
    most = max(counts)
    if most == 0:
        return [torch.zeros(0, len(trainer.reward_funcs), device=trainer.accelerator.device) for _ in counts]
    filler_input, filler_prompt, filler_prompt_ids, filler_completion_ids, *filler_turns = filler
    inputs = fill_rows(inputs, most, filler_input)
    prompts = fill_rows(prompts, most, filler_prompt)
    prompt_ids = fill_rows(prompt_ids, most, filler_prompt_ids)
    completion_ids = fill_rows([list(ids) for ids in completion_ids], most, list(filler_completion_ids))
    if completions is None:
        completions = decode_completions(trainer, prompts, prompt_ids, completion_ids)
    else:
        completions = fill_rows(list(completions), most, filler_turns[0])
    saved_environments = getattr(trainer, "environments", None)
    if environments is not None:
        trainer.environments = fill_rows(list(environments), most, filler_turns[1])
    saved = trainer._pending_extra_logs, trainer._pending_metrics
    trainer._pending_extra_logs, trainer._pending_metrics = defaultdict(list), defaultdict(list)
    try:
        # GRPOTrainer's own method: subclasses wrap it to capture the batch's rewards, which these rows are not.
        rewards_per_func = GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, completion_ids)
    finally:
        trainer._pending_extra_logs, trainer._pending_metrics = saved
        if environments is not None:
            trainer.environments = saved_environments
    return [rewards_per_func[q * most : q * most + count] for q, count in enumerate(counts)]


def trl_global_advantages(trainer, rewards_per_func, local):
    """TRL's advantages of every row of the generation batch, computed again from the global rewards as TRL computes
    them before it keeps its process's slice (``core.advantages.trl_advantages``: TRL's values bit for bit,
    tests/test_trl_contract_advantages.py), so no credit gathers what TRL already cut to each process. This process's
    rows are TRL's own values (``local``) whatever happens; a restatement that disagrees with them (a TRL outside the
    supported range) is warned about."""
    mode = trainer_mode(trainer)
    size = trainer.num_generations if mode == "train" else trainer.num_generations_eval
    values = trl_advantages(rewards_per_func, trainer.reward_weights, size, trainer.scale_rewards,
                            trainer.multi_objective_aggregation).to(local.dtype)
    rows = local_rows(trainer, local.size(0))
    if not torch.equal(values[rows], local):
        warn_once(trainer, "trl_advantages_restated",
                  f"{speaker(trainer)}: TRL's advantages differ from the core's restatement of TRL's formula "
                  "(trl_credit.core.advantages.trl_advantages), so this TRL computes them in another way than the "
                  "supported versions; other processes' rows may be off by round-off in what the parts read.")
    values[rows] = local
    return values
