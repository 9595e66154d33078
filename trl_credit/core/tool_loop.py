"""Multi-turn rollouts a part generates itself (docs/multiturn.md#srpo--rrpo-resets): TRL's tool loop
resumed from a prefix of a recorded rollout, and an environment's state rebuilt at that prefix by replay.

- :class:`Episode`: a multi-turn completion as TRL's tool loop leaves it: token ids, the model mask (1 on the model's
  tokens, 0 on tool results: TRL's ``tool_mask``), the messages TRL parsed (what reward functions get as the
  completion) and the sampling log-probs (vLLM; 0.0 on tool results, as TRL writes them).
- :func:`continue_tool_loop`: the model's continuation of a prefix, then TRL's own ``GRPOTrainer._tool_call_loop``
  from there (a tool call in the continued turn is executed, its result appended, the model generates again, ...):
  no second tool loop. TRL's loop takes a batch of rows, each with its first turn generated; a resumed row is handed
  to it as the prompt's messages plus the prefix's whole messages, the completion so far (prefix + continuation) and
  the continued turn parsed as TRL parses a turn. Its per-row tool dicts, environment names and round budget are set
  for the call and restored after it.
- :func:`lockstep_generation`: with several processes, the resumed loop's calls in lockstep across them
  (:class:`Lockstep`), collective as every extra generation call of the core: TRL's loop makes one call per round for
  the rows that called a tool, which differ between processes (ZeRO-3 / FSDP, vLLM server mode and tensor parallelism
  need every process to make the same calls with as many rows).
- :func:`replay_environment`: an environment's state at a prefix: ``reset()`` with the row's columns, then the
  prefix's tool calls in order, dispatched as TRL's loop dispatches them; True when every result renders as the
  recorded tool message did (a non-deterministic environment gives False: the caller skips the prefix).
- :func:`fresh_environments`: an instance per extra rollout (a rollout outside TRL's batch: SRPO's seed candidates),
  reset with its row's columns, from a pool of the core's own (TRL's pool holds the batch's rows' instances).

Only TRL 1.16's tool loop exists (trl 1.14.2 and 1.15 have the same ``_tool_call_loop``); every private it reads is
registered in :mod:`trl_credit.trl_bridge.compat`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import inspect
from collections import defaultdict

from trl import GRPOTrainer

from trl_credit.core.collectives import fill_rows, gather_counts
from trl_credit.trl_bridge.compat import parse_response

__all__ = ["Episode", "Resume", "BuiltRows", "tool_call_counts", "continue_tool_loop", "collective_generation",
           "Lockstep", "lockstep_generation", "replay_environment",
           "fresh_environments", "tool_rounds", "turn_of", "tool_dicts", "reset_kwargs"]


@dataclasses.dataclass
class Episode:
    """One multi-turn completion (after the prompt)."""

    ids: list[int]
    model_mask: list[int]
    """1 on the model's tokens, 0 on tool results (TRL's ``tool_mask``)."""
    messages: list[dict]
    """The assistant and tool messages, in order, as TRL's loop builds them (one assistant message per model turn)."""
    logprobs: list[float] | None = None

    def prefix(self, keep: int) -> tuple[Episode, int]:
        """The first ``keep`` tokens as a prefix to resume from, and where its last model turn starts in it (``keep``
        when the next token starts a new turn). The prefix's messages are those of the turns before that turn and
        their tool results: the turn being continued is parsed again once continued."""
        turn, turn_start = turn_of(self.model_mask, keep)
        assistants = [i for i, message in enumerate(self.messages) if message.get("role") == "assistant"]
        cut = assistants[turn] if turn < len(assistants) else len(self.messages)
        logprobs = None if self.logprobs is None else list(self.logprobs[:keep])
        return Episode(list(self.ids[:keep]), list(self.model_mask[:keep]), copy.deepcopy(self.messages[:cut]),
                       logprobs), turn_start


#: How TRL's loop writes a failed call's result (``str({"error": ...})``): counted as a failure.
_ERROR_PREFIX = "{'error': "


def tool_call_counts(messages: list[dict]) -> tuple[int, int]:
    """``(calls, failures)`` of a completion as TRL's ``tools/call_frequency`` and ``tools/failure_frequency`` count
    them: a tool message per executed call (TRL also counts a call whose result it rolled back as overlong), a
    failure where TRL's loop wrote the call's error as its result."""
    results = [m for m in messages if m.get("role") == "tool"]
    failures = sum(isinstance(m.get("content"), str) and m["content"].startswith(_ERROR_PREFIX) for m in results)
    return len(results), int(failures)


