"""BlockEmbedder (trl_credit/datpo/embedding.py): each distinct text once, texts of earlier calls from a bounded cache,
batches of one token length; the same vectors as embedding every copy with the embedder's own ``encode``."""

import pytest
import torch

from trl_credit.datpo.config import DATPOConfig
from trl_credit.datpo.embedding import BlockEmbedder, length_batches


class WordTokenizer:
    """One token per word plus two special tokens, as a BERT tokenizer adds [CLS] and [SEP]."""

    def __call__(self, texts, truncation=False, max_length=None):
        ids = [[0] + [1] * len(text.split()) + [2] for text in texts]
        if truncation:
            ids = [row[:max_length] for row in ids]
        return {"input_ids": ids}


class FakeEmbedder:
    """A deterministic embedder: (number of words, number of characters) per text; records every encode call."""

    def __init__(self, tokenizer=True, max_seq_length=5):
        if tokenizer:
            self.tokenizer = WordTokenizer()
            self.max_seq_length = max_seq_length
        self.calls = []

    def encode(self, texts, batch_size, convert_to_tensor, show_progress_bar):
        self.calls.append(list(texts))
        assert convert_to_tensor and not show_progress_bar
        return torch.tensor([[float(len(t.split())), float(len(t))] for t in texts])


def test_distinct_texts_once_in_batches_of_one_token_length():
    fake = FakeEmbedder()
    texts = ["a b", "c", "a b", "d e", "f", "g h i", "c"]
    # a call costs less than one pad: every batch holds one token length
    out = BlockEmbedder(fake, batch_size=64, call_cost_tokens=0.5).embed(texts)
    # one row per input text, in input order, repeats included: (words, characters)
    assert out.tolist() == [[2, 3], [1, 1], [2, 3], [2, 3], [1, 1], [3, 5], [1, 1]]
    assert out.dtype == torch.float32
    # 5 distinct texts, grouped by token length (words + 2), shortest first, first appearance order within
    assert fake.calls == [["c", "f"], ["a b", "d e"], ["g h i"]]


def test_batches_hold_at_most_batch_size_texts():
    fake = FakeEmbedder()
    BlockEmbedder(fake, batch_size=2, call_cost_tokens=0.5).embed(["a", "b", "c", "d e"])
    # three texts of 3 tokens need two calls of at most 2 (which one goes alone costs the same), then "d e"
    assert sorted(map(len, fake.calls[:2])) == [1, 2] and sorted(sum(fake.calls[:2], [])) == ["a", "b", "c"]
    assert fake.calls[2:] == [["d e"]]


def test_truncated_lengths_share_a_batch():
    # max_seq_length 4: "a b c" (5 tokens) and "a b c d" (6) are both cut to 4, as encode cuts them
    fake = FakeEmbedder(max_seq_length=4)
    BlockEmbedder(fake, batch_size=8, call_cost_tokens=0.5).embed(["a b c", "a b c d", "x"])
    assert fake.calls == [["x"], ["a b c", "a b c d"]]


def test_length_batches_trade_calls_against_pads_by_hand():
    # sorted lengths 3 (index 1), 3 (index 3), 5 (index 0), 10 (index 2), at most 4 per batch
    lengths = [5, 3, 10, 3]
    # call cost 3: [3,3][5][10] = 3+6 + 3+5 + 3+10 = 30 beats [3,3,5][10] = 31, one batch = 43, one per text = 33
    assert length_batches(lengths, 4, 3.0) == [[1, 3], [0], [2]]
    # call cost 5: [3,3,5][10] = 5+15 + 5+10 = 35 beats [3,3][5][10] = 36 and one batch = 45
    assert length_batches(lengths, 4, 5.0) == [[1, 3, 0], [2]]
    # batch_size caps a batch: [2,2][3] = 100+4 + 100+3 = 207 beats [2][2,3] = 100+2 + 100+6 = 208
    assert length_batches([2, 2, 3], 2, 100.0) == [[0, 1], [2]]
    assert length_batches([], 4) == []


