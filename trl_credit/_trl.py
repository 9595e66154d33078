"""The few TRL helpers every trainer shares. Nothing method-specific lives here; the private TRL names they use are
listed in :mod:`trl_credit.trl_compat` (supported TRL versions and shims).

- :func:`sampling_overrides` / :func:`generate_from_prefixes`: extra generation calls (branches, seeds,
  localization, suffixes, judge) through ``GRPOTrainer._generate_single_turn``, so HF ``generate``, continuous
  batching and vLLM (server and colocate) all work, with per-call overrides (greedy, max tokens) reaching every
  path, and every process making the same collective calls even when it has nothing to generate.
- :func:`gather_rows` / :func:`gather_counts`: group bookkeeping across processes.
- :func:`score_completions`: batched no-grad log-probs (and entropies) of completion tokens under any prompt,
  through ``GRPOTrainer._get_per_token_logps_and_entropies``.
- :func:`log_metric`: a method metric next to GRPO's (``trainer._metrics``), averaged over processes by the caller.
- :func:`bind_success` / :func:`rollout_success`: the verifier column that decides correct/incorrect
  (:mod:`trl_credit.success`), resolved once at construction.
- :func:`warn_once`: a method that cannot do its job on some input says so once (plus a rate metric each step).
- :func:`nonfinite_reward_groups`: groups with a ±inf reward (no step, as TRL's GRPO), warned about and counted.
- :func:`one_weight_push` / :class:`OneWeightPushMixin`: the policy weights reach vLLM once per generation phase,
  however many generation calls a method makes in it.
- :class:`EmptyCompletionCheckMixin`: a clear error instead of TRL's IndexError on an empty (0-token) completion.
- :class:`GenerationRecorder`: log-probs and entropies of the sampled tokens, recorded during HF ``generate``, so
  no extra forward pass is needed for them.
- :class:`CPUMemoryMixin`: on the CPU, TRL's fused log-prob head in small tiles and large buffers returned to the
  OS when freed (docs/design.md#memory-on-the-cpu).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import json
import math
import os
import platform
import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence

import torch
import transformers
from accelerate.utils import gather_object
from packaging.version import Version
from trl import GRPOTrainer

from trl_credit.trl_compat import (
    check_trl_can_train,
    disable_gradient_checkpointing,
    is_conversational,
    pad,
    parse_response,
    small_logprob_tiles,
)

__all__ = [
    "sampling_overrides",
    "generate_from_prefixes",
    "gather_rows",
    "gather_counts",
    "score_completions",
    "log_metric",
    "pad_rows",
    "trainer_mode",
    "check_single_turn",
    "outside_zero3_init",
    "resolve_method_args",
    "decode_completions",
    "rewards_of_extra_rows",
    "bind_success",
    "rollout_success",
    "warn_once",
    "nonfinite_reward_groups",
    "zero_nonfinite_groups",
    "one_weight_push",
    "OneWeightPushMixin",
    "MethodRNGStateMixin",
    "EmptyCompletionCheckMixin",
    "CPUMemoryMixin",
    "return_freed_buffers",
    "refuse_empty_completions",
    "GenerationRecorder",
    "hf_generate_hooks",
]


def trainer_mode(trainer) -> str:
    return "train" if trainer.model.training else "eval"


def log_metric(trainer, name: str, value: float) -> None:
    """Append a scalar to TRL's metric buffer; TRL averages the buffer over the logging window and sends it to
    every ``report_to`` backend next to ``reward``, ``kl``, ... Callers pass values already reduced over processes
    (as TRL does) so every rank logs the same number."""
    trainer._metrics[trainer_mode(trainer)][name].append(float(value))


def bind_success(trainer) -> int:
    """Resolve ``args.success_reward`` against TRL's ``reward_func_names`` once, at construction, so a wrong name or
    index fails before any training. Stored as ``trainer._success_index``."""
    from trl_credit.success import resolve_success_index

    trainer._success_index = resolve_success_index(trainer.args.success_reward, trainer.reward_func_names)
    return trainer._success_index


def rollout_success(trainer, rewards_per_func: torch.Tensor) -> torch.Tensor:
    """(N,) bool: rows whose verifier reward (``args.success_reward``) is >= ``args.success_threshold``."""
    from trl_credit.success import success_rows

    return success_rows(rewards_per_func, trainer._success_index, trainer.args.success_threshold)


def warn_once(trainer, key: str, message: str) -> None:
    """Warn (on the main process, once per trainer and ``key``) that a method could not do its job on some input.
    The caller also logs the matching rate metric every step, so the warning is never the only trace."""
    seen = trainer.__dict__.setdefault("_trl_credit_warned", set())
    if key in seen:
        return
    seen.add(key)
    if trainer.accelerator.is_main_process:
        warnings.warn(message, UserWarning, stacklevel=3)


def nonfinite_reward_groups(trainer, rewards_per_func: torch.Tensor, group_ids, metric: str) -> torch.Tensor:
    """(N,) bool: the rows (of the global ``rewards_per_func``) whose group (``group_ids``, one per row) holds a
    reward of ±inf from a reward function of non-zero weight.

    TRL 1.16 has no rule for them; its arithmetic decides. With ``sum_then_normalize`` the group's mean and std
    become non-finite, every advantage of the group NaN, and GRPOTrainer's ``nan_to_num(advantages, nan=0.0)`` sets
    them to 0: the group takes no step (``scale_rewards="batch"``: no group does, the batch std being inf;
    ``"none"``: the other rows get ±3.4e38 and the model turns NaN, which our trainers avoid by giving the group 0).
    With ``normalize_then_sum`` only that reward function drops out of the group. The caller applies this; here the
    reward function is named in a warning (once) and ``metric``, the share of groups with such a reward, is logged.
    """
    weights = trainer.reward_weights.to(rewards_per_func.device) != 0
    infinite = torch.isinf(rewards_per_func) & weights.unsqueeze(0)
    groups = torch.as_tensor(group_ids, device=rewards_per_func.device).flatten()
    _, owner = torch.unique(groups, return_inverse=True)
    counts = torch.zeros(int(owner.max()) + 1 if owner.numel() else 0, device=groups.device)
    bad_groups = counts.index_add_(0, owner, infinite.any(dim=1).float()) > 0
    log_metric(trainer, metric, bad_groups.float().mean().item() if bad_groups.numel() else 0.0)
    if bad_groups.any():
        names = [name for k, name in enumerate(trainer.reward_func_names) if infinite[:, k].any()]
        warn_once(
            trainer,
            "nonfinite_reward",
            f"{type(trainer).__name__}: reward function(s) {', '.join(map(repr, names))} returned ±inf. As in TRL's "
            "GRPO, a group holding such a reward gets advantage 0 (with multi_objective_aggregation="
            f"'normalize_then_sum': that function counts 0 in the group). `{metric}` logs the share of such groups.",
        )
    return bad_groups[owner]


def zero_nonfinite_groups(trainer, advantages: torch.Tensor, rewards_per_func: torch.Tensor, metric: str):
    """TRL's advantages of this process's rows (TRL's layout: groups of ``num_generations`` consecutive global rows),
    0 on every row of a group with a ±inf reward under ``sum_then_normalize`` (:func:`nonfinite_reward_groups`): what
    TRL gives them with its default scaling, also with ``scale_rewards="none"``, where TRL's own are ±3.4e38."""
    size = trainer.num_generations if trainer_mode(trainer) == "train" else trainer.num_generations_eval
    group_ids = torch.arange(rewards_per_func.size(0)) // size
    bad = nonfinite_reward_groups(trainer, rewards_per_func, group_ids, metric)
    if trainer.multi_objective_aggregation == "normalize_then_sum":
        return advantages  # TRL's are finite: the function only drops out of the group
    start = trainer.accelerator.process_index * advantages.size(0)
    local = bad[start : start + advantages.size(0)].to(advantages.device)
    return advantages.masked_fill(local.view(-1, *([1] * (advantages.dim() - 1))), 0.0)


def resolve_method_args(args, config_class, model, trainer_name: str, run_suffix: str):
    """GRPOTrainer's behaviour for ``args=None`` (a default config named after the model), and a clear refusal of a
    config of another class (a plain GRPOConfig would silently lack the method's fields). Also refuses a TRL that
    cannot train in this environment (``trl_compat.check_trl_can_train``), before any model is loaded."""
    check_trl_can_train(trainer_name)
    if args is None:
        name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", None) or "model"
        return config_class(f"{str(name).split('/')[-1]}-{run_suffix}")
    if not isinstance(args, config_class):
        raise TypeError(
            f"{trainer_name} needs `args` to be a {config_class.__name__} (got {type(args).__name__}); build one with "
            f"the same GRPO arguments, e.g. {config_class.__name__}(**grpo_args.to_dict())."
        )
    return args


def check_single_turn(trainer, method: str) -> None:
    """Our trainers rewrite rollouts; tool-calling loops and custom rollout functions would bypass that."""
    # environment_factory first: TRL turns an environment's methods into `tools`, so the tools check would name the
    # wrong argument.
    if getattr(trainer, "environment_factories", None) is not None:
        raise ValueError(f"{method} does not support `environment_factory`.")
    if getattr(trainer, "tools", None):
        raise ValueError(f"{method} does not support `tools` (multi-turn tool calling); pass tools=None.")
    if getattr(trainer, "rollout_func", None) is not None:
        raise ValueError(f"{method} does not support a custom `rollout_func`: it generates its own rollouts.")


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
    vllm_generation = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
    if stop_strings and vllm_generation is not None:
        vllm_changes["generation_kwargs"] = {
            **(getattr(vllm_generation, "generation_kwargs", None) or {}),
            "stop": list(stop_strings),
            "include_stop_str_in_output": True,
        }
    saved_vllm = {k: getattr(vllm_generation, k) for k in vllm_changes} if vllm_generation is not None else {}
    try:
        if saved_config is not None and hf_changes:
            config = copy.deepcopy(saved_config)
            for key, value in hf_changes.items():
                setattr(config, key, value)
            trainer.generation_config = config
        if saved_kwargs is not None and hf_changes:
            trainer.generation_kwargs = {**saved_kwargs, **hf_changes}
        if vllm_generation is not None:
            for key, value in vllm_changes.items():
                setattr(vllm_generation, key, value)
        yield
    finally:
        if saved_config is not None:
            trainer.generation_config = saved_config
        if saved_kwargs is not None:
            trainer.generation_kwargs = saved_kwargs
        for key, value in saved_vllm.items():
            setattr(vllm_generation, key, value)


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
    HF ``generate`` stops each row at its own budget, and every row is cut to its budget afterwards (vLLM may
    generate up to the call's cap; what it generates past a row's budget is dropped). ``stop_strings``: a row ends
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
    ):
        for call in range(num_calls):
            chunk = rows[call * per_call : (call + 1) * per_call]
            real = len(chunk)
            chunk = chunk + [filler] * (per_call - real)
            chunk_budgets = budgets[call * per_call : (call + 1) * per_call] if budgets is not None else [None] * real
            row_budgets[:] = chunk_budgets + [1] * (per_call - real)  # filler rows: one token
            completion_ids, chunk_logprobs = trainer._generate_single_turn(chunk, None, {}, 1)
            if chunk_logprobs is None:
                logprobs = None
            for index in range(real):
                ids = list(completion_ids[index])
                keep = _kept_length(tokenizer, ids, chunk_budgets[index], stops)
                completions.append(ids[:keep])
                if logprobs is not None:
                    logprobs.append(list(chunk_logprobs[index])[:keep])
    return completions, logprobs


