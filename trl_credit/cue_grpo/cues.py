r"""Strategy-Cue extraction Phi_0 and cleaning (paper Appendix A "Extraction pipeline", Algorithm 1 step 3;
docs/cue_grpo.md#cue-extraction): completion text -> reasoning steps -> one cue label per step -> merged, filtered cue sequence s̄_i.

Two implementations of the per-step labelling, which must agree exactly (tested):

- :func:`label_step` is the readable definition: try the cues in priority order, first match wins.
- :func:`extract_cues_batch` is what the trainer runs: all steps of all completions are joined into one string
  (``\x00`` between steps), every trigger anchor is located with ``str.find`` (C speed), each hit is confirmed with
  its trigger regex at that position, and a step keeps the lowest cue id confirmed inside it. This touches only
  the few places where a trigger can start instead of running 27 regexes over every step.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate
from collections.abc import Sequence

from .catalog import CUE_CATALOG, FILTERED_LABELS, OTHER

__all__ = [
    "DISCOURSE_MARKERS",
    "MIN_STEP_CHARS",
    "split_steps",
    "label_step",
    "merge_and_filter",
    "extract_cues",
    "extract_cues_batch",
]

DISCOURSE_MARKERS: tuple[str, ...] = (
    "Step", "First", "Next", "Then", "Finally", "Therefore", "Thus", "Hence",
    "Now", "We", "Let", "Consider", "Suppose", "Assume", "Since", "Because",
)
MIN_STEP_CHARS = 20  # steps shorter than this (after stripping whitespace) are discarded

# Step boundaries (docs/cue_grpo.md#cue-extraction), each consumed by the split:
#   a blank line;  a newline before a numbered-list item ("1. ", "12. ");
#   a capitalized discourse marker at the start of a line, or after ".", "!" or "?" and spaces.
# Markers are matched capitalized only: a lower-case "we"/"then" inside a sentence does not start a step.
# Every alternative starts with one of the rare characters [\n.!?], which lets the regex engine skip ahead fast.
_MARKERS = "|".join(DISCOURSE_MARKERS)
_STEP_BOUNDARY = re.compile(
    r"[\n.!?](?:"
    r"(?<=\n)[ \t]*\n\s*"
    r"|(?<=\n)(?=[ \t]*\d+\.\s)"
    rf"|(?<=\n)[ \t]*(?=(?:{_MARKERS})\b)"
    rf"|(?<=[.!?])[ \t]+(?=(?:{_MARKERS})\b)"
    r")"
)
_SEP = "\x00"  # step separator of the fast path; removed from input text first

_CUE_PATTERNS = tuple((cue.name, re.compile(cue.pattern)) for cue in CUE_CATALOG)  # reference matcher
# fast path: (cue id, anchor, compiled trigger regex, is_latex) in priority order
_TRIGGERS = tuple(
    (cue.id, t.anchor, re.compile(t.full_regex), t.latex) for cue in CUE_CATALOG for t in cue.triggers
)
_NAMES_BY_ID = {cue.id: cue.name for cue in CUE_CATALOG}
_NO_CUE = len(CUE_CATALOG) + 1


def split_steps(text: str, min_chars: int = MIN_STEP_CHARS) -> list[str]:
    """Segment a reasoning trace into steps (paper Appendix A): split on blank lines, before numbered-list items
    and before sentence-initial discourse markers (the punctuation ending the previous sentence goes with the
    split); strip each step; drop steps shorter than ``min_chars`` characters. (A list item that starts with a
    marker, "2. Then ...", is also cut after "2."; the "2" fragment falls to the length filter.)"""
    text = text.replace(_SEP, " ")
    return [step for piece in _STEP_BOUNDARY.split(text) if len(step := piece.strip()) >= min_chars]


def label_step(step: str) -> str:
    """The highest-priority cue matching ``step`` (lowest catalog id: symbolic cues 1-12 before language cues
    13-27), or ``"other"`` when no cue matches (paper Appendix A; docs/cue_grpo.md#cue-extraction)."""
    for name, pattern in _CUE_PATTERNS:
        if pattern.search(step):
            return name
    return OTHER


def merge_and_filter(labels: Sequence[str]) -> list[str]:
    """Merge consecutive duplicate labels, then drop ``verify`` and ``other`` (Algorithm 1 step 3).

    Merging happens first, on the raw label sequence, as in the paper: ``[a, other, a]`` stays three labels when
    merging and becomes ``[a, a]`` after filtering (no second merge)."""
    merged = [label for i, label in enumerate(labels) if i == 0 or label != labels[i - 1]]
    return [label for label in merged if label not in FILTERED_LABELS]


def extract_cues(text: str) -> list[str]:
    """Cue skeleton s̄_i of one completion before group suppression (paper Eq. 5's s̄_i; docs/cue_grpo.md#cue-extraction):
    steps -> highest-priority cue per step -> merge consecutive duplicates -> drop ``verify``/``other``."""
    return extract_cues_batch([text])[0]


def _label_steps_fast(steps: list[str]) -> list[str]:
    if not steps:
        return []
    original = _SEP.join(steps)
    lowered_steps = [step.lower() for step in steps]  # lower() may change lengths (rare Unicode): own offsets
    lowered = _SEP.join(lowered_steps)
    starts_original, starts_lowered = _offsets(steps), _offsets(lowered_steps)
    best = [_NO_CUE] * len(steps)
    for cue_id, anchor, regex, is_latex in _TRIGGERS:
        text, starts = (original, starts_original) if is_latex else (lowered, starts_lowered)
        position = text.find(anchor)
        while position >= 0:
            # a word trigger needs a word boundary before it: a letter, digit or "_" there rules it out
            # (exactly what the regex's leading \b would decide), so skip the regex for substrings of words
            if is_latex or position == 0 or not (text[position - 1].isalnum() or text[position - 1] == "_"):
                step = bisect_right(starts, position) - 1
                if best[step] > cue_id and regex.match(text, position):
                    best[step] = cue_id
            position = text.find(anchor, position + 1)
    return [_NAMES_BY_ID.get(cue_id, OTHER) for cue_id in best]


def _offsets(steps: list[str]) -> list[int]:
    # start of each step in _SEP.join(steps)
    return [0, *accumulate(len(step) + len(_SEP) for step in steps[:-1])]


def extract_cues_batch(texts: Sequence[str]) -> list[list[str]]:
    """:func:`extract_cues` for many completions in one pass (same result, much faster than a loop)."""
    steps_per_text = [split_steps(text) for text in texts]
    labels = _label_steps_fast([step for steps in steps_per_text for step in steps])
    skeletons, cursor = [], 0
    for steps in steps_per_text:
        skeletons.append(merge_and_filter(labels[cursor : cursor + len(steps)]))
        cursor += len(steps)
    return skeletons