@dataclasses.dataclass
class BuiltRows:
    """A rollout's finished multi-turn training rows (``rollout_rows``'s ``tool_loop``), as TRL's
    ``_tool_call_loop`` returns rows: TRL's ``tool_mask`` of each row (1 where it trains: the model's tokens, less a
    reset row's prefix), the completions (messages) reward functions get, and the calls and failures in them."""

    tool_mask: list[list[int]]
    completions: list[list[dict]]

    def as_tool_loop_result(self, completion_ids, logprobs) -> tuple:
        """What ``GRPOTrainer._tool_call_loop`` returns (trl 1.16): ``(tool_mask, completions, completion_ids,
        logprobs, tool_call_count, tool_failure_count, tool_images)``."""
        counts = [tool_call_counts(messages) for messages in self.completions]
        return (self.tool_mask, self.completions, completion_ids, logprobs, sum(c for c, _ in counts),
                sum(f for _, f in counts), [[] for _ in completion_ids])


def turn_of(model_mask, position: int) -> tuple[int, int]:
    """``(t, start)``: the 0-indexed model turn holding token ``position`` (a position that starts a turn belongs to it;
    a position on a tool result or at the end belongs to the next turn) and where that turn starts (``position``
    for a turn not yet begun)."""
    turn, start, previous = -1, position, 0
    for index, value in enumerate(list(model_mask)[:position]):
        if value and not previous:
            turn, start = turn + 1, index
        previous = value
    if position == 0 or not previous:  # the next token starts a turn
        return turn + 1, position
    return turn, start


def tool_rounds(model_mask) -> int:
    """The tool-loop rounds a completion (or prefix) went through: its runs of tool-result tokens (one per round)."""
    rounds, previous = 0, 1
    for value in model_mask:
        rounds += (not value) and previous
        previous = value
    return int(rounds)


def reset_kwargs(trainer, row: dict) -> dict:
    """The columns TRL passes to ``environment.reset(**...)``: the row, without its ``environment`` routing field in
    multi-environment mode (``GRPOTrainer._generate_and_score_completions``, trl 1.16)."""
    if trainer._multi_environment:
        return {key: value for key, value in row.items() if key != "environment"}
    return row


def environment_name(trainer, row: dict):
    """The environment a row uses: its ``environment`` field with a dict ``environment_factory``, else None (TRL's)."""
    return row.get("environment") if trainer._multi_environment else None


def tool_dicts(trainer, environment) -> tuple[dict, dict]:
    """``(sync, async)`` name -> callable of a rollout: the standalone tools plus the public methods of its
    environment but ``reset`` and ``get_reward``, as ``GRPOTrainer._generate_and_score_completions`` builds them per
    row (trl 1.16; tests/test_tool_loop.py compares the two)."""
    methods = []
    if environment is not None:
        methods = [getattr(environment, name) for name, _ in inspect.getmembers(type(environment),
                                                                                 predicate=inspect.isfunction)
                   if name not in ("reset", "get_reward") and not name.startswith("_")]
    sync, asynchronous = {}, {}
    for tool in list(trainer._standalone_tools) + methods:
        (asynchronous if inspect.iscoroutinefunction(tool) else sync)[tool.__name__] = tool
    return sync, asynchronous


def fresh_environments(trainer, rows: list[dict]) -> list:
    """One environment instance per row (``rows``: the dataset rows of extra rollouts), each ``reset()`` with its
    row's columns, drawn from the core's own pool (created by the row's factory when the pool has too few; reused by
    the next call, as TRL reuses its own). None per row without an ``environment_factory``."""
    if trainer.environment_factories is None:
        return [None] * len(rows)
    pool = trainer.__dict__.setdefault("_extra_environment_pool", defaultdict(list))
    handed: dict = defaultdict(int)
    instances = []
    for row in rows:
        name = environment_name(trainer, row)
        if handed[name] == len(pool[name]):
            pool[name].append(trainer.environment_factories[name]())
        instance = pool[name][handed[name]]
        handed[name] += 1
        instance.reset(**reset_kwargs(trainer, row))
        instances.append(instance)
    return instances


@dataclasses.dataclass
class Resume:
    """A rollout to continue: the dataset ``row`` it belongs to (its columns, its environment kind), the ``prompt``
    messages and ids it was generated from, the kept ``prefix`` and where its last model turn starts
    (:meth:`Episode.prefix`), the model's ``continuation`` of the prefix (its first generation call, made by the
    caller with its own budget) and the ``environment`` instance its tools act on (None: standalone tools only)."""

    row: dict
    prompt: list
    prompt_ids: list[int]
    prefix: Episode
    turn_start: int
    continuation: list[int]
    continuation_logprobs: list[float] | None = None
    environment: object | None = None