@contextlib.contextmanager
def _extra_generation(trainer) -> Iterator[None]:
    """Marks generation calls a method makes itself: it handles their empty rows (EmptyCompletionCheckMixin)."""
    outer = getattr(trainer, "_in_extra_generation", False)
    trainer._in_extra_generation = True
    try:
        yield
    finally:
        trainer._in_extra_generation = outer


def _kept_length(tokenizer, ids: list[int], budget: int | None, stops: Sequence[str]) -> int:
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
      costing compute; what is sampled is unchanged (the same distributions at every step, tested greedily).

    The model's ``generate`` is wrapped on the instance for the duration.
    """
    if getattr(trainer, "use_vllm", False) or getattr(trainer, "use_transformers_continuous_batching", False):
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
    sharded = trainer.accelerator.num_processes > 1 and (
        getattr(trainer, "is_fsdp_enabled", False)
        or getattr(getattr(trainer.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0) == 3
    )
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
_IN_SHARED_PREFILL = False  # GenerationRecorder ignores the prefill forward (it is not a generation step)


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
    global _IN_SHARED_PREFILL
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
    _IN_SHARED_PREFILL = True
    try:
        with torch.no_grad():  # generate's own prefill runs without grad too
            output = model(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=position_ids,
                           use_cache=True, **({"logits_to_keep": 1} if _accepts_logits_to_keep(model) else {}))
    finally:
        _IN_SHARED_PREFILL = False
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


def _filler_row(trainer, rows: list[list[int]]) -> list[int]:
    if rows:
        return rows[0][:1]
    tokenizer = trainer._tokenizer
    token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return [int(token if token is not None else 0)]


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
) -> list[torch.Tensor]:
    """Reward matrices of rollouts outside TRL's batch (DATPO branches, SRPO seed candidates), through TRL's own
    ``_calculate_rewards``, so every reward function, its weights and its kwargs apply as for the batch.

    A collective call: ``_calculate_rewards`` ends with an ``accelerate.gather`` that needs the same row count on
    every process, so each process pads its rows to the largest count with ``filler`` = ``(input, prompt,
    prompt_ids, completion_ids)`` of one real row, and the padding is dropped. What reward functions log through
    ``log_extra``/``log_metric`` during the call is discarded: those rows are not the batch TRL's table describes.
    Returns the ``(rows of process q, num_reward_funcs)`` matrix of every process q, in process order.
    """
    counts = counts if counts is not None else gather_counts(trainer, len(completion_ids))
    most = max(counts)
    if most == 0:
        return [torch.zeros(0, len(trainer.reward_funcs), device=trainer.accelerator.device) for _ in counts]
    missing = most - len(completion_ids)
    filler_input, filler_prompt, filler_prompt_ids, filler_completion_ids = filler
    inputs = list(inputs) + [filler_input] * missing
    prompts = list(prompts) + [filler_prompt] * missing
    prompt_ids = list(prompt_ids) + [filler_prompt_ids] * missing
    completion_ids = [list(ids) for ids in completion_ids] + [list(filler_completion_ids)] * missing
    completions = decode_completions(trainer, prompts, prompt_ids, completion_ids)
    saved = trainer._pending_extra_logs, trainer._pending_metrics
    trainer._pending_extra_logs, trainer._pending_metrics = defaultdict(list), defaultdict(list)
    try:
        # GRPOTrainer's own method: subclasses wrap it to capture the batch's rewards, which these rows are not.
        rewards_per_func = GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, completion_ids)
    finally:
        trainer._pending_extra_logs, trainer._pending_metrics = saved
    return [rewards_per_func[q * most : q * most + count] for q, count in enumerate(counts)]


def pad_rows(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device | str,
    pad_to_multiple_of: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRL's layout: prompts left-padded, completions right-padded. Returns
    ``(prompt_ids, prompt_mask, completion_ids, completion_mask)`` as tensors on ``device``."""
    prompts = [torch.tensor(list(ids), dtype=torch.long) for ids in prompt_ids]
    completions = [torch.tensor(list(ids), dtype=torch.long) for ids in completion_ids]
    prompt_tensor = pad(prompts, padding_value=pad_token_id, padding_side="left", pad_to_multiple_of=pad_to_multiple_of)
    prompt_mask = pad(
        [torch.ones_like(t) for t in prompts], padding_value=0, padding_side="left", pad_to_multiple_of=pad_to_multiple_of
    )
    completion_tensor = pad(
        completions, padding_value=pad_token_id, padding_side="right", pad_to_multiple_of=pad_to_multiple_of
    )
    completion_mask = pad(
        [torch.ones_like(t) for t in completions],
        padding_value=0,
        padding_side="right",
        pad_to_multiple_of=pad_to_multiple_of,
    )
    return prompt_tensor.to(device), prompt_mask.to(device), completion_tensor.to(device), completion_mask.to(device)