def test_default_call_cost_embeds_short_texts_in_one_call():
    fake = FakeEmbedder(max_seq_length=512)
    BlockEmbedder(fake, batch_size=64).embed(["a", "b c", "d e f g"])  # 2 + 3 pads cost less than a 40-token call
    assert fake.calls == [["a", "b c", "d e f g"]]


def test_off_the_cpu_encode_batches_itself():
    fake = FakeEmbedder()
    fake.device = "cuda:0"
    BlockEmbedder(fake, batch_size=64, call_cost_tokens=0.5).embed(["a", "b c"])
    assert fake.calls == [["a", "b c"]]


def test_without_a_tokenizer_one_call_with_the_distinct_texts():
    fake = FakeEmbedder(tokenizer=False)
    out = BlockEmbedder(fake, batch_size=2).embed(["a b", "c", "a b"])
    assert fake.calls == [["a b", "c"]]  # encode batches them itself
    assert out.tolist() == [[2, 3], [1, 1], [2, 3]]


def test_cache_serves_later_calls_and_drops_the_least_recently_used():
    fake = FakeEmbedder()
    embedder = BlockEmbedder(fake, batch_size=8, cache_size=2, call_cost_tokens=0.5)
    embedder.embed(["a", "b c"])
    assert fake.calls == [["a"], ["b c"]]
    assert embedder.embed(["b c", "a"]).tolist() == [[2, 3], [1, 1]]
    assert len(fake.calls) == 2  # both from the cache
    embedder.embed(["d e f"])  # cache holds 2: "b c" (used before "a") is dropped
    assert list(embedder.cache) == ["a", "d e f"]
    embedder.embed(["b c"])
    assert fake.calls[-1] == ["b c"]
    assert embedder.encoded_texts == 4


def test_no_cache_embeds_again():
    fake = FakeEmbedder()
    embedder = BlockEmbedder(fake, cache_size=0)
    embedder.embed(["a"])
    embedder.embed(["a"])
    assert fake.calls == [["a"], ["a"]]
    assert not embedder.cache


def test_bad_arguments_name_themselves():
    with pytest.raises(TypeError, match="encode"):
        BlockEmbedder(object())
    with pytest.raises(ValueError, match="batch_size"):
        BlockEmbedder(FakeEmbedder(), batch_size=0)
    with pytest.raises(ValueError, match="cache_size"):
        BlockEmbedder(FakeEmbedder(), cache_size=-1)
    with pytest.raises(ValueError, match="call_cost_tokens"):
        BlockEmbedder(FakeEmbedder(), call_cost_tokens=-1)
    with pytest.raises(ValueError, match="texts"):
        BlockEmbedder(FakeEmbedder()).embed([])
    with pytest.raises(ValueError, match="embedding_cache_size"):
        DATPOConfig(output_dir="/tmp/datpo_cfg", use_cpu=True, report_to="none", embedding_cache_size=-1)


@pytest.mark.parametrize("call_cost_tokens", [0.5, 40.0])
def test_same_vectors_as_encoding_every_copy_with_the_packaged_embedder(call_cost_tokens):
    """The old path: encode all texts (repeats included) in the embedder's own padded batches. Same-length batches
    and cached vectors differ from it by float32 round-off of another batch shape only."""
    from trl_credit.models import load_default_embedder

    model = load_default_embedder(device="cpu")
    texts = ["3+4=7", "3+4=7", "then 12 + 9 = 21, so the answer is 21.", "A 5", "5+6=11\n11+2=13", "x",
             "the sum of the first two numbers is 7"]
    reference = torch.as_tensor(model.encode(texts, batch_size=64, convert_to_tensor=True)).float()
    embedder = BlockEmbedder(model, batch_size=64, cache_size=16, call_cost_tokens=call_cost_tokens)
    first = embedder.embed(texts)
    again = embedder.embed(list(reversed(texts)))  # all from the cache
    assert embedder.encoded_texts == 6
    assert (first - reference).abs().max() < 1e-6
    assert torch.equal(again, first.flip(0))
