r"""LLM-judge partitions (UARL / CR-JP, paper Appendix B; docs/cue_grpo.md#partition-sources): prompt construction and output parsing.

Pure text functions; the trainer runs the judge model. The judge sees the group's completions (all K of them, as
in the paper, or only the positive ones), each truncated to its first 200 and last 500 characters, and must answer
``{"groups": [{"strategy": "name", "members": [1, 3]}, ...]}`` with 1-based solution numbers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .partition import canonical_cluster_ids

__all__ = [
    "JUDGE_SYSTEM_PROMPT",
    "truncate_for_judge",
    "judge_messages",
    "parse_judge_groups",
    "judge_partition",
]

JUDGE_SYSTEM_PROMPT = (
    "You are an expert at analyzing mathematical reasoning strategies. Group the following solutions by "
    "HIGH-LEVEL MATHEMATICAL STRATEGY. Ignore superficial wording, variable names, verbosity. "
    "'factorization vs quadratic formula' = different. Same approach + more detail = same group. "
    'Return ONLY JSON: {"groups": [{"strategy": "name", "members": [1,3]}, ...]}.'
)


def truncate_for_judge(text: str, head: int = 200, tail: int = 500) -> str:
    """Keep the first ``head`` and last ``tail`` characters (Appendix B: 200 head / 500 tail); texts of at most
    head + tail characters are kept whole. The cut is marked with " [...] "."""
    if len(text) <= head + tail:
        return text
    return text[:head] + " [...] " + text[len(text) - tail :]


def judge_messages(problem: str, solutions: Sequence[str], head: int = 200, tail: int = 500) -> list[dict]:
    """Chat messages for the judge: the UARL system prompt, then the problem and the numbered, truncated
    solutions (``Solution 1`` is ``solutions[0]``)."""
    body = [f"Problem:\n{problem}"]
    body += [f"Solution {i}:\n{truncate_for_judge(s, head, tail)}" for i, s in enumerate(solutions, start=1)]
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(body)}]


def _json_objects(text: str):
    # Every JSON object that parses, starting at each "{" in order (judges often wrap JSON in prose or fences).
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            obj, _ = decoder.raw_decode(text, start)
            yield obj
        except ValueError:
            pass
        start = text.find("{", start + 1)


def _solution_number(member) -> int | None:
    # an int (not a bool) or a string of digits; anything else (1.5, "x", null) is not a solution number
    if isinstance(member, int) and not isinstance(member, bool):
        return member
    if isinstance(member, str) and member.strip().isdigit():
        return int(member.strip())
    return None


def parse_judge_groups(output: str, num_solutions: int) -> list[int | None] | None:
    """Group label per solution 1..``num_solutions`` from the judge's answer, or None when no usable
    ``{"groups": [...]}`` object is found (the caller then uses one group).

    The first parsable object with a ``groups`` list whose entries have a ``members`` list wins. Members may be
    ints or integer strings; numbers outside 1..num_solutions are ignored; a solution listed in several groups
    keeps its first group; an unlisted solution gets None. An object in which no listed member is valid counts
    as a parse failure."""
    for obj in _json_objects(output):
        if not isinstance(obj, dict) or not isinstance(obj.get("groups"), list):
            continue
        labels: list[int | None] = [None] * num_solutions
        for group_index, group in enumerate(obj["groups"]):
            members = group.get("members") if isinstance(group, dict) else None
            if not isinstance(members, list):
                continue
            for member in members:
                number = _solution_number(member)
                if number is not None and 1 <= number <= num_solutions and labels[number - 1] is None:
                    labels[number - 1] = group_index
        if any(label is not None for label in labels):
            return labels
    return None


def judge_partition(labels: list[int | None] | None, positive_numbers: Sequence[int]) -> list[int]:
    """Cluster ids of the positive completions from the judge's labels (docs/cue_grpo.md#partition-sources).

    ``positive_numbers``: the 1-based solution numbers (as shown to the judge) of the completions of P.
    Parse failure (``labels`` None) -> one group. Positive completions the judge left unlisted share one extra
    cluster of their own (they are not made to look rare)."""
    if labels is None:
        return [0] * len(positive_numbers)
    unlisted = "unlisted"
    return canonical_cluster_ids(
        [labels[n - 1] if labels[n - 1] is not None else unlisted for n in positive_numbers]
    )