@torch.no_grad()
def score_completions(
    trainer,
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    compute_entropy: bool = False,
    batch_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) of ``completion_ids`` given ``prompt_ids`` under ``model``, shape (B, T).

    Same layout and batching as TRL's own old/ref log-prob passes (``_get_per_token_logps_and_entropies``);
    gradient checkpointing is switched off for the pass as TRL does.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    batch_size = batch_size or trainer.args.per_device_train_batch_size
    with disable_gradient_checkpointing(trainer.model, trainer.args.gradient_checkpointing_kwargs):
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            batch_size=batch_size,
            compute_entropy=compute_entropy,
        )
    return logps, entropies


@contextlib.contextmanager
def outside_zero3_init() -> Iterator[None]:
    """Load a frozen helper model (DATPO's embedder, Cue-GRPO's judge) as a whole copy on each process.

    Under DeepSpeed ZeRO-3, transformers partitions every model created while its DeepSpeed config is registered
    (``zero.Init``), and a partitioned model only runs inside a DeepSpeed engine. Small frozen helpers that run plain
    forward passes must not be partitioned: the config is unregistered while they load, then registered again.
    Outside ZeRO-3 this does nothing.
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    config = saved() if saved is not None else None
    if config is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(config)


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
    vllm = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
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


def _with_one_weight_push(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with one_weight_push(self):
            return method(self, *args, **kwargs)

    wrapper._one_weight_push = True
    return wrapper


class OneWeightPushMixin:
    """Trainer mixin: the whole generation phase of a step (``_generate_and_score_completions``: base rollouts and
    every extra call a method makes in it) runs inside :func:`one_weight_push`.

    A subclass's own ``_generate_and_score_completions`` (the outermost one) is wrapped when the class is created,
    so the mixin can sit anywhere in the bases.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        method = cls.__dict__.get("_generate_and_score_completions")
        if method is not None and not getattr(method, "_one_weight_push", False):
            cls._generate_and_score_completions = _with_one_weight_push(method)

    @_with_one_weight_push
    def _generate_and_score_completions(self, inputs):
        return super()._generate_and_score_completions(inputs)


