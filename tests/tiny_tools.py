"""The tiny tool-calling model for fast multi-turn trainer tests, and the scripted generation TRL's own tool tests use.

The model and tokenizer come from :mod:`trl_credit.testbed.tool_model` (a random 2-layer Qwen3 with TRL's qwen3
chat template, built offline in about a second). A random model almost never writes a valid tool call, so TRL's tests
(tests/test_grpo_trainer.py: ``test_train_with_tools``, ``test_train_with_environment_factory``, ...) replace
``trainer.model.generate`` with a function returning fixed token ids: the first turn of row ``i`` of a generation
batch is the ``i``-th scripted completion, a turn after a tool response is ``'Done!<|im_end|>'``.
:class:`ScriptedGeneration` does the same from text (encoded with the tiny tokenizer instead of Qwen's token ids),
deciding per row from what the row holds, so that it also answers generations our trainers add (a continuation from
a reset point or a fork inside a turn): those get :attr:`ScriptedGeneration.continuation`.
"""

from __future__ import annotations

from trl_credit.testbed.tool_model import build_tool_model

__all__ = ["build_tiny_tool_model", "ScriptedGeneration", "TOOL_RESPONSE_END", "ASSISTANT_START"]

#: How a tool-result turn ends and the next assistant turn starts in the qwen3 template (and its training variant).
TOOL_RESPONSE_END = "</tool_response><|im_end|>\n"
ASSISTANT_START = "<|im_start|>assistant\n"


def build_tiny_tool_model(save_dir: str, seed: int = 0) -> str:
    """Save the tiny tool-calling model (random Qwen3, Qwen-format tokenizer, TRL's qwen3 template) to ``save_dir``."""
    return build_tool_model(save_dir, seed=seed)


class ScriptedGeneration:
    """A stand-in for ``model.generate`` (``patch.object(trainer.model, "generate", side_effect=...)``), as in TRL's
    tool tests. Per row of the batch, from the row's text (padding removed):

    - a first assistant turn (the row ends with the generation prompt and no tool response precedes it): the
      ``first_turns[i % len(first_turns)]`` completion, ``i`` the row's position in the batch (TRL's tests: row ``i``
      of the 3-row batch gets the ``i``-th fixed completion);
    - a turn right after a tool response: ``after_tool`` (TRL's tests: ``'Done!<|im_end|>'``);
    - anything else (the row already holds part of an assistant turn: a continuation our trainers generate from a
      reset point or a fork): ``continuation``.

    Every call is recorded in :attr:`calls` as the list of (kind, row text) it answered.
    """

    def __init__(self, tokenizer, first_turns: list[str], after_tool: str = "Done!<|im_end|>",
                 continuation: str = "Done!<|im_end|>"):
        self.tokenizer = tokenizer
        self.first_turns = list(first_turns)
        self.after_tool = after_tool
        self.continuation = continuation
        self.calls: list[list[tuple[str, str]]] = []

    def kind_of(self, text: str) -> str:
        head, found, tail = text.rpartition(ASSISTANT_START)
        if not found or tail.strip() not in ("", "<think>\n\n</think>"):  # enable_thinking=False adds an empty think
            return "continuation"
        return "after_tool" if head.endswith(TOOL_RESPONSE_END) else "first_turn"

    def completion_text(self, kind: str, row: int) -> str:
        if kind == "first_turn":
            return self.first_turns[row % len(self.first_turns)]
        return self.after_tool if kind == "after_tool" else self.continuation

    def __call__(self, input_ids=None, attention_mask=None, **kwargs):
        import torch

        pad = self.tokenizer.pad_token_id
        answered, completions = [], []
        for row, ids in enumerate(input_ids):
            kept = ids if attention_mask is None else ids[attention_mask[row].bool()]
            text = self.tokenizer.decode(kept.tolist(), skip_special_tokens=False)
            kind = self.kind_of(text)
            answered.append((kind, text))
            completions.append(self.tokenizer.encode(self.completion_text(kind, row), add_special_tokens=False))
        self.calls.append(answered)
        width = max(len(c) for c in completions)
        padded = torch.tensor([c + [pad] * (width - len(c)) for c in completions], device=input_ids.device)
        return torch.cat([input_ids, padded], dim=-1)
