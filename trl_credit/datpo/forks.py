"""Forking-point selection on a base rollout (DATPO paper §2.3, App. D.1 Alg. 2, App. D.5; docs/datpo.md#forks).

A *fork* ``f`` of a base rollout τ is the length of the prefix its branches continue from (1 <= f < |τ|): they
continue from prompt + ``τ[:f]`` and replace ``τ[f:]``, and the base rollout's blocks meet at token ``f``. This is
the paper's Alg. 1/3 index: a fork f ∈ {1..|τ|} (tokens 1-indexed) branches from x_f = [q; τ_{1:f}], which is
``τ[:f]`` here. The entropy-based methods select a *fork token* (0-indexed ``s``: the first token of a
high-entropy sentence, or a high-entropy token); ``position`` says where the branches start relative to it:

- ``"after_token"`` (default, the paper): the prefix keeps the fork token, f = s + 1 (the paper's µ_m is the
  1-indexed start of sentence m, and x_f = [q; τ_{1:µ_m}] ends with it). Every sentence can be a fork, the first
  one included (prefix = its first token), as Alg. 2 ranks all of them.
- ``"before_token"``: the prefix stops before it, f = s, so the fork token itself is resampled. A token at 0 is
  then no fork (its prefix would be the bare prompt, i.e. a fresh base rollout), so neither is the first sentence.

Token ``t``'s entropy ``H_t`` is the entropy of the distribution ``t`` was sampled from (TRL's
``entropies[:, t]``). ``fixed_seg`` and ``random`` choose prefix lengths directly (Alg. 2's positions are the
paper's f), so ``position`` does not change them.

- :func:`token_char_offsets`: character span of every generated token in the decoded text (the tokenizer's offset
  mapping, with an exact incremental-decoding fallback when re-tokenizing the text does not give the same ids).
- :func:`sentence_spans`: PySBD sentences mapped to contiguous token spans.
- :func:`select_forks`: ``sent_entropy`` (default), ``tok_entropy`` (optionally distance-forced), ``fixed_seg``,
  ``random``.
"""

from __future__ import annotations

import bisect
import random as _random
from collections.abc import Sequence

import torch

__all__ = ["FORK_METHODS", "FORK_POSITIONS", "token_char_offsets", "sentence_spans", "select_forks"]

FORK_METHODS = ("sent_entropy", "tok_entropy", "fixed_seg", "random")
FORK_POSITIONS = ("after_token", "before_token")

_SEGMENTER = None


def _default_segmenter():
    global _SEGMENTER
    if _SEGMENTER is None:
        import pysbd

        # clean=False keeps the text unchanged, so sentences can be located in it character for character.
        _SEGMENTER = pysbd.Segmenter(language="en", clean=False)
    return _SEGMENTER


