"""Generation calls a method makes beyond TRL's rollouts, and the vLLM weight push they share.

- :func:`sampling_overrides` / :func:`generate_from_prefixes`: extra generation calls (branches, seeds,
  localization, suffixes, judge) through ``GRPOTrainer._generate_single_turn``, so HF ``generate``, continuous
  batching and vLLM (server and colocate) all work, with per-call overrides (greedy, max tokens, stop strings)
  reaching every path, and every process making the same collective calls even when it has nothing to generate.
  HF ``generate``'s own part (per-row budgets, shared prefill) is :mod:`trl_credit.generation.hooks`.
- :func:`one_weight_push`: the policy weights reach vLLM once per generation phase, however many generation calls
  a method makes in it (the credit core runs its whole ``_generate_and_score_completions`` inside it).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence

from trl_credit.core.collectives import fill_rows, gather_counts
from trl_credit.generation.hooks import hf_generate_hooks, kept_length
from trl_credit.generation.vllm_hooks import vllm_row_budgets
from trl_credit.trl_bridge.vllm_push import vllm_generation

__all__ = ["sampling_overrides", "generate_from_prefixes", "one_weight_push"]


@contextlib.contextmanager
def sampling_overrides(
    trainer,
    *,
    max_new_tokens: int | None = None,
    greedy: bool = False,
    temperature: float | None = None,
    top_p: float | None = None,
    stop_strings: Sequence[str] | None = None,
) -> Iterator[None]:
    """Temporarily change sampling for generation calls made through ``trainer._generate_single_turn``.

    TRL keeps sampling settings in three places: ``trainer.generation_config`` (HF generate and continuous
    batching), ``trainer.generation_kwargs`` (re-applied onto the model's own generation config by
    ``unwrap_model_for_generation``) and the attributes of ``trainer.vllm_generation`` (vLLM server and
    colocate). All three are overridden and restored, so the override reaches whichever backend is active.
    Greedy decoding is ``do_sample=False`` for HF and ``temperature=0`` for vLLM.

    ``stop_strings``: a row stops right after the first occurrence of any of them, kept in the output (vLLM: its
    ``stop`` / ``include_stop_str_in_output`` sampling parameters through ``vllm_generation.generation_kwargs``;
    HF ``generate``: a stopping criterion, see :func:`hf_generate_hooks`; continuous batching: not stopped early, the
    caller's cut applies). Per-row token budgets are applied the same way by :func:`generate_from_prefixes`.
    """
    hf_changes: dict = {}
    vllm_changes: dict = {}
    if max_new_tokens is not None:
        hf_changes["max_new_tokens"] = int(max_new_tokens)
        vllm_changes["max_completion_length"] = int(max_new_tokens)
    if greedy:
        hf_changes.update(do_sample=False, temperature=None, top_p=None, top_k=None, min_p=None)
        vllm_changes["temperature"] = 0.0  # vLLM decodes greedily at temperature 0, whatever top_p/top_k say
    else:
        if temperature is not None:
            hf_changes["temperature"] = float(temperature)
            vllm_changes["temperature"] = float(temperature)
        if top_p is not None:
            hf_changes["top_p"] = float(top_p)
            vllm_changes["top_p"] = float(top_p)

    saved_config = getattr(trainer, "generation_config", None)
    saved_kwargs = getattr(trainer, "generation_kwargs", None)
    engine = vllm_generation(trainer)
    if stop_strings and engine is not None:
        vllm_changes["generation_kwargs"] = {
            **(getattr(engine, "generation_kwargs", None) or {}),
            "stop": list(stop_strings),
            "include_stop_str_in_output": True,
        }
    saved_vllm = {k: getattr(engine, k) for k in vllm_changes} if engine is not None else {}
    try:
        if saved_config is not None and hf_changes:
            config = copy.deepcopy(saved_config)
            for key, value in hf_changes.items():
                setattr(config, key, value)
            trainer.generation_config = config
        if saved_kwargs is not None and hf_changes:
            trainer.generation_kwargs = {**saved_kwargs, **hf_changes}
        if engine is not None:
            for key, value in vllm_changes.items():
                setattr(engine, key, value)
        yield
    finally:
        if saved_config is not None:
            trainer.generation_config = saved_config
        if saved_kwargs is not None:
            trainer.generation_kwargs = saved_kwargs
        for key, value in saved_vllm.items():
            setattr(engine, key, value)


def generate_from_prefixes(
    trainer,
    prefix_ids: Sequence[Sequence[int]],
    *,
    chunk_size: int | None = None,
    max_new_tokens: int | Sequence[int] | None = None,
    greedy: bool = False,
    temperature: float | None = None,
    top_p: float | None = None,
    stop_strings: Sequence[str] | None = None,
) -> tuple[list[list[int]], list[list[float]] | None]:
    """One continuation per row of ``prefix_ids`` (token ids: prompt, or prompt + partial response).

    Goes through ``trainer._generate_single_turn(..., num_generations=1)``, so every backend TRL supports is used
    the same way GRPOTrainer uses it. This is a *collective* call: every process must call it, the same number
    of times, even with zero rows. Inside, processes agree on a common number of calls and a common row count per
    call (vLLM server mode slices its answer by ``process_index * len(prompts)``, so counts must match); short
    processes fill with a one-token dummy row whose output is dropped.

    ``max_new_tokens`` is one budget for every row, or one per row (a list as long as ``prefix_ids``). With per-row
    budgets the call's cap is the largest budget over every process (the same on all, as vLLM server mode needs),
    HF ``generate`` and a colocated vLLM stop each row at its own budget (:mod:`trl_credit.generation.vllm_hooks`),
    and every row is cut to its budget afterwards (vLLM in server mode or with tensor parallelism generates up to the
    call's cap; what it generates past a row's budget is dropped). ``stop_strings``: a row ends
    right after the first occurrence of any of them (see :func:`sampling_overrides`); the output is cut there on
    every backend, so all backends return the same tokens.

    Returns ``(completion_ids, sampling_logprobs)``; the log-probs are vLLM's (None with HF generate).
    """
    rows = [list(map(int, ids)) for ids in prefix_ids]
    budgets = None
    if max_new_tokens is not None and not isinstance(max_new_tokens, int):
        budgets = [int(b) for b in max_new_tokens]
        if len(budgets) != len(rows) or any(b < 1 for b in budgets):
            raise ValueError(f"max_new_tokens per row needs {len(rows)} budgets >= 1, got {budgets}.")
        # The call's cap, the same on every process (a collective call).
        max_new_tokens = max(gather_counts(trainer, max(budgets, default=0)))
    counts = gather_counts(trainer, len(rows))
    most = max(counts)
    if most == 0:
        return [], None
    per_call = most if not chunk_size else min(int(chunk_size), most)
    num_calls = math.ceil(most / per_call)
    filler = _filler_row(trainer, rows)
    tokenizer = trainer._tokenizer
    stops = [s for s in (stop_strings or []) if s]

    completions: list[list[int]] = []
    logprobs: list[list[float]] | None = []
    row_budgets: list[int | None] = []  # budgets of the chunk being generated, read by the HF stopping criterion
    with (
        _extra_generation(trainer),
        sampling_overrides(
            trainer, max_new_tokens=max_new_tokens, greedy=greedy, temperature=temperature, top_p=top_p,
            stop_strings=stops or None,
        ),
        hf_generate_hooks(trainer, row_budgets if budgets is not None else None, stops),
        vllm_row_budgets(trainer, row_budgets if budgets is not None else None),
    ):
        for call in range(num_calls):
            chunk = rows[call * per_call : (call + 1) * per_call]
            real = len(chunk)
            chunk = fill_rows(chunk, per_call, filler)
            chunk_budgets = budgets[call * per_call : (call + 1) * per_call] if budgets is not None else [None] * real
            row_budgets[:] = fill_rows(chunk_budgets, per_call, 1)  # filler rows: one token
            completion_ids, chunk_logprobs = trainer._generate_single_turn(chunk, None, {}, 1)
            if chunk_logprobs is None:
                logprobs = None
            for index in range(real):
                ids = list(completion_ids[index])
                keep = kept_length(tokenizer, ids, chunk_budgets[index], stops)
                completions.append(ids[:keep])
                if logprobs is not None:
                    logprobs.append(list(chunk_logprobs[index])[:keep])
    return completions, logprobs


@contextlib.contextmanager
def _extra_generation(trainer) -> Iterator[None]:
    """Marks generation calls a method makes itself: it handles their empty rows (mixins.checking_empty_completions)."""
    outer = getattr(trainer, "_in_extra_generation", False)
    trainer._in_extra_generation = True
    try:
        yield
    finally:
        trainer._in_extra_generation = outer


def _filler_row(trainer, rows: list[list[int]]) -> list[int]:
    if rows:
        return rows[0][:1]
    tokenizer = trainer._tokenizer
    token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return [int(token if token is not None else 0)]


@contextlib.contextmanager
def one_weight_push(trainer) -> Iterator[None]:
    """Every generation call inside shares one push of the policy weights to vLLM (and one wake/sleep cycle).

    TRL 1.16 pushes the weights at most once per optimizer step (``_last_loaded_step``) except in colocate mode with
    ``vllm_enable_sleep_mode``: each ``VLLMGeneration.generate`` call ends in ``sleep(level=2)``, which discards the
    weights, so the next call of the same step pushes them again (SRPO makes 3+ calls a step, DATPO 2, Cue-GRPO's
    judge one more). Inside this context vLLM is woken once (weights pushed when discarded or stale, KV cache woken),
    stays awake across the calls, and sleeps again on exit. Anywhere else (no vLLM, server mode, no sleep mode,
    already inside) a no-op. Cost: vLLM's weights and KV cache stay resident while the no-grad scoring passes of
    the generation phase run.
    """
    vllm = vllm_generation(trainer)
    if (
        vllm is None
        or getattr(vllm, "mode", None) != "colocate"
        or not getattr(vllm, "enable_sleep_mode", False)
        or getattr(trainer, "_one_weight_push_active", False)
    ):
        yield
        return
    trainer._one_weight_push_active = True
    kv_awake = False
    try:
        if vllm._llm_weights_sleeping or trainer._last_loaded_step != trainer.state.global_step:
            vllm.sync_weights()  # in sleep mode it wakes the weights first
            trainer._last_loaded_step = trainer.state.global_step
        vllm.llm.wake_up(tags=["kv_cache"])
        kv_awake = True
        vllm.enable_sleep_mode = False  # generate() neither wakes nor sleeps (nor re-pushes) while inside
        yield
    finally:
        vllm.enable_sleep_mode = True
        if kv_awake or not vllm._llm_weights_sleeping:
            vllm.llm.sleep(level=2)
            vllm._llm_weights_sleeping = True
        trainer._one_weight_push_active = False
