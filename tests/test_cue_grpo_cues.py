"""Strategy-Cue catalog and extraction (paper Appendix A / Table 6; docs/cue_grpo.md#cue-extraction), on hand-written traces."""

import random
import re

import pytest

from trl_credit.cue_grpo import (
    CUE_CATALOG,
    CUE_NAMES,
    extract_cues,
    extract_cues_batch,
    label_step,
    merge_and_filter,
    split_steps,
)

TABLE_6 = [
    "modulo_op", "combinatorics", "discriminant", "radicals", "summation", "calculus", "log_exp", "trigonometry",
    "inequality", "set_theory", "matrix_op", "gcd_lcm",
    "define", "equation_setup", "substitute", "solve_linear", "solve_quadratic", "solve_cubic", "case_split",
    "theorem_apply", "modulo_arith", "induction", "combin_count", "simplify", "compute", "verify", "conclude",
]


def test_catalog_is_table_6_in_priority_order():
    assert list(CUE_NAMES) == TABLE_6
    assert [cue.id for cue in CUE_CATALOG] == list(range(1, 28))
    assert [cue.kind for cue in CUE_CATALOG] == ["symbolic"] * 12 + ["language"] * 15


def test_every_trigger_regex_starts_with_its_anchor():
    # The fast extractor relies on it: a match can only start where the literal anchor is.
    for cue in CUE_CATALOG:
        for trigger in cue.triggers:
            assert trigger.regex.startswith(re.escape(trigger.anchor)), (cue.name, trigger)


def test_split_steps_blank_lines_numbered_items_markers_and_20_char_filter():
    text = (
        "First we write down what is known here.\n\n"
        "Ok.\n\n"  # 3 characters: dropped
        "1) this item is not a numbered-list start\n"
        "12. a numbered item with enough text\n"
        "We add them and then we simplify the fraction. Then we stop and look back at it."
    )
    assert split_steps(text) == [
        "First we write down what is known here.",
        "1) this item is not a numbered-list start",  # only "N. " starts a numbered item (docs/cue_grpo.md#cue-extraction: "1. ")
        "12. a numbered item with enough text",
        # lower-case "then" inside a sentence does not split; capitalized "Then" after "." does (the "." goes)
        "We add them and then we simplify the fraction",
        "Then we stop and look back at it.",
    ]


def test_twenty_character_filter_boundary():
    nineteen, twenty = "abcdefghij abcdefgh", "abcdefghij abcdefghi"
    assert (len(nineteen), len(twenty)) == (19, 20)
    assert split_steps(f"{nineteen}\n\n{twenty}\n\n   {nineteen}   ") == [twenty]


@pytest.mark.parametrize(
    "step, expected",
    [
        # symbolic before language: simplify (24) and compute (25) also match, radicals (4) wins
        (r"We simplify \sqrt{8} to 2\sqrt{2} and compute.", "radicals"),
        # ties among language cues: catalog order, not text order (substitute 15 < solve_linear 16)
        ("Solve it after we substitute x = 2 into it.", "substitute"),
        ("Substitute x = 2 and then solve for y.", "substitute"),
        # ties among symbolic cues: modulo_op (1) before log_exp (7)
        (r"Take \log of both sides, then n \equiv 1.", "modulo_op"),
        # word boundaries: "resolved" does not contain the word "solve"
        ("The dispute was resolved amicably today.", "other"),
        # case-insensitive words, inflections
        ("SOLVING the system takes a while here.", "solve_linear"),
        # LaTeX is case-sensitive: \delta is not the discriminant \Delta
        (r"Here \delta is small enough for us.", "other"),
        (r"Here \Delta = 25 is a perfect square.", "discriminant"),
        (r"So b^{2} - 4ac = 0 means a double root.", "discriminant"),
        # a command that is only a prefix of another command does not fire
        (r"In logic \lnot p holds for this one.", "other"),
        ("Let the common value be t for all three.", "define"),
        ("Let me check the arithmetic again now.", "verify"),  # no "be": not define
        ("If x is even we halve it; otherwise we stop.", "case_split"),
        ("Therefore the answer is \\boxed{5} here.", "conclude"),
        ("This is a plain sentence with no hints.", "other"),
    ],
)
def test_label_step_priority(step, expected):
    assert label_step(step) == expected


def test_merge_then_filter_verify_and_other():
    # [sub, sub, verify, sub, conclude, other] -> merge -> [sub, verify, sub, conclude, other] -> filter
    assert merge_and_filter(["substitute", "substitute", "verify", "substitute", "conclude", "other"]) == [
        "substitute", "substitute", "conclude",
    ]
    assert merge_and_filter(["verify", "other", "verify"]) == []


def test_extract_cues_on_a_trace():
    trace = "\n\n".join(
        [
            "First, we substitute x = 3 into the equation.",  # substitute
            "Then we substitute y = 4 into the other one.",  # substitute (merged with the previous step)
            "Ok.",  # < 20 characters: dropped
            "Now we verify the result numerically.",  # verify: removed
            "Finally we substitute back to get z = 10.",  # substitute (not merged: verify sat between)
            "Therefore the answer is \\boxed{10}.",  # conclude
            "Nothing interesting happens in this step.",  # other: removed
        ]
    )
    assert extract_cues(trace) == ["substitute", "substitute", "conclude"]


_FRAGMENTS = [
    r"\sqrt{2}", r"\lnot", r"\Delta", r"\delta", "b^2-4ac", r"\frac{d}{dx}", r"\frac{1}{d}", r"\begin{pmatrix}",
    "resolve", "solve", "Solving", "find", "found", "Let the value of", "be", "if", "otherwise", "Case 2",
    "base case 1", "rational root theorem", "theorem", "we have the following", "set up the equation",
    "plug into", "stars and bars", "greatest common", "modular", "CRT", "check", "tested", "therefore",
    r"\boxed{3}", "x = 2", "the", "and", "value", ".", ". Then", "\n\n", "\n1. ", ". We", "İstanbul", "\x00",
    "combination", "combine", "Factorization", "complete the square", "inductive hypothesis", "count",
]


def _reference_extract(text):
    return merge_and_filter([label_step(step) for step in split_steps(text)])


def test_fast_batch_extractor_equals_reference_on_random_texts():
    # label_step (27 regex searches per step, priority order) is the readable definition; the trainer's fast
    # anchor-based path must give exactly the same skeletons.
    rng = random.Random(0)
    texts = [" ".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(0, 60))) for _ in range(300)]
    assert extract_cues_batch(texts) == [_reference_extract(t) for t in texts]
    assert extract_cues_batch([]) == []
