"""The tiny tool model (trl_credit.testbed.tool_model): what TRL's tool loop needs of its tokenizer; its warm start."""

import json

import pytest
from transformers import AutoTokenizer
from trl.chat_template_utils import (add_response_schema, get_training_chat_template,
                                     is_chat_template_prefix_preserving, parse_response, supports_tool_calling)

from tests.test_multiturn_trl import multiply_tool
from trl_credit.testbed.tool_model import (SPECIAL_TOKENS, TOOL_TOKENS, qwen3_chat_template, tool_model_path,
                                           warm_start_tool_calls)


@pytest.fixture(scope="module")
def tokenizer(tiny_tool_model_path):
    return AutoTokenizer.from_pretrained(tiny_tool_model_path)


def test_the_tokenizer_is_one_trl_parses_tool_calls_from(tokenizer):
    assert tokenizer.chat_template == qwen3_chat_template()  # TRL's file, byte for byte
    assert supports_tool_calling(tokenizer)
    # Qwen's markers are single tokens; EOS and padding are Qwen's.
    for token in SPECIAL_TOKENS + TOOL_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    # add_response_schema recognizes the template (it raises on an unknown one) and the tool call parses.
    add_response_schema(tokenizer)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 3 times 4?"}], tools=[multiply_tool],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    text = '<tool_call>\n{"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
    parsed = parse_response(tokenizer, tokenizer.encode(text, add_special_tokens=False), prefix=prompt,
                            tools=[multiply_tool])
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "multiply_tool",
                                                                      "arguments": {"a": 3, "b": 4}}}]


def test_trl_swaps_in_its_prefix_preserving_training_template(tiny_tool_model_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tool_model_path)
    # As with a real Qwen3: the qwen3 template drops the think block of earlier turns, so it is not prefix-preserving,
    # and TRL replaces it by its training variant, which is.
    assert not is_chat_template_prefix_preserving(tokenizer)
    tokenizer.chat_template = get_training_chat_template(tokenizer)
    assert tokenizer.chat_template == qwen3_chat_template(training=True)  # what the warm start renders with
    assert is_chat_template_prefix_preserving(tokenizer)


def test_digits_are_single_tokens_as_in_qwen(tokenizer):
    # A number in a tool response and in the model's own text is the same digit tokens.
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("\n25", add_special_tokens=False))[-2:] == ["2", "5"]
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode(" 25", add_special_tokens=False))[-2:] == ["2", "5"]


def test_the_warm_start_teaches_a_tool_call_and_the_cache_keys_on_the_data(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_CREDIT_CACHE", str(tmp_path))
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "multiply_tool", "arguments": {"a": 3, "b": 4}}}]}
    conversation = {"messages": [{"role": "user", "content": "What is 3 times 4?"}, call,
                                 {"role": "tool", "name": "multiply_tool", "content": "12"},
                                 {"role": "assistant", "content": "12"}], "tools": [multiply_tool]}
    path = tool_model_path([conversation], steps=30, batch_size=2, hidden_size=32)
    record = json.loads(open(f"{path}/build.json").read())
    assert record["warm_start"]["steps"] == 30
    assert record["warm_start"]["last_loss"] < record["warm_start"]["first_loss"] / 2  # it learned the transcript
    assert tool_model_path([conversation], steps=30, batch_size=2, hidden_size=32) == path  # cached
    assert tool_model_path(None, hidden_size=32) != path  # the random model is another folder
    with pytest.raises(ValueError, match="no assistant turn"):
        warm_start_tool_calls(path, [{"messages": [{"role": "user", "content": "hi"}]}], steps=1)
