"""Hooks into HF transformers' ``generate`` for the generation calls trl_credit makes (vLLM and continuous batching
have their own equivalents and need none of this). Nothing here imports TRL: the trainer is read duck-typed
(``use_vllm``, ``_tokenizer``, ``eos_token_ids``, ``accelerator``, ``model_wrapped``), so this module can be tested
and reused without it.

- :func:`hf_generate_hooks`: per-row token budgets and stop strings (:class:`_RowStop`), one shared prefill for rows
  with the same prompt (:func:`_shared_prefill`), and row compaction once most rows have finished
  (:func:`_generate_compacting`).
- :func:`kept_length`: how much of a generated row to keep (its budget, its first stop string), on every backend.
- :class:`GenerationRecorder`: log-probs and entropies of the sampled tokens, recorded during HF ``generate``, so
  no extra forward pass is needed for them.

A shared prefill runs one forward of the model that is not a generation step; :data:`_PREFILL_FORWARD` (a context
variable, set only while that forward runs) tells the recorder's hook to ignore it.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import math
from collections.abc import Iterator, Sequence

import torch
import transformers

__all__ = ["hf_generate_hooks", "kept_length", "GenerationRecorder", "runs_hf_generate", "forward_is_collective"]


def runs_hf_generate(settings) -> bool:
    """Whether generation runs HF ``generate`` (not vLLM, not transformers' continuous batching): the only path whose
    forward a hook sees step by step and whose rows come back padded to the call's length. ``settings``: the trainer,
    or a batch context's ``sampling``."""
    return not getattr(settings, "use_vllm", False) and not getattr(
        settings, "use_transformers_continuous_batching", False)


def forward_is_collective(trainer) -> bool:
    """Whether a forward of the policy is a collective call: several processes and sharded parameters (FSDP, or
    DeepSpeed ZeRO-3: parameter all-gathers), so every process must run the same forwards."""
    return trainer.accelerator.num_processes > 1 and bool(
        getattr(trainer, "is_fsdp_enabled", False)
        or getattr(getattr(trainer.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0) == 3
    )


def kept_length(tokenizer, ids: list[int], budget: int | None, stops: Sequence[str]) -> int:
    """Tokens of a generated row to keep: at most ``budget``, and up to the first token that completes a stop
    string (the shortest prefix whose text contains one)."""
    keep = len(ids) if budget is None else min(len(ids), budget)
    if stops and keep:
        text = tokenizer.decode(ids[:keep], skip_special_tokens=True)
        if any(stop in text for stop in stops):
            for length in range(1, keep + 1):
                if any(stop in tokenizer.decode(ids[:length], skip_special_tokens=True) for stop in stops):
                    return length
    return keep


class _RowStop(transformers.StoppingCriteria):
    """Stops each row of a ``generate`` call at its own token budget (tokens generated since column ``start``;
    ``budgets[i]`` may be ``math.inf``) and right after a stop string.

    With ``compact_below`` (a row count) it also follows which rows have finished (budget, stop string or one of
    ``eos_ids``) and, once fewer than ``compact_below`` rows are still running and they have at least
    ``_COMPACT_MIN_TAIL`` tokens of budget left, ends the whole call (``compacted``): :func:`_generate_compacting`
    continues the running rows (``running``) in a smaller call."""

    def __init__(self, start: int, budgets: torch.Tensor, tokenizer, stops: Sequence[str], *,
                 eos_ids: torch.Tensor | None = None, compact_below: int = 0, cap: int | None = None):
        self.start, self.budgets, self.tokenizer, self.stops = start, budgets, tokenizer, list(stops)
        self.eos_ids, self.compact_below, self.cap = eos_ids, compact_below, cap
        self.finished: torch.Tensor | None = None
        self.compacted = False

    def __call__(self, input_ids, scores, **kwargs):
        generated = input_ids[:, self.start :]
        budgets = self.budgets
        if generated.size(0) != budgets.numel() and generated.size(0) % budgets.numel() == 0:
            # Beam search (generation_kwargs num_beams > 1): generate expands each row in place into its beams.
            budgets = budgets.repeat_interleave(generated.size(0) // budgets.numel())
        done = budgets <= generated.size(1)
        if self.eos_ids is not None and generated.size(1):
            done |= torch.isin(generated[:, -1], self.eos_ids)
        if self.finished is not None:
            done |= self.finished  # a finished row's later tokens are padding
        if self.stops:
            for row in (~done).nonzero().flatten().tolist():
                text = self.tokenizer.decode(generated[row].tolist(), skip_special_tokens=True)
                done[row] = any(stop in text for stop in self.stops)
        if not self.compact_below:
            return done
        self.finished = done
        running = ~done
        if 0 < int(running.sum()) < self.compact_below:
            tail = budgets[running].max().clamp(max=self.cap) - generated.size(1)
            if tail >= _COMPACT_MIN_TAIL:
                self.compacted = True
                return torch.ones_like(done)
        return done

    @property
    def running(self) -> torch.Tensor:
        return (~self.finished).nonzero().flatten()


# Row compaction (hf_generate_hooks(compact_rows=True)): HF generate computes every row of its batch at every step
# until the longest row ends, so a call whose rows end at very different lengths (DATPO's branches: EOS anywhere in
# a long budget) spends most of its tail on finished rows. Once fewer than this share of a call's rows is running,
# the running rows continue in a new call from their cache rows; a shorter tail than _COMPACT_MIN_TAIL tokens is not
# worth the cache copy.
_COMPACT_WHEN_RUNNING = 0.5
_COMPACT_MIN_TAIL = 4


@contextlib.contextmanager
def hf_generate_hooks(
    trainer, row_budgets: list | None = None, stops: Sequence[str] = (), share_prefill: bool = True,
    compact_rows: bool = False,
) -> Iterator[None]:
    """HF ``generate`` only (vLLM and continuous batching: nothing here), for the generation calls made inside:

    - ``row_budgets``: stop each row at its own token budget (``row_budgets[i]``, None = the call's cap; the list
      is read at each call, so the caller can refill it between calls), and ``stops``: right after a stop string.
      A stopping criterion is added to TRL's ``generate`` call (TRL passes no ``stopping_criteria`` of its own).
      Finished rows are padded by ``generate``; the caller cuts them.
    - ``share_prefill``: rows with the same (left-padded) prompt are prefilled once (:func:`_shared_prefill`): the
      B̂ branches of a DATPO fork or the suffixes of an SRPO reset state read their common prefix in one forward,
      and ``generate`` continues every row from a copy of that cache, as vLLM's prefix cache does.
    - ``compact_rows``: once fewer than half of a call's rows are still running, the running ones continue in a
      smaller ``generate`` call from their rows of the cache (:func:`_generate_compacting`), so finished rows stop
      costing compute; what is sampled is unchanged in distribution (the same distributions at every step, tested
      greedily), not in its draws: after a compaction the running rows draw from the RNG in a smaller batch.

    The model's ``generate`` is wrapped on the instance for the duration.
    """
    if not runs_hf_generate(trainer):
        yield
        return
    tokenizer = trainer._tokenizer
    stops = [s for s in (stops or []) if s]
    eos_ids = list(getattr(trainer, "eos_token_ids", None) or [tokenizer.eos_token_id])

    model = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    had_own = "generate" in model.__dict__
    saved = model.__dict__.get("generate")
    bound = model.generate
    # Under FSDP or ZeRO-3 with several processes a forward can be a collective call (parameter all-gathers), and
    # the prefill forward is made only where rows repeat: not shared there, so every process runs the same forwards
    # (and no process ends a call early by compacting while another still runs its rows).
    sharded = forward_is_collective(trainer)
    share_prefill = share_prefill and not sharded
    compact_rows = compact_rows and not sharded

    def generate(*args, **kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        known = row_budgets or []
        budgets = torch.tensor(
            [known[row] if row < len(known) and known[row] is not None else math.inf
             for row in range(input_ids.size(0))],
            device=input_ids.device,
        )
        if share_prefill and not args:
            kwargs = _shared_prefill(model, kwargs)
        if compact_rows and not args and _can_compact(model, kwargs):
            return _generate_compacting(bound, kwargs, budgets, tokenizer, stops, eos_ids)
        if row_budgets is not None or stops:
            criteria = transformers.StoppingCriteriaList(list(kwargs.pop("stopping_criteria", None) or []))
            criteria.append(_RowStop(input_ids.size(1), budgets, tokenizer, stops))
            kwargs["stopping_criteria"] = criteria
        return bound(*args, **kwargs)

    model.generate = generate
    try:
        yield
    finally:
        if had_own:
            model.generate = saved
        else:
            del model.generate


def _can_compact(model, kwargs: dict) -> bool:
    """Whether :func:`_generate_compacting` handles this ``generate`` call: plain sampling or greedy decoding of
    one sequence per row with a ``max_new_tokens`` cap, a growing (dynamic) cache whose rows can be selected
    (:func:`_cache_rows_selectable`), nothing that counts tokens from the call's own start (``min_new_tokens``) and
    no extra inputs."""
    config = kwargs.get("generation_config")
    cache = kwargs.get(_generate_cache_kwarg())
    return (
        config is not None
        and kwargs.get("input_ids") is not None
        and kwargs.get("attention_mask") is not None
        and not set(kwargs) - _PREFILL_SAFE_KWARGS - {_generate_cache_kwarg()}
        and kwargs["input_ids"].dim() == 2
        and getattr(config, "max_new_tokens", None)
        and getattr(config, "num_beams", 1) in (None, 1)
        and getattr(config, "num_return_sequences", 1) in (None, 1)
        and not getattr(config, "min_new_tokens", None)
        and not getattr(config, "return_dict_in_generate", False)
        and (cache is None or isinstance(cache, transformers.DynamicCache))
        and _cache_can_be_continued(model, config)
        and _cache_rows_selectable(model, cache)
    )


def _generate_compacting(bound, kwargs: dict, budgets: torch.Tensor, tokenizer, stops, eos_ids) -> torch.Tensor:
    """``generate(**kwargs)`` (HF, one sequence per row) in segments: whenever fewer than half of the segment's rows
    are still running, the segment ends (:class:`_RowStop`), and the running rows continue in the next segment
    from their sequences so far and their rows of the segment's cache (``batch_select_indices``), where ``generate``
    reads only the last sampled token before sampling on. Each step's distribution is the one a single call
    computes (same context, positions from the extended attention mask, logits processors that read the whole
    sequence), so sampling is unchanged. Returns what ``generate`` returns: prompt + new tokens per row, finished
    rows padded, as long as the longest row."""
    config = kwargs["generation_config"]
    input_ids, attention_mask = kwargs["input_ids"], kwargs["attention_mask"]
    cache_key = _generate_cache_kwarg()
    cache = kwargs.get(cache_key)
    cap, start = int(config.max_new_tokens), input_ids.size(1)
    pad_id = config.pad_token_id if config.pad_token_id is not None else eos_ids[0]
    # a row is finished at any EOS generate stops on (its config's) or TRL cuts at (the trainer's)
    config_eos = config.eos_token_id if isinstance(config.eos_token_id, (list, tuple)) else [config.eos_token_id]
    eos = torch.tensor(sorted({int(e) for e in [*eos_ids, *config_eos] if e is not None}), device=input_ids.device)
    others = list(kwargs.get("stopping_criteria") or [])
    output = torch.full((input_ids.size(0), start + cap), int(pad_id), dtype=input_ids.dtype, device=input_ids.device)
    output[:, :start] = input_ids
    rows = torch.arange(input_ids.size(0), device=input_ids.device)  # original row of each running row
    sequences, longest = input_ids, start
    while True:
        produced = sequences.size(1) - start
        segment_config = copy.deepcopy(config)
        segment_config.max_new_tokens = cap - produced
        segment_config.return_dict_in_generate = True
        stop = _RowStop(start, budgets[rows], tokenizer, stops, eos_ids=eos, cap=cap,
                        compact_below=math.ceil(_COMPACT_WHEN_RUNNING * rows.numel()))
        call = {**kwargs, "input_ids": sequences, "attention_mask": attention_mask, "generation_config": segment_config,
                "stopping_criteria": transformers.StoppingCriteriaList(others + [stop])}
        if cache is not None:
            call[cache_key] = cache
        else:
            call.pop(cache_key, None)
        result = bound(**call)
        new = result.sequences
        output[rows, : new.size(1)] = new
        longest = max(longest, new.size(1))
        cache = getattr(result, "cache", None)
        if cache is None:
            cache = getattr(result, "past_key_values", None)
        if not stop.compacted:
            break
        if not isinstance(cache, transformers.DynamicCache) or not _layers_rows_selectable(cache.layers):
            # cannot happen with _can_compact's checks
            raise RuntimeError("row compaction: generate returned no dynamic cache whose rows can be selected")
        running = stop.running
        cache.batch_select_indices(running)
        attention_mask = torch.cat(
            [attention_mask, attention_mask.new_ones(attention_mask.size(0), new.size(1) - attention_mask.size(1))],
            dim=1,
        )[running]
        sequences, rows = new[running], rows[running]
    return output[:, :longest]


# generate() arguments a shared prefill leaves as they are; any other (images, a cache, an assistant model...) means
# a call it does not handle, which then runs unchanged.
_PREFILL_SAFE_KWARGS = {"input_ids", "attention_mask", "generation_config", "stopping_criteria", "logits_processor"}
# True while a shared prefill's forward runs (in this thread/task): GenerationRecorder ignores that forward, which is
# not a generation step.
_PREFILL_FORWARD: contextvars.ContextVar[bool] = contextvars.ContextVar("trl_credit_prefill_forward", default=False)


@functools.cache
def _generate_cache_kwarg() -> str:
    """The name ``generate`` takes a ready cache under: ``cache`` in recent transformers (``past_key_values`` is
    deprecated there), ``past_key_values`` before."""
    import inspect

    from transformers.generation.utils import GenerationMixin

    source = inspect.getsource(GenerationMixin.generate)  # with its decorators
    return "cache" if 'new_name="cache"' in source else "past_key_values"


def _shared_prefill(model, kwargs: dict) -> dict:
    """``generate`` kwargs in which rows with the same prompt share one prefill.

    The distinct rows (prompt ids and attention mask, as left-padded by TRL) are run through the model once, all
    but their last token, with the position ids ``generate`` gives them; the cache is copied to every row
    (``batch_select_indices``) and handed to ``generate``, which then reads only each row's last prompt token
    before sampling. Sampling, logits processors and stopping are ``generate``'s own, so the rows are generated
    exactly as without sharing, up to float rounding in the prefill. Calls this does not handle (beam search,
    several return sequences, a static cache, multimodal inputs, no repeated rows, a cache whose rows cannot be
    selected, as the linear-attention layers of hybrid models) are returned unchanged.
    """
    input_ids, attention_mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    config = kwargs.get("generation_config")
    if (
        input_ids is None
        or attention_mask is None
        or set(kwargs) - _PREFILL_SAFE_KWARGS
        or input_ids.dim() != 2
        or input_ids.size(1) < 2
        or config is None
        or getattr(config, "num_beams", 1) not in (None, 1)
        or getattr(config, "num_return_sequences", 1) not in (None, 1)
        or not _prefill_can_be_shared(model, config)
    ):
        return kwargs
    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    distinct, owner = torch.unique(rows, dim=0, return_inverse=True)
    if distinct.size(0) == rows.size(0):
        return kwargs  # nothing repeated: nothing to share
    length = input_ids.size(1)
    prefix_ids, prefix_mask = distinct[:, : length - 1], distinct[:, length : 2 * length - 1]
    # position ids as generate derives them from a left-padded attention mask (padding: 0, masked anyway)
    position_ids = prefix_mask.long().cumsum(-1) - 1
    position_ids.masked_fill_(prefix_mask == 0, 0)
    token = _PREFILL_FORWARD.set(True)
    try:
        with torch.no_grad():  # generate's own prefill runs without grad too
            output = model(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=position_ids,
                           use_cache=True, **({"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}))
    finally:
        _PREFILL_FORWARD.reset(token)
    cache = getattr(output, "cache", None)
    if cache is None:
        cache = getattr(output, "past_key_values", None)
    if not isinstance(cache, transformers.DynamicCache) or not _layers_rows_selectable(cache.layers):
        return kwargs  # only the plain growing cache is known to continue correctly from a copy of its rows
    cache.batch_select_indices(owner.to(prefix_ids.device))
    return {**kwargs, _generate_cache_kwarg(): cache}


def _prefill_can_be_shared(model, config) -> bool:
    """Whether ``generate`` would continue from a ready cache exactly as from its own prefill
    (:func:`_cache_can_be_continued`) and no dropout is active (the copies would share one dropout draw for their
    prompt, where separate prefills draw one each)."""
    if not _cache_can_be_continued(model, config) or not _cache_rows_selectable(model):
        return False
    if model.training and any(
        isinstance(module, torch.nn.Dropout) and module.p > 0 for module in model.modules()
    ):
        return False
    if model.training and getattr(getattr(model, "config", None), "attention_dropout", 0.0):
        return False
    return True


def _cache_can_be_continued(model, config) -> bool:
    """Whether ``generate`` continues from a ready cache exactly as it would from its own: no cache implementation
    or chunked prefill requested (by the call's or the model's generation config: ``generate`` refuses a cache
    next to a ``cache_implementation`` and chunked prefill restarts at position 0 in some versions), no
    prompt-lookup decoding, no prompt-learning adapter (it prepends its own cache)."""
    own = getattr(model, "generation_config", None)
    for source in (config, own):
        if source is None:
            continue
        if getattr(source, "cache_implementation", None) is not None or getattr(source, "prefill_chunk_size", None):
            return False
        if getattr(source, "use_cache", True) is False or getattr(source, "prompt_lookup_num_tokens", None):
            return False
    if getattr(getattr(model, "active_peft_config", None), "is_prompt_learning", False):
        return False
    return True


def _cache_rows_selectable(model, cache=None) -> bool:
    """Whether the rows of ``model``'s generation cache (``cache``, else the one its config describes) can be
    selected: :func:`_layers_rows_selectable`."""
    if cache is None:
        try:
            cache = transformers.DynamicCache(config=model.config)
        except Exception:  # a config DynamicCache cannot read: do not guess
            return False
    return _layers_rows_selectable(getattr(cache, "layers", []))


def _layers_rows_selectable(layers) -> bool:
    """Whether ``batch_select_indices`` selects rows of every state these cache layers hold. A capability check,
    not a list of models: a layer needs the method, and a linear-attention layer (hybrid models: Mamba, gated
    DeltaNet, short convolutions) one written for its conv and recurrent states. transformers 5.24 has none:
    ``LinearAttentionLayer`` lacks the method and the hybrid layers inherit ``DynamicLayer``'s, which selects the
    keys and values only."""
    linear = getattr(transformers.cache_utils, "LinearAttentionCacheLayerMixin", None)
    for layer in layers:
        owner = next((k for k in type(layer).__mro__ if "batch_select_indices" in vars(k)), None)
        if owner is None or (linear is not None and isinstance(layer, linear) and not issubclass(owner, linear)):
            return False
    return True


def _accepts_logits_to_keep(model) -> bool:
    import inspect

    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(causal_lm.forward).parameters


class GenerationRecorder:
    """Records, during HF ``generate``, the log-prob of each sampled token and/or the entropy of the distribution it
    was sampled from: what TRL's ``_get_per_token_logps_and_entropies`` computes in a separate forward pass, i.e.
    ``log_softmax(logits / temperature)`` at the sampled token and ``-(p · log p).sum()`` over that
    temperature-scaled distribution (top-p/top-k/min-p and repetition penalties are sampling rules, not part of the
    policy's distribution).

    A forward hook (``register_forward_hook(..., with_kwargs=True)``) on the causal LM that ``generate`` calls; use
    :meth:`attached`. Each generation step's forward returns the next position's logits. Entropies are taken at
    once; a log-prob needs the token sampled there, which is the next step's input, so the previous step's
    distribution is kept (one (B, V) tensor at a time) and the last token is read in :meth:`logps`. Only HF
    ``generate`` runs the model this way: vLLM and continuous batching do not (see :meth:`available`).
    """

    def __init__(self, temperature: float, *, logps: bool = True, entropies: bool = False):
        self.temperature = float(temperature)
        self.record_logps = bool(logps)
        self.record_entropies = bool(entropies)
        self.previous: torch.Tensor | None = None  # log-probs of the last step's distribution (B, V)
        self.logp_steps: list[torch.Tensor] = []
        self.entropy_steps: list[torch.Tensor] = []
        self.num_steps = 0
        self.failed = False

    @contextlib.contextmanager
    def attached(self, trainer) -> Iterator["GenerationRecorder"]:
        """The hook on the trainer's causal LM (the PEFT base model, whose forward ``generate`` calls) while inside."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        with self.attached_to(model):
            yield self

    @contextlib.contextmanager
    def attached_to(self, model) -> Iterator["GenerationRecorder"]:
        """The hook on ``model`` (a causal LM, e.g. ``BatchContext.causal_lm``) while inside."""
        handle = model.register_forward_hook(self, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()

    def __call__(self, module, args, kwargs, output):
        if _PREFILL_FORWARD.get():
            return None  # a shared prefill's forward (hf_generate_hooks), not a generation step
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        logits = getattr(output, "logits", None)
        if self.failed or input_ids is None or logits is None:
            self.failed = True
            return None
        if self.previous is not None and input_ids.size(0) != self.previous.size(0):
            self.failed = True  # rows changed between steps (not one generate call)
            return None
        logp = torch.log_softmax(logits[:, -1, :].float() / self.temperature, dim=-1)
        if self.record_logps:
            if self.previous is not None:
                self.logp_steps.append(self.previous.gather(1, input_ids[:, -1:].to(self.previous.device)).squeeze(1))
        if self.record_entropies:
            self.entropy_steps.append(-(logp.exp() * logp).sum(dim=-1))
        self.previous = logp if self.record_logps else logp[:, :0]
        self.num_steps += 1
        return None

    def _lines_up(self, completion_ids: Sequence[Sequence[int]]) -> bool:
        # one forward per generated position of the longest row, one row per completion
        return (
            not self.failed
            and self.previous is not None
            and bool(completion_ids)
            and self.num_steps == max(len(ids) for ids in completion_ids)
            and self.previous.size(0) == len(completion_ids)
        )

    def logps(self, completion_ids: Sequence[Sequence[int]]) -> list[list[float]] | None:
        """Log-prob of each row's sampled tokens (rows as generated), or None when not recorded or the record does
        not line up with the completions (the caller then scores them in a forward pass)."""
        if not self.record_logps or not self._lines_up(completion_ids):
            return None
        length = self.num_steps
        last = torch.tensor(
            [ids[-1] if len(ids) == length else 0 for ids in completion_ids], device=self.previous.device
        )
        table = torch.stack(self.logp_steps + [self.previous.gather(1, last[:, None]).squeeze(1)], dim=1).cpu()
        return [table[i, : len(ids)].tolist() for i, ids in enumerate(completion_ids)]

    def entropies(self, completion_ids: Sequence[Sequence[int]]) -> list[list[float]] | None:
        """Entropy of the distribution each row's tokens were sampled from, or None (as :meth:`logps`)."""
        if not self.record_entropies or not self._lines_up(completion_ids):
            return None
        table = torch.stack(self.entropy_steps, dim=1).cpu()
        return [table[i, : len(ids)].tolist() for i, ids in enumerate(completion_ids)]