class MethodRNGStateMixin:
    """Trainer mixin: random state a method owns is checkpointed and restored with the Trainer's own generators.

    transformers' ``Trainer`` saves python/numpy/torch generator states per process in each checkpoint (private
    ``_save_rng_state``) and restores them when training resumes at the step it stopped (``_load_rng_state``). A
    trainer with more state that decides its draws (SRPO's reset generator, Cue-GRPO's round counter that seeds the
    random partition) returns it as a JSON-able dict from ``_method_rng_state`` and takes it back in
    ``_set_method_rng_state``. It is written to ``trl_credit_rng_state_{process_index}.json`` next to the Trainer's
    file and read at the same moment, so a resumed run repeats the draws of a run that never stopped.
    """

    def _method_rng_state(self) -> dict:
        return {}

    def _set_method_rng_state(self, state: dict) -> None:
        pass

    def _method_rng_file(self, folder: str) -> str:
        return os.path.join(folder, f"trl_credit_rng_state_{self.args.process_index}.json")

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        state = self._method_rng_state()
        if state:
            with open(self._method_rng_file(output_dir), "w", encoding="utf-8") as f:
                json.dump(state, f)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)
        if checkpoint is None or not self._method_rng_state():
            return
        path = self._method_rng_file(checkpoint)
        if not os.path.isfile(path):
            warn_once(
                self,
                "method_rng_state",
                f"{type(self).__name__}: the checkpoint has no {os.path.basename(path)} (saved by an older trl_credit "
                "or with fewer processes): the method's random state starts afresh, so the resumed run does not "
                "repeat the draws of an uninterrupted one.",
            )
            return
        with open(path, encoding="utf-8") as f:
            self._set_method_rng_state(json.load(f))
