"""Sampling for evaluation: a model and its tokenizer, and n sampled completions per prompt (part 1 of
:mod:`trl_credit.evaluation.evaluate`'s pipeline; re-exported there).

Chat prompts are rendered as TRL's trainers render them at training time (the tokenizer's chat template with the
generation prompt, no extra special tokens), so an evaluation sees the token sequence the policy trained on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["EVAL_TEMPERATURE", "EVAL_MAX_NEW_TOKENS", "load_model_and_tokenizer", "render_prompt",
           "sample_completions"]

#: Default sampling of an evaluation: the setting of the README's base-accuracy table (``benchmarks/learning/base_accuracy.py``,
#: :mod:`trl_credit.tasks.data`: temperature 0.7, top-p 1.0, 64 new tokens), so default numbers are comparable with it.
EVAL_TEMPERATURE = 0.7
EVAL_MAX_NEW_TOKENS = 64


def load_model_and_tokenizer(
    model_name_or_path: str | None = None, adapter: str | None = None, dtype: str = "auto", device: str | None = None
):
    """Load a causal LM (path or Hub id; None/``"smollm2-135m-instruct-offline"`` = the offline SmolLM2) and its
    tokenizer, with an optional PEFT/LoRA adapter merged in. Without a model, an adapter's recorded base model
    (``adapter_config.json``) is used; ``HuggingFaceTB/SmolLM2-135M-Instruct`` resolves to the offline copy. The
    tokenizer comes from the adapter folder when it has one (TRL saves it there), else from the model. Padding is
    set to the left for batched generation.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_credit.models import resolve_model_path

    if model_name_or_path is None and adapter and os.path.exists(os.path.join(adapter, "adapter_config.json")):
        with open(os.path.join(adapter, "adapter_config.json")) as handle:
            model_name_or_path = json.load(handle).get("base_model_name_or_path")
    path = resolve_model_path(model_name_or_path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    tokenizer_source = path
    if adapter:
        from peft import PeftModel

        from trl_credit.trl_bridge.compat import hidden_library_deprecations

        with hidden_library_deprecations():  # PEFT calls the renamed `is_gradient_checkpointing`
            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        if os.path.exists(os.path.join(adapter, "tokenizer_config.json")):
            tokenizer_source = adapter
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval()
    return model, tokenizer



def render_prompt(prompt: Any, tokenizer) -> str:
    if isinstance(prompt, str):
        return prompt  # plain-text prompt, used as is (as TRL does)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the prompts are chat messages but the tokenizer has no chat_template")
    return tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)


def sample_completions(
    model,
    tokenizer,
    prompts: Sequence[Any],
    num_samples: int,
    *,
    batch_size: int = 64,
    temperature: float = EVAL_TEMPERATURE,
    top_p: float = 1.0,
    max_new_tokens: int = EVAL_MAX_NEW_TOKENS,
    seed: int = 0,
    progress: bool = True,
) -> list[list[dict]]:
    """``num_samples`` completions per prompt with batched ``model.generate``; deterministic in ``seed`` on CPU.

    ``prompts`` are chat message lists (rendered with the tokenizer's chat template, generation prompt added)
    or plain strings. ``batch_size`` counts sequences per ``generate`` call. ``temperature=0`` means greedy.
    Returns, per prompt, a list of ``{"text", "num_tokens", "stopped"}`` (``stopped``: ended with EOS before
    ``max_new_tokens``).
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import set_seed

    if num_samples < 1 or batch_size < 1 or max_new_tokens < 1:
        raise ValueError(
            f"num_samples, batch_size and max_new_tokens must be >= 1, got {num_samples}, {batch_size}, "
            f"{max_new_tokens}"
        )
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {temperature}, {top_p}")
    texts = [render_prompt(p, tokenizer) for p in prompts]
    add_special_tokens = not prompts or isinstance(prompts[0], str)  # chat templates already add BOS if any
    jobs = [(p, s) for p in range(len(prompts)) for s in range(num_samples)]
    results: list[list[dict]] = [[] for _ in prompts]
    eos_ids = model.generation_config.eos_token_id
    if eos_ids is None:
        eos_ids = tokenizer.eos_token_id
    eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 else dict(
        do_sample=False, temperature=None, top_p=None, top_k=None
    )
    set_seed(seed)
    tokenizer.padding_side = "left"
    with tqdm(total=len(jobs), desc="sampling", unit="completion", disable=not progress) as bar:
        for start in range(0, len(jobs), batch_size):
            chunk = jobs[start : start + batch_size]
            batch = tokenizer(
                [texts[p] for p, _ in chunk], return_tensors="pt", padding=True, add_special_tokens=add_special_tokens
            ).to(model.device)
            with torch.no_grad():
                output = model.generate(
                    **batch, max_new_tokens=max_new_tokens, pad_token_id=pad_id, **sampling
                )
            generated = output[:, batch["input_ids"].shape[1] :].tolist()
            for (p, _), ids in zip(chunk, generated):
                end = next((i for i, t in enumerate(ids) if t in eos_ids), None)
                kept = ids if end is None else ids[:end]
                results[p].append(
                    {
                        "text": tokenizer.decode(kept, skip_special_tokens=True),
                        "num_tokens": len(kept) + (end is not None),
                        "stopped": end is not None,
                    }
                )
            bar.update(len(chunk))
    return results

