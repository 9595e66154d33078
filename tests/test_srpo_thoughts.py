"""Token-exact thought splitting (docs/srpo.md#thoughts) and the reset prefix (paper §4.2: x* = question + thoughts 1..h*-1)."""

import pytest

from trl_credit.core.steps import reset_prefix_length, split_thoughts, thought_texts


class PieceTokenizer:
    """A tokenizer whose token i decodes to ``pieces[i]``: lets a test place token boundaries by hand."""

    def __init__(self, pieces, special=("<eos>",)):
        self.pieces = list(pieces)
        self.special = set(special)

    def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=False):
        return "".join(
            self.pieces[i] for i in ids if not (skip_special_tokens and self.pieces[i] in self.special)
        )


def test_delimiter_split_across_tokens_and_fused_with_following_text():
    pieces = ["Step", " 1", "</", "thought", ">", " Step", " 2", "</thought", "> so", " 7", "</thought>", "<eos>"]
    tok = PieceTokenizer(pieces)
    ids = list(range(len(pieces)))
    # 1st "</thought>" is "</" "thought" ">" (tokens 2-4): cut after token 4 -> boundary 5.
    # 2nd ends inside token 8 ("> so"): first token boundary at/after its end is 9; " so" stays in thought 2.
    # 3rd is token 10 -> boundary 11; the rest ("<eos>") has no visible text, so it joins thought 3 -> 12.
    assert split_thoughts(ids, tok, "</thought>") == [5, 9, 12]
    assert thought_texts(ids, [5, 9, 12], tok, "</thought>") == ["Step 1", "Step 2  so", "7"]


def test_delimiter_at_the_very_end_gives_no_empty_thought():
    pieces = ["a", "</", "thought>", "b", "</thought", ">"]
    tok = PieceTokenizer(pieces)
    # occurrences end after token 2 (boundary 3) and after token 5 = the last token (boundary 6 = len).
    assert split_thoughts(list(range(6)), tok, "</thought>") == [3, 6]


def test_no_delimiter_is_one_thought_and_empty_response_has_none():
    tok = PieceTokenizer(["x", " = ", "3", "<eos>"])
    assert split_thoughts([0, 1, 2, 3], tok, "</thought>") == [4]
    assert split_thoughts([], tok, "</thought>") == []


def test_newline_runs_inside_one_token_and_leading_delimiter():
    tok = PieceTokenizer(["a", "\n\n", "b", "\n", "c"])
    # both "\n" of token 1 end inside it -> one boundary 2; token 3 -> 4; end -> 5.
    assert split_thoughts([0, 1, 2, 3, 4], tok, "\n") == [2, 4, 5]
    tok = PieceTokenizer(["\n", "a", "\n", "b"])
    # cuts 1, 3, 4; the first segment ("\n") has no visible text and joins the next thought -> [3, 4].
    assert split_thoughts([0, 1, 2, 3], tok, "\n") == [3, 4]


def test_real_bpe_tokenizer_cuts_ids_exactly(tiny_tokenizer):
    # Encode pieces separately so the delimiter is certainly split over several tokens.
    parts = ["Step 1: compute 12 * 3", "</", "thou", "ght>", " then 36", "</thought>", " so \\boxed{36}"]
    encoded = [tiny_tokenizer.encode(p, add_special_tokens=False) for p in parts]
    ids = [t for piece in encoded for t in piece] + [tiny_tokenizer.eos_token_id]
    lengths = [len(piece) for piece in encoded]
    first = sum(lengths[:4])  # the first delimiter ends with the "ght>" piece
    second = sum(lengths[:6])  # the second one with the "</thought>" piece
    # Every piece starts at a token boundary, so the first boundary at/after each delimiter end is the piece end.
    assert split_thoughts(ids, tiny_tokenizer, "</thought>") == [first, second, len(ids)]
    texts = thought_texts(ids, [first, second, len(ids)], tiny_tokenizer, "</thought>")
    assert texts == ["Step 1: compute 12 * 3", "then 36", "so \\boxed{36}"]


def test_reset_prefix_length():
    ends = [5, 9, 12]
    # h* = 1: reset to the question (keep 0 tokens); h* = 2: keep thought 1; h* = 3: keep thoughts 1-2.
    assert [reset_prefix_length(ends, h) for h in (1, 2, 3)] == [0, 5, 9]
    with pytest.raises(ValueError, match="reset_step"):
        reset_prefix_length(ends, 4)
    with pytest.raises(ValueError, match="reset_step"):
        reset_prefix_length(ends, 0)