def refuse_empty_completions(trainer, completion_ids: Sequence[Sequence[int]], source: str) -> None:
    """Raise a clear error for completions of 0 tokens, which TRL 1.16's GRPOTrainer cannot train on: its
    ``_generate`` reads the last token of every completion (an IndexError on an empty one)."""
    empty = [row for row, ids in enumerate(completion_ids) if len(ids) == 0]
    if empty:
        raise ValueError(
            f"{type(trainer).__name__}: {source} returned an empty completion (0 tokens) for {len(empty)} of "
            f"{len(completion_ids)} rows (first: row {empty[0]}). GRPOTrainer cannot train on one either (TRL reads "
            "each completion's last token). HF generate, continuous batching and vLLM return the EOS token when the "
            "model stops at once; a custom generation or rollout_func must return it too."
        )


class EmptyCompletionCheckMixin:
    """Trainer mixin: the completions TRL's ``_generate`` receives (from ``_generate_single_turn``, a subclass's
    included, or from a ``rollout_func``) are checked by :func:`refuse_empty_completions` before TRL reads them.
    Generation calls made through :func:`generate_from_prefixes` inside it (SRPO's seeds, localization, suffixes)
    are not: a method handles those itself."""

    def _generate(self, prompts):
        own = {name: self.__dict__[name] for name in ("_generate_single_turn", "rollout_func") if name in self.__dict__}
        generate_single_turn, rollout_func = self._generate_single_turn, self.rollout_func

        def checked_generate_single_turn(*args, **kwargs):
            completion_ids, logprobs = generate_single_turn(*args, **kwargs)
            if not getattr(self, "_in_extra_generation", False):
                refuse_empty_completions(self, completion_ids, "the generation (_generate_single_turn)")
            return completion_ids, logprobs

        def checked_rollout_func(prompts, trainer):
            output = rollout_func(prompts, trainer)
            refuse_empty_completions(self, output["completion_ids"], "the rollout_func")
            return output

        self._generate_single_turn = checked_generate_single_turn
        if rollout_func is not None:
            self.rollout_func = checked_rollout_func
        try:
            return super()._generate(prompts)
        finally:
            for name in ("_generate_single_turn", "rollout_func"):
                if name in own:
                    setattr(self, name, own[name])
                else:
                    self.__dict__.pop(name, None)


