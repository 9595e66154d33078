"""Per-row token budgets on a colocated vLLM engine (HF ``generate``'s are :func:`trl_credit.generation.hooks.hf_generate_hooks`).

TRL builds one ``SamplingParams`` per generation call (``max_tokens`` = the call's cap). vLLM's ``LLM.generate``
also takes one ``SamplingParams`` per prompt, so in colocate mode each row of a call made through
``core.generation.generate_from_prefixes`` (DATPO's branches) gets its own ``max_tokens`` and vLLM stops it there,
instead of generating to the call's cap and having the caller cut the rest. Server mode (TRL's client sends one
``max_tokens`` a call) and tensor parallelism (TRL gathers the rows of the whole tensor-parallel group into one call)
keep the cap and the cut: docs/platforms.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from trl_credit.trl_bridge.vllm_push import vllm_generation

__all__ = ["vllm_row_budgets", "per_row_budgets_reach_vllm"]


def per_row_budgets_reach_vllm(trainer) -> bool:
    """Whether :func:`vllm_row_budgets` can give each row of a call its own ``max_tokens``: vLLM colocate without
    tensor parallelism, where ``llm.generate`` receives exactly this process's rows, in order."""
    vllm = vllm_generation(trainer)
    return (
        vllm is not None
        and getattr(vllm, "mode", None) == "colocate"
        and getattr(vllm, "tensor_parallel_size", 1) == 1
        and getattr(vllm, "llm", None) is not None
    )


@contextlib.contextmanager
def vllm_row_budgets(trainer, row_budgets: list | None) -> Iterator[None]:
    """Inside, a colocated ``llm.generate`` call whose prompts line up with ``row_budgets`` (read at each call, so
    the caller refills it between calls; None entries keep the call's cap) gets one ``SamplingParams`` per row with
    ``max_tokens = min(budget, cap)``. Elsewhere (no budgets, another backend) a no-op. ``llm.generate`` is wrapped on
    the instance for the duration."""
    if row_budgets is None or not per_row_budgets_reach_vllm(trainer):
        yield
        return
    llm = trainer.vllm_generation.llm
    had_own = "generate" in vars(llm)
    saved = vars(llm).get("generate")
    bound = llm.generate

    def generate(prompts, sampling_params=None, *args, **kwargs):
        if sampling_params is not None and not isinstance(sampling_params, (list, tuple)) and len(prompts) == len(
                row_budgets):
            sampling_params = [_capped(sampling_params, budget) for budget in row_budgets]
        return bound(prompts, sampling_params, *args, **kwargs)

    llm.generate = generate
    try:
        yield
    finally:
        if had_own:
            llm.generate = saved
        else:
            del llm.generate


def _capped(sampling_params, budget):
    if budget is None or (sampling_params.max_tokens is not None and budget >= sampling_params.max_tokens):
        return sampling_params
    row = sampling_params.clone()
    row.max_tokens = int(budget)
    return row
