"""Steps of a completion, on its token ids: the one splitting that SRPO's resets, the process credit and PRIME share
(docs/multiturn.md#steps, docs/srpo.md#thoughts).

Two kinds of step:

- **thoughts** (SRPO paper §4.1 "Thought MDP"): a response is a sequence of thoughts, each ended by a delimiter
  (``</thought>`` in the paper): :func:`split_thoughts`;
- **model turns** (a multi-turn completion of TRL's tool loop or an environment): the maximal runs of tokens the model
  generated, between the tool results / environment tokens that TRL's ``tool_mask`` (or a ``rollout_func``'s
  ``env_mask``) marks 0: :func:`model_turn_spans`; :func:`step_spans` picks a kind (thoughts inside each turn too).

Reset states are thought-level prefixes of a response, and they must be *exact* token prefixes of what the policy
sampled: we cut the sampled token ids, never re-tokenize text (re-tokenizing can merge or split tokens differently and
the reset state would not be a state the policy visited).

Boundary rule (documented once, used everywhere):
    Decode the ids once (``skip_special_tokens=False``, no space clean-up) and find every delimiter occurrence in
    the text. For an occurrence ending at character ``e``, the thought boundary is the smallest token index ``i``
    such that ``decode(ids[:i])`` already contains the first ``e`` characters of the text, i.e. the first token
    boundary at or after the delimiter end. A delimiter split across several tokens (``"</" "thought" ">"``) thus
    cuts after its last piece; a token that carries the delimiter end *and* following text (``">\\n"``) stays
    whole, in the thought the delimiter ends. A delimiter at the very end gives the boundary ``len(ids)`` (no empty
    thought after it). Several delimiters inside one token give one boundary. Finally a segment with no visible
    text (only whitespace or special tokens such as EOS) is merged into the thought before it (into the next one
    if it is the first), so no thought is empty. A response with no delimiter is one thought.

Only torch/stdlib; the tokenizer is any object with ``decode(ids, skip_special_tokens=..., ...)``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "split_thoughts", "thought_token_spans", "thought_texts", "reset_prefix_length", "model_turn_spans",
    "model_turns_text",
    "is_multi_turn", "step_spans", "span_texts", "STEP_UNITS", "tool_result_spans",
]


def _decode(tokenizer, ids: Sequence[int], skip_special_tokens: bool) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def _first_boundary_covering(tokenizer, ids: list[int], text: str, end_char: int, low: int) -> int:
    """Smallest ``i >= low`` with ``decode(ids[:i])`` starting with ``text[:end_char]`` (binary search; the
    property is monotone in ``i`` because decoding a longer prefix only appends text after the covered part)."""
    target = text[:end_char]
    lo, hi = max(low, 1), len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if _decode(tokenizer, ids[:mid], skip_special_tokens=False).startswith(target):
            hi = mid
        else:
            lo = mid + 1
    return lo


def split_thoughts(token_ids: Sequence[int], tokenizer, delimiter: str) -> list[int]:
    """Thought boundaries of a response, as token indices (docs/srpo.md#thoughts; rule in the module docstring).

    Returns the exclusive end index of every thought, strictly increasing, the last one ``len(token_ids)``:
    thought ``k`` (1-indexed) is ``token_ids[ends[k-2]:ends[k-1]]`` with ``ends[-1] = 0`` for ``k = 1``. An empty
    response has no thought (``[]``).
    """
    if not delimiter:
        raise ValueError("delimiter must be a non-empty string.")
    ids = [int(i) for i in token_ids]
    if not ids:
        return []
    text = _decode(tokenizer, ids, skip_special_tokens=False)
    cuts: list[int] = []
    search_from = 0
    while True:
        position = text.find(delimiter, search_from)
        if position < 0:
            break
        end_char = position + len(delimiter)
        boundary = _first_boundary_covering(tokenizer, ids, text, end_char, cuts[-1] if cuts else 1)
        if not cuts or boundary > cuts[-1]:
            cuts.append(boundary)
        search_from = end_char
    if not cuts or cuts[-1] != len(ids):
        cuts.append(len(ids))

    # Merge segments without visible text into a neighbour (no empty thoughts, e.g. a lone EOS after the last
    # delimiter, or the newline run between two newline-delimited steps).
    ends: list[int] = []
    start = 0
    for end in cuts:
        visible = _decode(tokenizer, ids[start:end], skip_special_tokens=True).strip()
        if visible or not ends:
            ends.append(end)
        else:
            ends[-1] = end  # no visible text: belongs to the previous thought
        start = end
    # A first segment without visible text was kept above (nothing before it): merge it into the next one.
    if len(ends) > 1 and not _decode(tokenizer, ids[: ends[0]], skip_special_tokens=True).strip():
        ends.pop(0)
    return ends


def thought_token_spans(ends: Sequence[int]) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` token spans of the thoughts given their end indices from :func:`split_thoughts`."""
    starts = [0, *ends[:-1]]
    return list(zip(starts, ends))


def thought_texts(token_ids: Sequence[int], ends: Sequence[int], tokenizer, delimiter: str) -> list[str]:
    """Visible text of every thought with the delimiter removed and whitespace stripped, as the paper renders the
    chain in the localization prompt (Appendix D: "with </thought> delimiters stripped")."""
    return span_texts(token_ids, thought_token_spans(ends), tokenizer, delimiter)


def span_texts(token_ids: Sequence[int], spans: Sequence[tuple[int, int]], tokenizer, delimiter: str) -> list[str]:
    """Visible text of every step span (:func:`step_spans`), rendered as :func:`thought_texts` renders thoughts."""
    ids = list(token_ids)
    texts = []
    for start, end in spans:
        text = _decode(tokenizer, ids[start:end], skip_special_tokens=True)
        texts.append(text.replace(delimiter, " ").strip() if delimiter.strip() else text.strip())
    return texts


def reset_prefix_length(ends: Sequence[int], reset_step: int) -> int:
    """Number of response tokens kept in the reset state ``x* = (x0, y_1..y_{h*-1})`` (paper §4.2).

    ``reset_step`` is the 1-indexed thought h* to resample; the kept prefix is everything before it (0 tokens when
    h* = 1, i.e. the reset state is the question itself).
    """
    if not 1 <= reset_step <= len(ends):
        raise ValueError(f"reset_step must be in [1, {len(ends)}] (the number of thoughts), got {reset_step}.")
    return 0 if reset_step == 1 else int(ends[reset_step - 2])


#: How a completion is cut into steps (``step_spans``): the process credit's ``process_steps``.
STEP_UNITS = {
    "auto": "model turns in a multi-turn completion (one with tool results or environment tokens), thoughts otherwise",
    "turns": "each model turn is one step (a single-turn completion is one step)",
    "thoughts": "thoughts (the delimiter), inside each model turn: a step never spans a tool result",
}


def model_turn_spans(model_mask: Sequence[int]) -> list[tuple[int, int]]:
    """The model turns of a completion: ``[(start, end), ...]``, the maximal runs of 1 in ``model_mask`` (1 on a token
    the model generated, 0 on a tool result or environment token; TRL's ``tool_mask``), in order. A mask without a 0
    is one turn; an all-0 mask has none."""
    spans: list[tuple[int, int]] = []
    start = None
    for index, value in enumerate(model_mask):
        if value and start is None:
            start = index
        elif not value and start is not None:
            spans.append((start, index))
            start = None
    if start is not None:
        spans.append((start, len(model_mask)))
    return spans


def model_turns_text(tokenizer, ids: Sequence[int], model_mask: Sequence[int]) -> str:
    """The model's text of a multi-turn completion (token ``ids``): its model turns (:func:`model_turn_spans`) decoded
    without special tokens and joined by newlines; tool results and environment tokens are left out."""
    ids = list(ids)
    return "\n".join(tokenizer.decode(ids[start:end], skip_special_tokens=True)
                     for start, end in model_turn_spans(model_mask))


def tool_result_spans(model_mask: Sequence[int]) -> list[tuple[int, int]]:
    """The tool results (or environment spans) of a completion: the maximal runs of 0 in ``model_mask``, in order (one
    per round of TRL's tool loop)."""
    return model_turn_spans([0 if value else 1 for value in model_mask])


def is_multi_turn(model_mask: Sequence[int]) -> bool:
    """Whether a completion holds a tool result or environment token (a 0 of ``model_mask``)."""
    return any(not value for value in model_mask)


def step_spans(token_ids: Sequence[int], tokenizer, delimiter: str, model_mask: Sequence[int] | None = None,
              unit: str = "auto") -> list[tuple[int, int]]:
    """A completion's steps as token spans ``[(start, end), ...]`` over the model's tokens, in order (``unit``: one
    of :data:`STEP_UNITS`). ``model_mask``: 1 on the model's tokens (None: all of them, a single-turn completion).

    A step is made of the model's tokens only: a tool result between two model turns is in no step (the spans leave
    it out), and thoughts are split inside each model turn (a step never spans a tool result). A single-turn
    completion under ``"auto"`` or ``"thoughts"`` gives :func:`split_thoughts`'s thoughts, as SRPO splits them."""
    if unit not in STEP_UNITS:
        raise ValueError(f"unit must be one of {sorted(STEP_UNITS)}, got {unit!r}.")
    ids = [int(i) for i in token_ids]
    mask = [1] * len(ids) if model_mask is None else [int(bool(v)) for v in model_mask][: len(ids)]
    if len(mask) != len(ids):
        raise ValueError(f"model_mask has {len(mask)} entries for {len(ids)} tokens.")
    turns = model_turn_spans(mask)
    if unit == "turns" or (unit == "auto" and is_multi_turn(mask)):
        return turns
    spans: list[tuple[int, int]] = []
    for start, end in turns:
        ends = split_thoughts(ids[start:end], tokenizer, delimiter)
        spans += [(start + a, start + b) for a, b in thought_token_spans(ends)]
    return spans
