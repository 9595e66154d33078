"""No-grad scoring passes over rows in TRL's layout: :func:`pad_rows` (prompts left-padded, completions
right-padded) and :func:`score_completions` (log-probs and entropies of completion tokens under any prompt, through
``GRPOTrainer._get_per_token_logps_and_entropies``, batched as TRL's own old/ref passes)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trl_credit.trl_bridge.compat import disable_gradient_checkpointing, pad

__all__ = ["pad_rows", "score_completions"]


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
