"""A tiny random causal LM with a tokenizer built here (no download), for fast trainer tests.

The tokenizer is a byte-level BPE trained in milliseconds on a small arithmetic/reasoning corpus, so words and
numbers span several tokens (as with real tokenizers) and offset mappings are exact. It has a ChatML-style chat
template and ``<|im_end|>`` as EOS, like SmolLM2.
"""

from __future__ import annotations

import os

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "What is 3 + 4? Put the final answer in \\boxed{}.",
    "First, we add the numbers. Then we check the result. Therefore the answer is \\boxed{7}.",
    "Step 1: compute 12 * 3 = 36.</thought> Step 2: subtract 5 to get 31.</thought> So \\boxed{31}.",
    "Let x = 2. Since x^2 = 4, we have \\frac{4}{2} = 2. Hence the sum is 10.",
    "The correct final answer is 42. We verify by substitution and conclude.",
    "Consider the equation 2x + 3 = 11. Solving gives x = 4. Thus \\boxed{4}.",
] * 20


def build_tokenizer(save_dir: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|im_end|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(save_dir)
    return fast


def build_tiny_model(save_dir: str, seed: int = 0):
    """Save a 2-layer Llama with hidden size 32 and its tokenizer to ``save_dir``; returns the path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return _save_tiny(save_dir, seed, LlamaConfig, LlamaForCausalLM, num_attention_heads=4, num_key_value_heads=2)


def build_tiny_hybrid_model(save_dir: str, seed: int = 0):
    """Save a 2-layer NemotronH (a Mamba-2 layer, then an attention layer; hidden size 32) and the tokenizer to
    ``save_dir``; returns the path. A hybrid model: its cache holds a linear-attention (SSM) layer, which runs on the
    CPU through transformers' reference PyTorch kernels."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    return _save_tiny(
        save_dir, seed, NemotronHConfig, NemotronHForCausalLM,
        hybrid_override_pattern="M*",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=8,
        n_groups=1,
        mamba_d_conv=4,
        mamba_expand=1,
        mamba_chunk_size=16,
    )


def _save_tiny(save_dir: str, seed: int, config_class, model_class, **architecture):
    """A 2-layer model of hidden size 32 over the tiny tokenizer, seeded, saved with it to ``save_dir``."""
    import torch

    os.makedirs(save_dir, exist_ok=True)
    tokenizer = build_tokenizer(save_dir)
    config = config_class(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        **{"max_position_embeddings": 512, **architecture},
    )
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(save_dir)
    return save_dir


def recorded(trainer):
    """Record each generation batch (row order, with the dataset rows: the public ``on_credit`` callback) and each
    micro-batch reaching TRL's loss: returns the two lists, filled as the trainer runs."""
    import torch

    batches, losses = [], []

    def recording_batch(step):
        tensors = {k: v.detach().clone() for k, v in step.output.items() if torch.is_tensor(v)}
        batches.append({"inputs": step.inputs, **tensors})

    trainer.add_credit_callback(recording_batch)
    # Kept as a wrap: the tests check what TRL's loss receives after its shuffle and split into micro-batches,
    # which on_credit (one call per generation batch, before the split) does not see.
    loss = trainer._compute_loss

    def recording_loss(model, inputs):
        losses.append({k: inputs[k].detach().clone() for k in ("advantages", "completion_ids")})
        return loss(model, inputs)

    trainer._compute_loss = recording_loss
    return batches, losses


def build_tiny_vllm_model(save_dir: str, seed: int = 0):
    """The tiny Llama with one attention head of 32 dimensions (hidden size 32): vLLM's CPU attention takes head sizes
    from 32 up (8 is refused), so this is the smallest model the vLLM engine tests (tests/engines) run."""
    from transformers import LlamaConfig, LlamaForCausalLM

    # 2048 positions: SRPO's localization prompt is ~900 tokens of this small vocabulary, and vLLM refuses a prompt
    # longer than the model's context
    return _save_tiny(save_dir, seed, LlamaConfig, LlamaForCausalLM, num_attention_heads=1, num_key_value_heads=1,
                      head_dim=32, max_position_embeddings=2048)
