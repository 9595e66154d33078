"""Forking points (paper Alg. 2, App. D.1/D.5; docs/datpo.md#forks): sentence spans and the five selection rules."""

import random

import pytest

from trl_credit.datpo import select_forks, sentence_spans, token_char_offsets

TEXT = "First, we add the numbers. Then x = 12.5 + 3. Therefore the answer is \\boxed{15.5}."


def _char_owner(tokenizer, ids, char):
    # independent reference: the token whose incremental decode first covers `char`
    for k in range(len(ids)):
        if len(tokenizer.decode(ids[: k + 1], clean_up_tokenization_spaces=False)) > char:
            return k
    raise AssertionError


def test_token_offsets_and_sentence_spans(tiny_tokenizer):
    ids = tiny_tokenizer(TEXT, add_special_tokens=False)["input_ids"] + [tiny_tokenizer.eos_token_id]
    assert len(ids) > 30  # words and numbers span several tokens with this BPE
    text, offsets = token_char_offsets(tiny_tokenizer, ids)
    assert text == TEXT
    assert offsets[-1] == (len(TEXT), len(TEXT))  # EOS: empty span at the end
    for k in range(len(ids) - 1):
        assert offsets[k] == (
            len(tiny_tokenizer.decode(ids[:k], clean_up_tokenization_spaces=False)),
            len(tiny_tokenizer.decode(ids[: k + 1], clean_up_tokenization_spaces=False)),
        )
    spans = sentence_spans(text, offsets)
    # 3 sentences; "12.5" and "15.5" do not split. Sentence 2 starts at the 'T' of "Then" (char 27), sentence 3
    # at the 'T' of "Therefore" (char 46).
    assert TEXT[27:31] == "Then" and TEXT[46:55] == "Therefore"
    then_tok, therefore_tok = _char_owner(tiny_tokenizer, ids, 27), _char_owner(tiny_tokenizer, ids, 46)
    assert spans == [(0, then_tok), (then_tok, therefore_tok), (therefore_tok, len(ids))]
    assert tiny_tokenizer.decode(ids[then_tok:therefore_tok]).strip() == "Then x = 12.5 + 3."


def test_offsets_fallback_for_non_canonical_tokens(tiny_tokenizer):
    # "answer" spelled one byte-token per letter: re-tokenizing the text would merge them, so the offset mapping
    # cannot be used and incremental decoding gives one character per token.
    letters = [tiny_tokenizer.convert_tokens_to_ids(c) for c in "answer"]
    assert tiny_tokenizer("answer", add_special_tokens=False)["input_ids"] != letters
    text, offsets = token_char_offsets(tiny_tokenizer, letters)
    assert text == "answer"
    assert offsets == [(k, k + 1) for k in range(6)]


def test_sentence_entropy_forks_skip_token_zero():
    spans = [(0, 3), (3, 5), (5, 9)]
    entropies = [9, 9, 9, 1, 3, 4, 2, 2, 4]
    # sentence means: 9, (1+3)/2 = 2, (4+2+2+4)/4 = 3. Sentence 0 is the most uncertain but starts at token 0.
    assert select_forks(entropies, spans, 1, "sent_entropy") == [5]
    assert select_forks(entropies, spans, 2, "sent_entropy") == [3, 5]
    assert select_forks(entropies, spans, 3, "sent_entropy") == [3, 5]  # only 2 eligible sentences


def test_token_entropy_and_distance_forced():
    entropies = [9.0, 5.0, 4.9, 4.8, 0.0, 0.0, 3.0, 0.0, 0.0, 2.0]  # L = 10
    # plain: top-3 among tokens 1..9 -> 1, 2, 3 (localized)
    assert select_forks(entropies, None, 3, "tok_entropy") == [1, 2, 3]
    # gap 0.3·10 = 3 tokens: 1 kept; 2, 3 too close (distance 1, 2); 6 kept (5); 9 kept (distance 3 to 6)
    assert select_forks(entropies, None, 3, "tok_entropy", min_gap=0.3) == [1, 6, 9]


def test_fixed_segment_and_random():
    assert select_forks(None, None, 3, "fixed_seg", num_tokens=10) == [2, 5, 7]  # ⌊10/4⌋, ⌊20/4⌋, ⌊30/4⌋
    assert select_forks(None, None, 3, "fixed_seg", num_tokens=3) == [1, 2]  # ⌊3/4⌋ = 0 is dropped
    first = select_forks(None, None, 4, "random", num_tokens=50, rng=random.Random("s"))
    again = select_forks(None, None, 4, "random", num_tokens=50, rng=random.Random("s"))
    assert first == again and len(set(first)) == 4 and all(1 <= f < 50 for f in first)
    assert select_forks(None, None, 5, "random", num_tokens=3, rng=random.Random(0)) == [1, 2]
    assert select_forks(None, None, 3, "random", num_tokens=1) == []


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        select_forks([1.0, 2.0], None, 1, "attention")
    with pytest.raises(ValueError, match="tok_entropy"):
        select_forks([1.0, 2.0], [(0, 2)], 1, "sent_entropy", min_gap=0.1)
    with pytest.raises(ValueError, match="entropy"):
        select_forks(None, None, 1, "tok_entropy", num_tokens=4)