# glibc's M_MMAP_THRESHOLD (malloc.h); see `return_freed_buffers`.
_M_MMAP_THRESHOLD = -3
_CPU_MMAP_THRESHOLD = 128 * 1024


def return_freed_buffers() -> bool:
    """glibc only (Linux): allocations of 128 KiB and more get their own memory mapping, returned to the OS as soon as
    they are freed. Returns whether the setting was made.

    By default glibc raises that threshold as large blocks are freed (up to 32 MB), so the activations of a CPU
    forward/backward (tens of MB each, freed and reallocated in different sizes around the tensors autograd keeps)
    come from the heap, which fragments and never shrinks: in the README's SRPO job the process held ~2.9 GB after a
    forward that kept 0.3 GB. A process-wide setting; left alone when the user set ``MALLOC_MMAP_THRESHOLD_``
    (any value) or the C library is not glibc.
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, _CPU_MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


class CPUMemoryMixin:
    """Trainer mixin: training on the CPU, large buffers go back to the OS when freed (:func:`return_freed_buffers`)
    and TRL's log-prob passes use small vocabulary tiles
    (:func:`trl_credit.trl_compat.small_logprob_tiles`, for the whole training step: generation-phase passes and the
    loss); both change no numbers. With them the README's SRPO job peaks at about a third of the memory
    (docs/design.md#memory-on-the-cpu)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.accelerator.device.type == "cpu":
            return_freed_buffers()

    def training_step(self, model, inputs, num_items_in_batch):
        with small_logprob_tiles(self.accelerator.device):
            return super().training_step(model, inputs, num_items_in_batch)


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

    @staticmethod
    def available(trainer) -> bool:
        """Whether the trainer's generation runs HF ``generate`` (the only path a forward hook sees step by step)."""
        return not getattr(trainer, "use_vllm", False) and not getattr(
            trainer, "use_transformers_continuous_batching", False
        )

    @contextlib.contextmanager
    def attached(self, trainer) -> Iterator["GenerationRecorder"]:
        """The hook on the trainer's causal LM (the PEFT base model, whose forward ``generate`` calls) while inside."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        handle = model.register_forward_hook(self, with_kwargs=True)
        try:
            yield self
        finally:
            handle.remove()

    def __call__(self, module, args, kwargs, output):
        if _IN_SHARED_PREFILL:
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
