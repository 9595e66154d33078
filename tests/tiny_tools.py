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
        config = kwargs.get("generation_config")
        cap = getattr(config, "max_new_tokens", None)
        if cap is not None:  # as generate: at most max_new_tokens new tokens per row
            completions = [c[:cap] for c in completions]
        width = max(len(c) for c in completions)
        padded = torch.tensor([c + [pad] * (width - len(c)) for c in completions], device=input_ids.device)
        sequences = torch.cat([input_ids, padded], dim=-1)
        if getattr(config, "return_dict_in_generate", False):  # (DATPO's branch calls, generation.hooks)
            from types import SimpleNamespace

            return SimpleNamespace(sequences=sequences)
        return sequences


# ---------------------------------------------------------------------------------------------------- a model that calls
# The engine tests (vLLM colocate, DeepSpeed) generate with the engine itself, so no script can stand in for the
# model: there the tiny tool model is warm-started (trl_credit.testbed.tool_model.warm_start_tool_calls) to call one
# tool, ``multiply``, on "What is A times B?" prompts, then answer with the product.
MULTIPLY_QUESTION = "What is {a} times {b}? Use the tool."


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


class MultiplyEnvironment:
    """``multiply`` as an ``environment_factory`` environment (one per rollout): the same tool, the same schema, and
    the process credit's turn rewards (docs/multiturn.md#turn-rewards): a call is right when it multiplies the
    row's two numbers; the closing answer turn is left to the outcome (None)."""

    def reset(self, a: int, b: int, **row) -> None:
        self.factors = sorted((a, b))
        self.calls = []
        self.turn_rewards = [None]

    def multiply(self, a: int, b: int) -> int:
        """
        Multiplies two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The product of the two integers.
        """
        self.calls.append((a, b))
        self.turn_rewards.insert(-1, float(sorted((a, b)) == self.factors))
        return a * b


def multiply_dataset(num_rows: int, seed: int = 0):
    """Conversational prompts ``What is A times B? Use the tool.`` (A, B from 2 to 9) with the ``answer`` column
    (OPPO's oracle reads it) and the factors ``a``, ``b`` (an environment's ``reset`` receives them)."""
    import random

    from datasets import Dataset

    rng = random.Random(seed)
    pairs = [(rng.randint(2, 9), rng.randint(2, 9)) for _ in range(num_rows)]
    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": MULTIPLY_QUESTION.format(a=a, b=b)}] for a, b in pairs],
        "answer": [str(a * b) for a, b in pairs], "a": [a for a, _ in pairs], "b": [b for _, b in pairs],
    })


def multiply_episodes(num_episodes: int, seed: int = 0) -> list[dict]:
    """Warm-start conversations: the question, a ``multiply`` call with its two numbers, the tool's result, and the
    answer (a third of them answer a wrong number, so an outcome reward has something to tell apart)."""
    rows = multiply_dataset(num_episodes, seed)
    episodes = []
    for i, row in enumerate(rows):
        product = row["a"] * row["b"]
        call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": row["a"], "b": row["b"]}}}
        answer = product + 1 if i % 3 == 2 else product
        episodes.append({"messages": [
            *row["prompt"],
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "multiply", "content": str(product)},
            {"role": "assistant", "content": f"The answer is {answer}."},
        ], "tools": [multiply]})
    return episodes


def build_tool_calling_model(save_dir: str, head_dim: int = 8, steps: int = 150, seed: int = 0) -> str:
    """The tiny tool model (hidden size 64) warm-started on :func:`multiply_episodes` so that it calls ``multiply``
    when sampled (``head_dim=32`` for vLLM's CPU attention). Deterministic (one thread, seeded)."""
    from trl_credit.testbed.tool_model import warm_start_tool_calls

    build_tool_model(save_dir, seed=seed, hidden_size=64, head_dim=head_dim)
    warm_start_tool_calls(save_dir, multiply_episodes(64, seed), steps=steps, batch_size=8, seed=seed)
    return save_dir
