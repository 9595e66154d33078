"""The oracle context of OPPO (docs/oppo.md#oracle-prompt, docs/oppo.md#scorer, paper §3.2 "Oracle Conditioning", App. I.2).

:func:`build_oracle_prompt` is pure: it appends the ground-truth answer y* to a prompt. :func:`score_evidence`
is trainer glue: it scores the sampled completion tokens under the oracle prompts (o_t) and, when needed, under the
plain prompts (s_t), in one batched no-grad pass through TRL's own log-prob code.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "DEFAULT_ORACLE_TEMPLATE",
    "build_oracle_prompt",
    "build_oracle_prompts",
    "score_evidence",
]

#: docs/oppo.md#oracle-prompt: appended to the last user message (to the text, for plain-text prompts).
DEFAULT_ORACLE_TEMPLATE = "\n\nThe correct final answer is {answer}."


def build_oracle_prompt(prompt: str | list[dict[str, Any]], answer: Any, template: str = DEFAULT_ORACLE_TEMPLATE):
    """The prompt x with y* appended: x ⊕ template.format(answer=y*) (docs/oppo.md#oracle-prompt).

    Conversational prompts (a list of ``{"role", "content"}`` messages): the text goes at the end of the *last user
    message*; later messages (e.g. an assistant prefill) are kept as they are. Content given as a list of parts gets
    one more ``{"type": "text"}`` part. Plain-text prompts: the text is appended to the prompt string. The input
    is not modified.
    """
    addition = template.format(answer=answer)
    if isinstance(prompt, str):
        return prompt + addition
    if not isinstance(prompt, list) or not all(isinstance(m, dict) and "role" in m for m in prompt):
        raise ValueError(
            "OPPO oracle prompt: `prompt` must be a string or a list of chat messages with a 'role' key, "
            f"got {type(prompt).__name__}."
        )
    user_positions = [i for i, message in enumerate(prompt) if message["role"] == "user"]
    if not user_positions:
        raise ValueError("OPPO oracle prompt: the chat prompt has no 'user' message to append the answer to.")
    oracle = copy.deepcopy(prompt)
    last_user = oracle[user_positions[-1]]
    content = last_user.get("content")
    if isinstance(content, str):
        last_user["content"] = content + addition
    elif isinstance(content, list):
        last_user["content"] = content + [{"type": "text", "text": addition}]
    else:
        raise ValueError(
            f"OPPO oracle prompt: the last user message's content must be a string or a list of parts, got "
            f"{type(content).__name__}."
        )
    return oracle


def build_oracle_prompts(prompts: Sequence, answers: Sequence, template: str = DEFAULT_ORACLE_TEMPLATE) -> list:
    if len(prompts) != len(answers):
        raise ValueError(f"build_oracle_prompts: {len(prompts)} prompts but {len(answers)} answers.")
    return [build_oracle_prompt(p, a, template) for p, a in zip(prompts, answers)]


def score_evidence(
    trainer,
    model,
    oracle_prompt_ids: Sequence[Sequence[int]],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    student_logps: torch.Tensor | None = None,
    batch_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o_t, s_t), each (B, T): log-probs of the sampled completion tokens under ``model`` with the oracle prompts
    and with the plain prompts (docs/oppo.md#oracle-prompt), scored by TRL's ``_get_per_token_logps_and_entropies`` (no grad, same
    temperature and chunking as TRL's own old/ref log-prob passes) via ``trl_credit._trl.score_completions``.

    With ``student_logps`` given (self-oracle: TRL's ``old_per_token_logps``, the log-probs recorded during
    generation or vLLM's) only the B oracle rows are scored; otherwise the B oracle rows and the B plain rows are stacked into one batch of 2B rows and scored in the
    same call, so OPPO costs one extra pass call either way.
    """
    from trl.trainer.utils import pad

    from trl_credit._trl import score_completions

    plain_rows = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
    rows = [list(map(int, ids)) for ids in oracle_prompt_ids]
    if len(rows) != completion_ids.size(0):
        raise ValueError(f"score_evidence: {len(rows)} oracle prompts for {completion_ids.size(0)} completions.")
    if student_logps is None:
        rows = rows + plain_rows
        completion_ids = torch.cat([completion_ids, completion_ids], dim=0)
        completion_mask = torch.cat([completion_mask, completion_mask], dim=0)
    device = completion_ids.device
    pad_to = getattr(trainer, "pad_to_multiple_of", None)
    stacked_ids = pad(
        [torch.tensor(r, dtype=torch.long) for r in rows],
        padding_value=trainer._tokenizer.pad_token_id,
        padding_side="left",
        pad_to_multiple_of=pad_to,
    ).to(device)
    stacked_mask = pad(
        [torch.ones(len(r), dtype=torch.long) for r in rows], padding_value=0, padding_side="left", pad_to_multiple_of=pad_to
    ).to(device)
    logps, _ = score_completions(
        trainer, model, stacked_ids, stacked_mask, completion_ids, completion_mask, batch_size=batch_size
    )
    num_rows = len(oracle_prompt_ids)
    oracle_logps = logps[:num_rows]
    if student_logps is None:
        student_logps = logps[num_rows:]
    return oracle_logps, student_logps
