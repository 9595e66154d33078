"""The oracle context of OPPO (docs/oppo.md#oracle-prompt, docs/oppo.md#scorer, paper §3.2 "Oracle Conditioning", App. I.2).

:func:`build_oracle_prompt` is pure: it appends the ground-truth answer y* to a prompt. :func:`score_evidence`
is glue over the batch's context (:class:`~trl_credit.core.context.BatchContext`): it scores the sampled completion
tokens under the oracle prompts (o_t) and, when needed, under the plain prompts (s_t), in one batched no-grad pass
through TRL's own log-prob code. :func:`add_float32_head` and
:func:`float32_head` run the LM head of those log-probs in float32 (docs/oppo.md#evidence).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from trl_credit.trl_bridge.compat import HAS_FUSED_LM_HEAD, TRL_VERSION, add_fused_lm_head

__all__ = [
    "DEFAULT_ORACLE_TEMPLATE",
    "build_oracle_prompt",
    "build_oracle_prompts",
    "score_evidence",
    "add_float32_head",
    "add_float32_teacher_head",
    "float32_head",
]

_FLOAT32_HEAD = "_oppo_float32_head"  # flag on the causal LM while `float32_head` is active

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
    ctx,
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
    temperature and chunking as TRL's own old/ref log-prob passes) via the context's ``logprobs``
    (``trl_credit.core.scoring.score_completions``); ``ctx``: the batch's :class:`~trl_credit.core.context.BatchContext`.

    With ``student_logps`` given (self-oracle: TRL's ``old_per_token_logps``, the log-probs recorded during
    generation or vLLM's) only the B oracle rows are scored; otherwise the B oracle rows and the B plain rows are stacked into one batch of 2B rows and scored in the
    same call, so OPPO costs one extra pass call either way.
    """
    from trl_credit.trl_bridge.compat import pad

    plain_rows = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
    rows = [list(map(int, ids)) for ids in oracle_prompt_ids]
    if len(rows) != completion_ids.size(0):
        raise ValueError(f"score_evidence: {len(rows)} oracle prompts for {completion_ids.size(0)} completions.")
    if student_logps is None:
        rows = rows + plain_rows
        completion_ids = torch.cat([completion_ids, completion_ids], dim=0)
        completion_mask = torch.cat([completion_mask, completion_mask], dim=0)
    device = completion_ids.device
    pad_to = ctx.sampling.pad_to_multiple_of
    stacked_ids = pad(
        [torch.tensor(r, dtype=torch.long) for r in rows],
        padding_value=ctx.tokenizer.pad_token_id,
        padding_side="left",
        pad_to_multiple_of=pad_to,
    ).to(device)
    stacked_mask = pad(
        [torch.ones(len(r), dtype=torch.long) for r in rows], padding_value=0, padding_side="left", pad_to_multiple_of=pad_to
    ).to(device)
    logps, _ = ctx.logprobs(stacked_ids, stacked_mask, completion_ids, completion_mask, model=model,
                            batch_size=batch_size)
    num_rows = len(oracle_prompt_ids)
    oracle_logps = logps[:num_rows]
    if student_logps is None:
        student_logps = logps[num_rows:]
    return oracle_logps, student_logps


# The evidence log λ_t = o_t − s_t is a small difference of two log-probs (|log λ| ~ 0.15 on SmolLM2). Under TRL's
# bf16 autocast the LM head's logits are rounded to bf16 (~0.1 at |logit| ~ 20), an error as large as the evidence.
# Both log-prob sets therefore come from a float32 head: logits and log-softmax in float32, outside autocast. The
# transformer body keeps the training precision (a float32 body would make the extra pass several times slower).
# trl>=1.15 computes log-probs in a fused LM head patched into the model's forward (`add_fused_lm_head`); trl 1.14.2
# computes them from `model(...).logits`, so there the head module itself is made float32 (same logits, same
# float32 log-softmax), which needs a plain nn.Linear head.
def add_float32_head(model, temperature: float) -> None:
    """Give ``model``, already patched by TRL's ``add_fused_lm_head``, a second fused log-prob forward with TRL's
    float32 head (``cast_lm_head_to_fp32=True``), taken by fused calls (``fused_lm_head=True``) while
    :func:`float32_head` is active; otherwise TRL's own forward runs unchanged. Call before the model is wrapped.
    On trl<1.15 TRL's passes call the plain forward, which :func:`float32_head` makes float32: nothing to add."""
    if not HAS_FUSED_LM_HEAD:
        _plain_head(model, "OPPO's self-oracle")
        return
    trl_forward = model.forward
    add_fused_lm_head(model, temperature=temperature, cast_lm_head_to_fp32=True)
    float32_forward = model.forward

    @functools.wraps(type(model).forward)
    def forward(self, *args, **kwargs):
        use_float32 = getattr(self, _FLOAT32_HEAD, False) and kwargs.get("fused_lm_head", False)
        return (float32_forward if use_float32 else trl_forward)(*args, **kwargs)

    model.forward = types.MethodType(forward, model)


def add_float32_teacher_head(teacher, temperature: float) -> None:
    """The teacher's log-probs always come from a float32 head: TRL's fused head with ``cast_lm_head_to_fp32`` on
    trl>=1.15, its ``nn.Linear`` head's forward in float32 outside autocast before (``temperature`` is applied by
    TRL's log-prob pass there)."""
    if HAS_FUSED_LM_HEAD:
        add_fused_lm_head(teacher, temperature=temperature, cast_lm_head_to_fp32=True)
        return
    head = _plain_head(teacher, "OPPO's teacher")
    head.forward = _float32_forward(head)


def _plain_head(model, who: str) -> torch.nn.Linear:
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear:
        raise ValueError(
            f"{who} scores the evidence with a float32 LM head; with trl {TRL_VERSION} (no fused LM head before "
            f"1.15) that needs a plain torch.nn.Linear head, but it is a {type(head).__name__}. Upgrade to trl>=1.15."
        )
    return head


def _float32_forward(head):
    """``head``'s forward with float32 logits, outside autocast."""

    def forward(hidden):
        weight, bias = head.weight, head.bias
        if hasattr(weight, "full_tensor"):  # an FSDP2-sharded DTensor, gathered as TRL's fused head does
            weight, bias = weight.full_tensor(), None if bias is None else bias.full_tensor()
        with torch.autocast(hidden.device.type, enabled=False):
            bias = None if bias is None else bias.float()
            return torch.nn.functional.linear(hidden.float(), weight.float(), bias)

    return forward


@contextlib.contextmanager
def float32_head(model) -> Iterator[bool]:
    """While inside, ``model``'s LM head computes in float32 outside autocast: its fused log-prob forward (see
    :func:`add_float32_head`) and its plain forward, as ``generate`` calls it, when the head is a plain ``nn.Linear``.
    Yields whether the plain forward is float32 (False for a head wrapped by e.g. a PEFT adapter)."""
    head = model.get_output_embeddings()
    plain = type(head) is torch.nn.Linear
    previous = head.__dict__.get("forward") if plain else None  # e.g. TRL's cast_lm_head_to_fp32 forward

    setattr(model, _FLOAT32_HEAD, True)
    if plain:
        head.forward = _float32_forward(head)
    try:
        yield plain
    finally:
        setattr(model, _FLOAT32_HEAD, False)
        if plain:
            if previous is None:
                del head.forward
            else:
                head.forward = previous
