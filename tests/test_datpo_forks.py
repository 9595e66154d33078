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


SPANS = [(0, 3), (3, 5), (5, 9)]
ENTROPIES = [9, 9, 9, 1, 3, 4, 2, 2, 4]  # sentence means: 9, (1+3)/2 = 2, (4+2+2+4)/4 = 3


def test_sentence_entropy_forks_keep_the_sentence_first_token():
    # Paper Alg. 1/3: x_f = [q; τ_{1:f}] with f = µ_m, the 1-indexed start of sentence m, so the prefix is τ[:s + 1]
    # for a sentence starting at 0-indexed token s. Alg. 2 ranks every sentence: sentence 0 (the most uncertain) is
    # a fork with prefix = its first token.
    assert select_forks(ENTROPIES, SPANS, 1, "sent_entropy") == [1]
    assert select_forks(ENTROPIES, SPANS, 2, "sent_entropy") == [1, 6]  # sentences 0 and 2 (starts 0, 5)
    assert select_forks(ENTROPIES, SPANS, 3, "sent_entropy") == [1, 4, 6]
    assert select_forks(ENTROPIES, SPANS, 5, "sent_entropy") == [1, 4, 6]  # only 3 sentences
    # a one-token last sentence (start L − 1 = 3) cannot fork: its prefix would be the whole rollout
    assert select_forks([0, 0, 0, 9], [(0, 3), (3, 4)], 2, "sent_entropy") == [1]
    assert select_forks([0, 0, 0, 9], [(0, 3), (3, 4)], 2, "sent_entropy", position="before_token") == [3]


def test_sentence_entropy_forks_before_token_skip_token_zero():
    # fork_position="before_token": branches resample the sentence's first token; sentence 0 starts at token 0,
    # where a fork would be a fresh rollout, so it is never chosen
    assert select_forks(ENTROPIES, SPANS, 1, "sent_entropy", position="before_token") == [5]
    assert select_forks(ENTROPIES, SPANS, 2, "sent_entropy", position="before_token") == [3, 5]
    assert select_forks(ENTROPIES, SPANS, 3, "sent_entropy", position="before_token") == [3, 5]  # 2 eligible


def test_token_entropy_and_distance_forced():
    entropies = [9.0, 5.0, 4.9, 4.8, 0.0, 0.0, 3.0, 0.0, 0.0, 2.0]  # L = 10
    # after_token (default): fork tokens among 0..8 (the last token would leave nothing to branch), f = token + 1.
    # plain: tokens 0, 1, 2 -> 1, 2, 3 (localized)
    assert select_forks(entropies, None, 3, "tok_entropy") == [1, 2, 3]
    # gap 0.3·10 = 3 tokens: 0 kept; 1, 2 too close; 3 kept (distance 3); 6 kept (distance 3 to 3) -> 1, 4, 7
    assert select_forks(entropies, None, 3, "tok_entropy", min_gap=0.3) == [1, 4, 7]
    # before_token: fork tokens among 1..9, f = token.
    assert select_forks(entropies, None, 3, "tok_entropy", position="before_token") == [1, 2, 3]
    # gap 3: 1 kept; 2, 3 too close (distance 1, 2); 6 kept (5); 9 kept (distance 3 to 6)
    assert select_forks(entropies, None, 3, "tok_entropy", min_gap=0.3, position="before_token") == [1, 6, 9]
    # the two positions pick different tokens when the first or last token is the most uncertain
    peaks = [1.0, 5.0, 0.0, 4.0, 0.0, 9.0]  # L = 6
    assert select_forks(peaks, None, 2, "tok_entropy") == [2, 4]  # tokens 1, 3 (token 5 is last)
    assert select_forks(peaks, None, 2, "tok_entropy", position="before_token") == [1, 5]  # tokens 5, 1


def test_positional_methods_ignore_the_position():
    for position in ("after_token", "before_token"):
        assert select_forks(None, None, 3, "fixed_seg", num_tokens=10, position=position) == [2, 5, 7]
        assert select_forks(None, None, 2, "random", num_tokens=9, rng=random.Random(1), position=position) == \
            select_forks(None, None, 2, "random", num_tokens=9, rng=random.Random(1))


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
    with pytest.raises(ValueError, match="position must be one of"):
        select_forks([1.0, 2.0], None, 1, "tok_entropy", position="sentence_start")
