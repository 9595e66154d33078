"""Prompts of SRPO/RRPO (paper Appendix D) and parsing of the self-localization answer (docs/srpo.md#thoughts, docs/srpo.md#reset-index).

Templates use literal placeholders substituted with ``str.replace`` (not ``str.format``), so the paper's own
braces (``\\boxed{answer}``) need no escaping:

- rollout template: ``{question}``;
- localization template: ``{question}``, ``{steps}`` (the chain rendered ``Step 1: ...`` one per line) and
  ``{num_steps}``.

The markdown copy of the paper lost the ``\\boxed{...}`` macros of Appendix D ("include answer", "end with N");
they are restored here from the surrounding text ("Picks come back as \\boxed{N}", "sampling continues until the
model emits \\boxed{answer}").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from trl_credit.tasks.rewards import extract_boxed

__all__ = [
    "THOUGHT_MDP_ROLLOUT_TEMPLATE",
    "LINES_ROLLOUT_TEMPLATE",
    "ROLLOUT_TEMPLATES",
    "LOCALIZATION_TEMPLATE",
    "resolve_rollout_template",
    "question_of",
    "wrap_prompt",
    "render_steps",
    "localization_prompt",
    "parse_reset_step",
    "stop_strings",
    "check_prompt_format",
]

#: Appendix D, "Thought-MDP rollout": wraps every question; each thought ends with ``</thought>``.
THOUGHT_MDP_ROLLOUT_TEMPLATE = (
    "You are solving a problem by producing one reasoning step at a time. Do not try to solve the entire problem "
    "at once. Given the previously taken steps, think about what the single next step should be, then articulate "
    "it clearly and conclude just that step with </thought>. Each step should be a complete, self-contained "
    "thought -- one observation, calculation, or deduction that:\n"
    "- Makes forward progress toward the solution\n"
    '- Contains substantive reasoning (not filler like "let me think" or restating the problem)\n'
    "- Coheres logically with the previous steps\n"
    "When your next step arrives at the final answer, include \\boxed{answer} and end with </thought>.\n\n"
    "Q: {question}"
)

#: For small models that do not write ``</thought>`` reliably: one step per line, used with ``thought_delimiter="\n"``.
LINES_ROLLOUT_TEMPLATE = (
    "Solve the problem one reasoning step at a time. Write each step on its own line: one observation, "
    "calculation, or deduction per line. Put the final answer in \\boxed{answer}.\n\n"
    "Q: {question}"
)

#: Named presets accepted by ``SRPOConfig.rollout_template``; ``"none"`` leaves the dataset prompts unchanged.
ROLLOUT_TEMPLATES = {"thought_mdp": THOUGHT_MDP_ROLLOUT_TEMPLATE, "lines": LINES_ROLLOUT_TEMPLATE, "none": None}

#: Appendix D, "L2 self-localization".
LOCALIZATION_TEMPLATE = (
    "You are tasked with localizing the first erroneous thought in your previous solution to this problem.\n\n"
    "Problem: {question}\n\n"
    "Your incorrect reasoning chain:\n"
    "{steps}\n\n"
    "The final answer this chain produces is incorrect -- therefore at least one step contains an error. The "
    "error you are looking for is the originating step where a key decision or action derailed the reasoning, "
    "not just the step where the failure ultimately becomes visible. A misread of the problem, an unjustified "
    "assumption, or a logical flaw can look fine for several follow-on steps before it surfaces in the wrong "
    "answer. A step is erroneous if you cannot justify its claims from the problem statement and earlier "
    "verified steps alone. Find the originating step, not just the symptom.\n\n"
    "Do NOT re-solve the problem. Your ONLY task is to identify the step number of that originating error.\n\n"
    "Requirements:\n"
    "- Commit to exactly ONE step number (1 to {num_steps}).\n"
    "- Stop at the first step you cannot justify.\n"
    "- MANDATORY final line: your response MUST end with \\boxed{N} on its own line, where N is the step index "
    "(1-indexed) of the first erroneous step in the chain above -- NOT the answer to the problem. Do NOT add any "
    "text after the \\boxed{N}."
)


def resolve_rollout_template(template: str | None) -> str | None:
    """A preset name (``thought_mdp``, ``lines``, ``none``) or a custom template containing ``{question}``;
    returns the template text (None: leave prompts unchanged)."""
    if template is None or template in ROLLOUT_TEMPLATES:
        return ROLLOUT_TEMPLATES.get(template) if template is not None else None
    if "{question}" not in template:
        raise ValueError(
            f"rollout_template must be one of {sorted(ROLLOUT_TEMPLATES)} or a template containing '{{question}}', "
            f"got {template[:80]!r}."
        )
    return template


def question_of(prompt: Any, who: str = "SRPOTrainer") -> str:
    """The question of a dataset prompt: the last user message of a chat prompt, or the whole text prompt. ``who``
    names the trainer (and part) in the errors (``trainer_setup.speaker``)."""
    if isinstance(prompt, str):
        return prompt
    for message in reversed(list(prompt)):
        if message.get("role") == "user":
            content = message.get("content")
            if not isinstance(content, str):
                raise ValueError(
                    f"{who} needs text prompts: the last user message must have string content (multimodal "
                    f"content blocks are not supported), got {type(content).__name__}."
                )
            return content
    raise ValueError(f"{who} needs a user message in every conversational prompt; found none.")


def wrap_prompt(prompt: Any, template: str | None, who: str = "SRPOTrainer") -> Any:
    """The thought-MDP rollout prompt (Appendix D): the question substituted into ``template``.

    Chat prompts keep every message; only the last user message's content is replaced. ``template=None`` returns
    the prompt unchanged.
    """
    if template is None:
        return prompt
    if isinstance(prompt, str):
        return template.replace("{question}", prompt)
    messages = [dict(message) for message in prompt]
    for message in reversed(messages):
        if message.get("role") == "user":
            message["content"] = template.replace("{question}", question_of([message], who))
            return messages
    raise ValueError(f"{who} needs a user message in every conversational prompt; found none.")


def render_steps(thoughts: Sequence[str]) -> str:
    """``Step 1: ...`` / ``Step 2: ...``, one per line (Appendix D)."""
    return "\n".join(f"Step {index}: {text}" for index, text in enumerate(thoughts, start=1))


def localization_prompt(question: str, thoughts: Sequence[str], template: str = LOCALIZATION_TEMPLATE) -> str:
    """Self-localization prompt for a failed seed with ``len(thoughts)`` thoughts (Appendix D, docs/srpo.md#reset-index)."""
    return (
        template.replace("{question}", question)
        .replace("{steps}", render_steps(thoughts))
        .replace("{num_steps}", str(len(thoughts)))
    )


_BOXED_INTEGER = re.compile(r"^\s*\$?\s*(?:step\s*)?(-?\d+)\s*\$?\s*\.?\s*$", re.IGNORECASE)


def parse_reset_step(text: str, num_steps: int, ended_with_eos: bool = False) -> int | None:
    """The 1-indexed step a localization answer names, or None (unparsed: the trainer then resets at random).

    Parsed only in the form the prompt asks for (Appendix D): the last ``\\boxed{...}`` holds an integer
    (``\\boxed{3}``; ``\\boxed{ 3 }``, ``\\boxed{Step 3}`` and ``\\boxed{$3$}`` read the same), or - only when the
    generation ended with EOS (``ended_with_eos``) - the whole answer is a bare integer (``3``, ``Step 3.``). A
    number in prose ("... wrong because 2") or an answer cut at the token cap is not a pick. A number outside
    ``[1, num_steps]`` or a non-integer box is None.
    """
    if num_steps < 1 or not isinstance(text, str):
        return None
    boxed = extract_boxed(text)
    if boxed is not None:
        match = _BOXED_INTEGER.match(boxed)
    elif ended_with_eos:
        match = _BOXED_INTEGER.match(text)
    else:
        match = None
    if match is None:
        return None
    step = int(match.group(1))
    return step if 1 <= step <= num_steps else None


def stop_strings(max_steps: int) -> list[str]:
    """Strings that end a localization answer as soon as it names a step: ``\\boxed{1}`` .. ``\\boxed{max_steps}``."""
    return [f"\\boxed{{{step}}}" for step in range(1, max(1, int(max_steps)) + 1)]


def check_prompt_format(dataset, template: str | None, who: str = "SRPOTrainer", environments: bool = False) -> None:
    """Fail at construction, not mid-training, on prompts SRPO cannot wrap or localize (first row checked); ``who``
    names the trainer (and part) in the errors. ``environments``: an ``environment_factory`` may own the data (TRL
    then generates from an empty user message with the environment's ``reset()`` observation), so the ``prompt``
    column is optional."""
    if dataset is None or not hasattr(dataset, "column_names") or isinstance(dataset, dict):
        return
    if dataset.column_names is None:  # an IterableDataset with unknown features: checked at the first batch
        return
    if "prompt" not in dataset.column_names:
        if environments:
            return
        raise ValueError(f"{who} needs a `prompt` column in train_dataset (chat messages or text).")
    images = [name for name in ("image", "images") if name in dataset.column_names]
    if images:
        raise ValueError(
            f"{who} needs text-only prompts, but train_dataset has an {images[0]!r} column: its seeds, "
            "self-localization prompts and reset states are built from text, so images would be dropped. Remove "
            "the column or train this dataset with GRPOTrainer."
        )
    if not hasattr(dataset, "__len__") or len(dataset) == 0:  # streaming datasets: not read ahead of training
        return
    first = dataset[0]
    question_of(first["prompt"], who)  # raises a clear error on non-text or user-less prompts
    wrap_prompt(first["prompt"], template, who)
