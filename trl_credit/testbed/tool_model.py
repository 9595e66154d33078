"""A tiny tool-calling model built offline: a random 2-layer ``Qwen3ForCausalLM`` and a Qwen-format tokenizer whose
chat template is TRL's own ``trl/chat_templates/qwen3.jinja``.

TRL's multi-turn GRPO (``tools=``, ``environment_factory=``) needs three things of a tokenizer, and this one has
them as the Qwen3 models TRL's own tests use (``trl-internal-testing/tiny-Qwen3MoeForCausalLM``) do:

- a chat template that :func:`trl.chat_template_utils.add_response_schema` recognizes, so the completions' tool calls
  (``<tool_call>\\n{json}\\n</tool_call>``) are parsed: the template *is* TRL's qwen3 template, byte for byte;
- a template that renders a tool-calling conversation (``supports_tool_calling``), and one TRL can make
  prefix-preserving (the qwen3 template is not: TRL swaps in its ``qwen3_training`` variant, as for a real Qwen3);
- Qwen's special and added tokens as single tokens: ``<|im_start|>``, ``<|im_end|>`` (EOS), ``<|endoftext|>`` (pad),
  ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``.

The tokenizer is a byte-level BPE trained in milliseconds on a small corpus of chat, tool-schema and tool-call text
(any text still encodes, byte by byte; digits one by one, as Qwen's), so a tool call is ~20-40 tokens rather than
hundreds. The weights are random
(seeded): like TRL's tiny test models, the model does not call tools by itself; tests script its generation (TRL's
tests patch ``model.generate``), and :func:`warm_start_tool_calls` teaches it a tool-call transcript in a few seconds
of supervised steps where a run should call tools without a script (``examples/train_agent.py``).

Built in about a second, no download; :func:`tool_model_path` caches the built folder (``TRL_CREDIT_CACHE`` moves the
root), keyed by the build's settings and :data:`BUILD_VERSION`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

__all__ = [
    "SPECIAL_TOKENS",
    "TOOL_TOKENS",
    "TOOL_MODEL",
    "qwen3_chat_template",
    "build_tool_tokenizer",
    "build_tool_model",
    "warm_start_tool_calls",
    "tool_model_path",
]

#: Bump when the build changes in a way its arguments do not show (corpus, vocabulary size, architecture).
BUILD_VERSION = 1
#: The name scripts accept for the tiny tool model (``--model_name_or_path tiny-tool-model``), like
#: :data:`trl_credit.models.DEFAULT_MODEL`.
TOOL_MODEL = "tiny-tool-model"
#: Qwen's special tokens: padding (Qwen's ``<|endoftext|>``), the turn markers; ``<|im_end|>`` is the EOS.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
#: Qwen's added (not special) tokens: they survive ``skip_special_tokens`` decoding, as in Qwen's tokenizer.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

_VOCAB_SIZE = 800
_CORPUS = [
    "You may call one or more functions to assist with the user query.",
    "You are provided with function signatures within <tools></tools> XML tags:",
    'For each function call, return a json object with function name and arguments within XML tags:',
    '{"type": "function", "function": {"name": "multiply_tool", "description": "Multiplies two integers.", '
    '"parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "The first integer."}, '
    '"b": {"type": "integer", "description": "The second integer."}}, "required": ["a", "b"]}, '
    '"return": {"type": "integer", "description": "The product of the two integers."}}}',
    '{"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}',
    '{"name": "increment", "arguments": {"step": 1}}',
    '{"name": "add", "arguments": {"a": 12, "b": 30}}',
    '{"name": "lookup", "arguments": {"key": "apple"}}',
    '{"name": "submit", "arguments": {"answer": 42}}',
    "What is 3 times 4? Use the tool. Done! I don't know any tool. The answer is 12.",
    "Count. Echo. Increment the internal counter. Shout the given text. Returns: The updated counter value.",
    "user assistant system tool string integer number object array description properties required",
    "<|im_start|>system\n# Tools\n<|im_start|>user\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "<tool_response>\nsubmitted\n</tool_response> The value is 25. What is the value of kiwi?",
    "Look it up, then submit it. Look up the value stored under a key. The key to look up. The value found.",
    "Submit the value found, once. A confirmation. The value stored under the key asked for.",
] * 20


def qwen3_chat_template(training: bool = False) -> str:
    """TRL's own Qwen3 chat template (``trl/chat_templates/qwen3.jinja`` of the installed TRL): the exact text
    :func:`trl.chat_template_utils.add_response_schema` compares with. ``training``: its prefix-preserving variant
    with assistant-mask markers (``qwen3_training.jinja``), the one TRL's ``get_training_chat_template`` swaps in for
    multi-turn training (read from the file: trl.chat_template_utils is not one of TRL's public modules)."""
    import trl

    name = "qwen3_training.jinja" if training else "qwen3.jinja"
    return (Path(trl.__file__).parent / "chat_templates" / name).read_text(encoding="utf-8")


def build_tool_tokenizer(save_dir: str | None = None, extra_words: tuple[str, ...] = ()):
    """The Qwen-format byte-level BPE tokenizer (saved to ``save_dir`` when given). ``extra_words``: words a task
    needs as single tokens (the tool regime's keys and answers), added to the BPE corpus often enough to be merged
    whole, with room in the vocabulary for them; without them the tokenizer is the one it always was."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits one by one, as Qwen's pre-tokenizer splits them: a number reads the same in a tool response and in the
    # model's own text (no "25" vs " 25" tokens), so copying a tool's result is token for token.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE + 8 * len(extra_words), special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS + ["\n".join(extra_words)] * 40 if extra_words else _CORPUS, trainer=trainer)
    # Added after training so the BPE merges never split them; normalized=False as in Qwen's tokenizer.json.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>", bos_token=None, unk_token=None
    )
    fast.chat_template = qwen3_chat_template()
    if save_dir is not None:
        fast.save_pretrained(save_dir)
    return fast


def build_tool_model(save_dir: str, seed: int = 0, hidden_size: int = 32, num_layers: int = 2,
                     head_dim: int = 8, extra_words: tuple[str, ...] = ()) -> str:
    """Save a random ``Qwen3ForCausalLM`` (``num_layers`` layers of ``hidden_size``, 4 query and 2 key/value heads of
    ``head_dim`` dimensions, 2048 positions: the tool schema of the system prompt is a few hundred tokens) and the
    tokenizer of :func:`build_tool_tokenizer` (with ``extra_words``) to ``save_dir``; returns the path. vLLM's CPU
    attention refuses heads under 32 dimensions ("Unsupported CPU attention configuration: head_dim=8"): ``head_dim=32``
    for a vLLM run."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    os.makedirs(save_dir, exist_ok=True)
    tokenizer = build_tool_tokenizer(save_dir, extra_words=extra_words)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(save_dir)
    return save_dir


def warm_start_tool_calls(model_dir: str, conversations: list[dict], steps: int = 300, batch_size: int = 16,
                          learning_rate: float = 3e-3, seed: int = 0) -> dict:
    """Teach the model in ``model_dir`` to write the assistant turns of ``conversations`` (each ``{"messages": [...],
    "tools": [...]}``, tool calls included): ``steps`` supervised steps of AdamW, the loss on the assistant tokens
    only, then saved in place. One thread, seeded: deterministic.

    The conversations are rendered with TRL's training variant of the qwen3 template
    (``qwen3_chat_template(training=True)``), the one TRL's tool loop renders tool results with
    (the qwen3 template is not prefix-preserving; TRL swaps it in): its ``{% generation %}`` markers give the
    assistant mask, and every assistant turn starts with an empty ``<think>`` block, as TRL's rollouts then continue.
    Returns the mean loss of the first and the last 10 steps and the number of conversations."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    template = qwen3_chat_template(training=True)
    examples = []
    for conversation in conversations:
        encoded = tokenizer.apply_chat_template(
            conversation["messages"], tools=conversation.get("tools") or None, chat_template=template,
            tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
        )
        labels = [t if m else -100 for t, m in zip(encoded["input_ids"], encoded["assistant_masks"])]
        if all(label == -100 for label in labels):
            raise ValueError("warm_start_tool_calls: a conversation has no assistant turn to learn.")
        examples.append((encoded["input_ids"], labels))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        rng = random.Random(seed)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
        losses = []
        for _ in range(steps):
            batch = [examples[rng.randrange(len(examples))] for _ in range(batch_size)]
            width = max(len(ids) for ids, _ in batch)
            input_ids = torch.tensor([ids + [tokenizer.pad_token_id] * (width - len(ids)) for ids, _ in batch])
            labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
            attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
            loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        model.save_pretrained(model_dir)
    finally:
        torch.set_num_threads(threads)
    window = min(10, len(losses)) or 1
    return {"conversations": len(examples), "steps": steps,
            "first_loss": sum(losses[:window]) / window, "last_loss": sum(losses[-window:]) / window}


def tool_model_path(conversations: list[dict] | None = None, steps: int = 300, batch_size: int = 16, seed: int = 0,
                    hidden_size: int = 64, num_layers: int = 2) -> str:
    """The tiny tool model's folder in the cache (``~/.cache/trl_credit/tiny-tool-model-<digest>``; built on first
    use): random, or warm-started on ``conversations`` (:func:`warm_start_tool_calls`) when given. The digest hashes
    the settings, the conversations as the template renders them and :data:`BUILD_VERSION`, so changed data never
    loads a stale model. ``build.json`` in the folder records the settings and the warm start's losses."""
    import time

    from trl_credit.models import _cache_root

    rendered = None
    if conversations:
        tokenizer = build_tool_tokenizer()
        rendered = [tokenizer.apply_chat_template(c["messages"], tools=c.get("tools") or None, tokenize=False)
                    for c in conversations]
    settings = {"build_version": BUILD_VERSION, "seed": seed, "hidden_size": hidden_size, "num_layers": num_layers,
                "warm_start_steps": steps if conversations else 0, "batch_size": batch_size if conversations else 0}
    digest = hashlib.sha256(json.dumps([settings, rendered]).encode()).hexdigest()[:12]
    folder = _cache_root() / f"{TOOL_MODEL}-{digest}"
    if (folder / "build.json").exists():
        return str(folder)
    partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
    started = time.process_time()
    build_tool_model(str(partial), seed=seed, hidden_size=hidden_size, num_layers=num_layers)
    record = dict(settings)
    if conversations:
        record["warm_start"] = warm_start_tool_calls(str(partial), conversations, steps=steps,
                                                     batch_size=batch_size, seed=seed)
    record["cpu_seconds"] = round(time.process_time() - started, 1)
    (partial / "build.json").write_text(json.dumps(record, indent=2))
    try:
        partial.rename(folder)  # atomic: a concurrent build of the same digest keeps the first one
    except OSError:
        import shutil

        shutil.rmtree(partial, ignore_errors=True)
    return str(folder)