def continue_tool_loop(trainer, resumes: list[Resume]) -> list[Episode]:
    """Each resumed rollout to its end through TRL's tool loop (module docstring), returning its whole completion.

    A resumed rollout has the tool rounds its prefix went through counted against ``max_tool_calling_iterations``
    (rows with the same count share one call of TRL's loop). The model mask is the prefix's, then 1 on the
    continuation and TRL's ``tool_mask`` after it; the messages the prefix's, then TRL's. A collective call where
    generation is one (:func:`lockstep_generation`): every process calls it, with or without rows."""
    episodes: list[Episode | None] = [None] * len(resumes)
    by_rounds: dict[int, list[int]] = defaultdict(list)
    for index, resume in enumerate(resumes):
        by_rounds[tool_rounds(resume.prefix.model_mask)].append(index)
    with lockstep_generation(trainer):
        for used, indices in sorted(by_rounds.items()):
            for index, episode in zip(indices, _resume_rounds(trainer, [resumes[i] for i in indices], used)):
                episodes[index] = episode
    return episodes


def collective_generation(trainer) -> bool:
    """Whether the resumed loop's generation calls go in lockstep across processes: with several processes, as every
    extra generation call of the core is collective (``core.generation.generate_from_prefixes``). vLLM in server mode
    (it gathers every process's prompts and slices its answer by process), with tensor parallelism, and HF
    ``generate`` over sharded parameters (FSDP, ZeRO-3) need it; under DDP it keeps every launcher's rows the same
    (a padded call samples its rows as under ZeRO-3)."""
    return trainer.accelerator.num_processes > 1