def token_char_offsets(tokenizer, token_ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decoded text of ``token_ids`` and the ``(start, end)`` character span of each token in it.

    Special tokens (EOS, padding) are not part of the text: they get an empty span at the position where they
    occur. The text is decoded without clean-up so character positions line up. The spans come from the
    tokenizer's offset mapping of the decoded text when re-tokenizing it gives back exactly ``token_ids``;
    otherwise (a non-canonical tokenization was sampled, or a slow tokenizer) from incremental decoding, which is
    exact for any tokenizer: token ``k`` spans ``[len(decode(ids[:k])), len(decode(ids[:k+1])))``.
    """
    ids = [int(t) for t in token_ids]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    kept = [i for i, t in enumerate(ids) if t not in special]
    kept_ids = [ids[i] for i in kept]
    text = tokenizer.decode(kept_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) if kept_ids else ""

    kept_offsets: list[tuple[int, int]] | None = None
    if kept_ids and getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if list(encoded["input_ids"]) == kept_ids:
            kept_offsets = [(int(s), int(e)) for s, e in encoded["offset_mapping"]]
    if kept_offsets is None:
        kept_offsets = []
        previous = 0
        for k in range(len(kept_ids)):
            current = len(tokenizer.decode(kept_ids[: k + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False))
            # A token that completes a multi-byte character can shorten the decoded prefix's replacement chars;
            # keep spans monotone.
            current = max(current, previous)
            kept_offsets.append((previous, current))
            previous = current

    offsets: list[tuple[int, int]] = []
    cursor = 0
    kept_iter = iter(kept_offsets)
    kept_set = set(kept)
    for i in range(len(ids)):
        if i in kept_set:
            span = next(kept_iter)
            offsets.append(span)
            cursor = span[1]
        else:
            offsets.append((cursor, cursor))
    return text, offsets


def _sentence_starts(text: str, segmenter) -> list[int]:
    """Character index of the first non-space character of every PySBD sentence, located left to right."""
    starts: list[int] = []
    cursor = 0
    for sentence in segmenter.segment(text):
        content = sentence.strip() if isinstance(sentence, str) else str(sentence).strip()
        if not content:
            continue
        position = text.find(content, cursor)
        if position < 0:  # PySBD altered the sentence; it cannot be located, so it merges into its neighbour
            continue
        starts.append(position)
        cursor = position + len(content)
    return starts


def sentence_spans(
    text: str, offsets: Sequence[tuple[int, int]], segmenter=None
) -> list[tuple[int, int]]:
    """Token spans ``[(start, end), ...]`` (end exclusive) of the sentences of ``text`` (paper App. D.1).

    Sentences come from PySBD (``segmenter``: anything with ``segment(text) -> list[str]``; default English PySBD
    with ``clean=False``). Byte-level BPE tokens carry their leading space (" Then"), so a token belongs to the
    sentence of its first non-space character; tokens with no such character (whitespace, newlines, special
    tokens with empty spans) stay in the sentence of the token before them. The spans are contiguous, in order,
    and cover every token exactly once; the first starts at token 0. A sentence in which no token starts (it lies
    inside one token) merges into the previous one.
    """
    num_tokens = len(offsets)
    if num_tokens == 0:
        return []
    starts = _sentence_starts(text, segmenter or _default_segmenter())
    sentence_of_token: list[int] = []
    current = 0
    for start_char, end_char in offsets:
        piece = text[start_char:end_char]
        stripped = len(piece) - len(piece.lstrip())
        if piece and stripped < len(piece):
            anchor = start_char + stripped
            # never move backwards: a sentence boundary is crossed once
            current = max(current, bisect.bisect_right(starts, anchor) - 1)
        sentence_of_token.append(current)
    spans: list[tuple[int, int]] = []
    span_start = 0
    for t in range(1, num_tokens):
        if sentence_of_token[t] != sentence_of_token[t - 1]:
            spans.append((span_start, t))
            span_start = t
    spans.append((span_start, num_tokens))
    return spans


def _top_k(scores: Sequence[float], candidates: Sequence[int], k: int) -> list[int]:
    # Highest score first; ties go to the earlier candidate (stable, deterministic).
    order = sorted(candidates, key=lambda c: (-float(scores[c]), c))
    return order[:k]


def select_forks(
    token_entropies: torch.Tensor | Sequence[float] | None,
    spans: Sequence[tuple[int, int]] | None,
    k: int,
    method: str = "sent_entropy",
    *,
    num_tokens: int | None = None,
    min_gap: float = 0.0,
    rng: _random.Random | None = None,
    position: str = "after_token",
    model_mask: Sequence[int] | None = None,
) -> list[int]:
    """Up to ``k`` forks in a base rollout of ``num_tokens`` = L tokens, sorted (paper Alg. 2, docs/datpo.md#forks).

    A fork ``f`` is a prefix length: branch from prompt + ``τ[:f]`` (the module docstring). Forks are distinct and
    1 <= f <= L − 1 (the prefix is neither the bare prompt nor the whole rollout), so at most L − 1 exist. For the
    entropy methods the fork token s becomes f = s + 1 with ``position="after_token"`` (paper) and f = s with
    ``"before_token"``; so the eligible fork tokens are 0..L−2 and 1..L−1 respectively.

    - ``sent_entropy``: sentence entropy = mean token entropy over the sentence's tokens (``spans``, from
      :func:`sentence_spans`); the fork tokens are the first tokens of the ``k`` highest-entropy eligible sentences.
    - ``tok_entropy``: the ``k`` highest-entropy eligible tokens. With ``min_gap > 0`` (distance-forced, paper
      App. D.5): candidates in descending entropy order, skipping any closer than ``min_gap·L`` tokens to an
      already selected one.
    - ``fixed_seg``: ``⌊j·L/(k+1)⌋`` for j = 1..k (paper Alg. 2), duplicates and 0 dropped.
    - ``random``: ``k`` distinct positions drawn uniformly from 1..L−1 with ``rng`` (seeded by the caller).

    Ties in entropy go to the earlier position.

    ``model_mask`` (a multi-turn completion, docs/datpo.md#multi-turn-rollouts: 1 on the model's tokens, 0 on tool
    results, TRL's ``tool_mask``): a fork must replace one of the model's tokens (``τ[f]`` is a model token), so the
    prefix never ends inside a tool result; the entropy methods' fork token is a model token too (with
    ``"after_token"`` the prefix then ends inside a model turn, never at its end); ``spans`` cover the model's tokens
    only (:func:`trl_credit.datpo.multiturn.model_sentence_spans`). ``fixed_seg`` spaces its forks over the model's
    tokens (f = the position of model token ``⌊j·L_m/(k+1)⌋``, L_m model tokens) and ``random`` draws among the
    eligible forks. A mask without a 0 (or None) changes nothing.
    """
    if method not in FORK_METHODS:
        raise ValueError(f"method must be one of {FORK_METHODS}, got {method!r}")
    if position not in FORK_POSITIONS:
        raise ValueError(f"position must be one of {FORK_POSITIONS}, got {position!r}")
    if not 0.0 <= min_gap < 1.0:
        raise ValueError(f"min_gap must be in [0, 1), got {min_gap}")
    if min_gap > 0 and method != "tok_entropy":
        raise ValueError(f"min_gap (distance-forced forking) applies only to method='tok_entropy', got {method!r}")
    entropies = None
    if token_entropies is not None:
        entropies = [float(h) for h in (token_entropies.tolist() if torch.is_tensor(token_entropies) else token_entropies)]
    if num_tokens is None:
        if entropies is not None:
            num_tokens = len(entropies)
        elif spans:
            num_tokens = spans[-1][1]
        else:
            raise ValueError("select_forks needs num_tokens, token_entropies or spans to know the rollout length")
    length = int(num_tokens)
    if k <= 0 or length < 2:
        return []
    if method in ("sent_entropy", "tok_entropy"):
        if entropies is None or len(entropies) < length:
            raise ValueError(f"method={method!r} needs one entropy per token ({length}), got "
                             f"{None if entropies is None else len(entropies)}")

    # fork token s -> fork (prefix length) s + shift
    shift = 1 if position == "after_token" else 0
    mask = None
    if model_mask is not None and not all(model_mask[:length]):
        if len(model_mask) < length:
            raise ValueError(f"model_mask has {len(model_mask)} entries for {length} tokens")
        mask = [bool(v) for v in model_mask[:length]]

    def model_fork(s: int) -> bool:
        # multi-turn: the fork token s and the token the branch replaces, s + shift, are the model's
        return mask is None or (mask[s] and mask[s + shift])

    if method == "sent_entropy":
        if spans is None:
            raise ValueError("method='sent_entropy' needs the sentence spans")
        sentence_entropy = [sum(entropies[s:e]) / (e - s) if e > s else float("-inf") for s, e in spans]
        candidates = [i for i, (s, e) in enumerate(spans) if 0 < s + shift < length and e > s and model_fork(s)]
        chosen = _top_k(sentence_entropy, candidates, k)
        return sorted(spans[i][0] + shift for i in chosen)

    if method == "tok_entropy":
        candidates = [t for t in range(length) if 0 < t + shift < length and model_fork(t)]
        if min_gap <= 0:
            return sorted(t + shift for t in _top_k(entropies, candidates, k))
        gap = min_gap * length
        chosen: list[int] = []
        for c in _top_k(entropies, candidates, len(candidates)):
            if all(abs(c - s) >= gap for s in chosen):
                chosen.append(c)
                if len(chosen) == k:
                    break
        return sorted(t + shift for t in chosen)

    if method == "fixed_seg":
        if mask is not None:  # spaced over the model's tokens: f = the position of model token ⌊j·L_m/(k+1)⌋
            model = [t for t in range(length) if mask[t]]
            if not model:
                return []
            return sorted({model[(j * len(model)) // (k + 1)] for j in range(1, k + 1)} - {0})
        positions = {(j * length) // (k + 1) for j in range(1, k + 1)}
        return sorted(p for p in positions if 0 < p < length)

    # random
    rng = rng or _random.Random(0)
    if mask is not None:  # among the forks that replace a model token
        eligible = [f for f in range(1, length) if mask[f]]
        return sorted(rng.sample(eligible, min(k, len(eligible))))
    return sorted(rng.sample(range(1, length), min(k, length - 1)))