class Lockstep:
    """TRL's generation calls in lockstep across processes (:func:`lockstep_generation`): :meth:`call` gathers the
    call's rows + 1 and pads the call to the largest row count with one-token filler rows (their output dropped);
    :meth:`finish`, once this process is done, joins the calls the others still make with filler rows, gathering 0,
    until every process gathers 0."""

    def __init__(self, trainer):
        self.trainer = trainer
        tokenizer = trainer._tokenizer
        token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        self.filler = [int(token if token is not None else 0)]

    def call(self, generate, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        rows = len(prompt_ids)
        most = max(1, max(gather_counts(self.trainer, rows + 1)) - 1)
        if images is not None or multimodal_fields:  # (text rows only: a filler row has no image)
            raise ValueError("the resumed tool loop pads its generation calls with text rows across processes; "
                             "images are not supported there.")
        ids, logprobs = generate(fill_rows(list(prompt_ids), most, self.filler), None, {}, num_generations,
                                 has_tool_images)
        return list(ids)[:rows], None if logprobs is None else list(logprobs)[:rows]

    def finish(self, generate) -> None:
        while True:
            most = max(gather_counts(self.trainer, 0)) - 1
            if most < 0:
                return
            generate([self.filler] * max(1, most), None, {}, 1)


@contextlib.contextmanager
def lockstep_generation(trainer, collective: bool | None = None):
    """Inside, the core's ``_generate_single_turn`` (``CreditTrainer``) makes TRL's generation calls in lockstep
    across processes (:class:`Lockstep`; ``collective``, None: :func:`collective_generation`). TRL's tool loop makes
    one call per round for the rows that called a tool, so processes whose rows call tools in different numbers of
    rounds (or that have no rows) would otherwise make different calls. One process: nothing changes."""
    if not (collective_generation(trainer) if collective is None else collective):
        yield
        return
    lockstep, outer = Lockstep(trainer), getattr(trainer, "_generation_lockstep", None)
    trainer._generation_lockstep = lockstep
    try:
        yield
    finally:
        trainer._generation_lockstep = outer
    lockstep.finish(trainer._generate_single_turn)


def _row_tools(trainer, row: dict):
    if trainer.environment_factories is not None:
        return trainer._env_tools[environment_name(trainer, row)]
    return trainer.tools


def _resume_rounds(trainer, resumes: list[Resume], used_rounds: int) -> list[Episode]:
    tokenizer = trainer._tokenizer
    prompts, prompt_ids, completion_ids, completions = [], [], [], []
    with_logprobs = all(r.continuation_logprobs is not None and r.prefix.logprobs is not None for r in resumes)
    logprobs = [] if with_logprobs else None
    for resume in resumes:
        prefix = resume.prefix
        prompts.append(copy.deepcopy(list(resume.prompt)) + copy.deepcopy(prefix.messages))
        prompt_ids.append(list(resume.prompt_ids))
        completion_ids.append(list(prefix.ids) + list(resume.continuation))
        turn = list(prefix.ids[resume.turn_start:]) + list(resume.continuation)
        context = list(resume.prompt_ids) + list(prefix.ids[: resume.turn_start])
        # the continued turn, parsed as TRL's _generate / _tool_call_loop parse a turn (with the tools its prompt has)
        completions.append([parse_response(tokenizer, turn, prefix=context, tools=_row_tools(trainer, resume.row))])
        if logprobs is not None:
            logprobs.append(list(prefix.logprobs) + list(resume.continuation_logprobs))
    rounds_left = trainer.max_tool_calling_iterations - used_rounds
    if rounds_left > 0:
        dicts = [tool_dicts(trainer, resume.environment) for resume in resumes]
        names = [environment_name(trainer, resume.row) for resume in resumes]
        saved = {name: trainer.__dict__.get(name) for name in _LOOP_STATE}
        trainer._sync_tool_dicts = [sync for sync, _ in dicts]
        trainer._async_tool_dicts = [asynchronous for _, asynchronous in dicts]
        trainer._batch_environments = names
        trainer.max_tool_calling_iterations = rounds_left
        try:
            # TRL's own loop (not the core's override, which hands TRL a rollout's finished rows)
            tool_mask, completions, completion_ids, logprobs, *_ = GRPOTrainer._tool_call_loop(
                trainer, prompts, prompt_ids, completion_ids, completions, logprobs, None, {})
        finally:
            for name, value in saved.items():
                if value is None:
                    trainer.__dict__.pop(name, None)
                else:
                    setattr(trainer, name, value)
    else:
        tool_mask = [[1] * len(ids) for ids in completion_ids]
    episodes = []
    for index, resume in enumerate(resumes):
        kept = len(resume.prefix.ids) + len(resume.continuation)
        mask = list(resume.prefix.model_mask) + [1] * len(resume.continuation) + list(tool_mask[index][kept:])
        episodes.append(Episode(list(completion_ids[index]), mask,
                                copy.deepcopy(resume.prefix.messages) + list(completions[index]),
                                None if logprobs is None else list(logprobs[index])))
    return episodes


# What _resume_rounds sets on the trainer for one call of TRL's loop (GRPOTrainer's per-batch tool state).
_LOOP_STATE = ("_sync_tool_dicts", "_async_tool_dicts", "_batch_environments", "max_tool_calling_iterations")


def replay_environment(trainer, environment, row: dict, messages: list[dict]) -> bool:
    """Rebuild ``environment``'s state at the end of ``messages`` (a prefix's: assistant turns and their tool results):
    ``reset(**row)``, then every tool call of every assistant message, in order, dispatched as TRL's loop dispatches
    them (sync calls in order, then the async ones). True when each result renders (``str``, or a content list as it
    is) as the recorded tool message did, name and content; False at the first difference."""
    environment.reset(**reset_kwargs(trainer, row))
    sync, asynchronous = tool_dicts(trainer, environment)
    recorded = [m for m in messages if m.get("role") == "tool"]
    replayed: list[tuple[str, object]] = []
    for message in messages:
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            continue
        results, coroutines = [], []
        for call in message["tool_calls"]:
            if call.get("type") != "function":
                results.append((call.get("name", "unknown"), {"error": f"Unsupported tool call type: {call['type']}"}))
                continue
            name, arguments = call["function"]["name"], call["function"]["arguments"]
            try:
                if name in sync:
                    results.append((name, sync[name](**arguments)))
                elif name in asynchronous:
                    coroutines.append((name, asynchronous[name](**arguments)))
                else:
                    raise ValueError(f"Tool {name} not found.")
            except Exception as error:  # TRL's loop records a failing call's error as its result
                results.append((name, {"error": str(error)}))
        if coroutines:
            async def _gather():
                return await asyncio.gather(*(c for _, c in coroutines), return_exceptions=True)

            outcomes = asyncio.run_coroutine_threadsafe(_gather(), trainer.async_loop).result()
            results += [(name, {"error": str(r)} if isinstance(r, Exception) else r)
                        for (name, _), r in zip(coroutines, outcomes)]
        replayed += results
    if len(replayed) < len(recorded):
        return False
    for (name, result), message in zip(replayed, recorded):
        content = result if isinstance(result, list) else str(result)
        if name != message.get("name") or content != message.get("content"):
            return False
    return True
