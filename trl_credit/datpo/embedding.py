"""Block-text embeddings for the sibling-diversity bonus (paper App. E.1, Eq. 8; docs/datpo.md#sibling-diversity).

:class:`BlockEmbedder` wraps the embedder (a sentence-transformers model, or anything with
``encode(texts, batch_size=, convert_to_tensor=)``) and spends its compute on real tokens only:

- each distinct text is embedded once (sibling branches repeat each other word for word);
- texts already embedded in an earlier step come from a bounded cache (``cache_size`` texts, least recently used
  dropped first): the embedder is frozen, so a text's embedding does not change between steps;
- with a sentence-transformers model on the CPU (a ``tokenizer`` and ``max_seq_length``), texts are batched by
  token length: ``encode`` pads each batch to its longest text, and on short block texts of mixed lengths that
  padding was 1.3-1.6x the real tokens (benchmarks/results/HISTORY.md section 1), computed and then dropped by the
  attention mask.
  Each ``encode`` call also has a fixed cost (all-MiniLM-L6-v2 on one CPU thread: ~7 ms, the compute of ~40
  tokens), so the batches are the contiguous runs of the length-sorted texts that minimize (calls x
  ``call_cost_tokens`` + padded tokens) (:func:`length_batches`). On an accelerator a batch's pads run in
  parallel: there the texts go to ``encode`` in one list, which batches them itself.

A text's embedding does not depend on the batch it is in, up to float32 round-off of another batch shape (the pads
are masked out of attention and of the mean pooling): the tests bound the difference against embedding every copy
in the embedder's own batches.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import torch

__all__ = ["BlockEmbedder", "length_batches"]

# The fixed cost of one ``encode`` call in tokens' worth of compute: all-MiniLM-L6-v2 on one CPU thread spends ~7 ms
# per call and ~0.17 ms per token (benchmarks/results/HISTORY.md section 1). Larger embedders cost more per token,
# so for them this errs toward fewer, more padded batches, i.e. toward ``encode``'s own batching.
CALL_COST_TOKENS = 40.0


class BlockEmbedder:
    """Embeds block texts with ``embedder``: :meth:`embed` returns a (len(texts), dim) float32 CPU tensor.

    ``batch_size``: most texts per ``encode`` call; ``cache_size``: texts kept across calls (0: none);
    ``call_cost_tokens``: the fixed cost of an ``encode`` call in tokens (:func:`length_batches`).
    """

    def __init__(self, embedder, batch_size: int = 64, cache_size: int = 0,
                 call_cost_tokens: float = CALL_COST_TOKENS):
        if not hasattr(embedder, "encode"):
            raise TypeError("`embedder` must have an `encode(texts, ...)` method (a sentence-transformers model)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"`batch_size` must be an integer >= 1, got {batch_size!r}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"`cache_size` must be an integer >= 0, got {cache_size!r}")
        if not call_cost_tokens >= 0:
            raise ValueError(f"`call_cost_tokens` must be >= 0, got {call_cost_tokens!r}")
        self.embedder, self.batch_size, self.cache_size = embedder, batch_size, cache_size
        self.call_cost_tokens = float(call_cost_tokens)
        self.cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.encoded_texts = 0  # texts sent to the embedder so far (the cache's misses), for benchmarks

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        texts = list(texts)
        if not texts:
            raise ValueError("`texts` is empty: nothing to embed")
        unique = list(dict.fromkeys(texts))
        vectors = {text: self.cache[text] for text in unique if text in self.cache}
        for text in vectors:
            self.cache.move_to_end(text)  # recently used: dropped last
        missing = [text for text in unique if text not in vectors]
        if missing:
            self.encoded_texts += len(missing)
            for batch in self._batches(missing):
                encoded = self._encode(batch)
                vectors.update(zip(batch, encoded))
            if self.cache_size:
                for text in missing:
                    self.cache[text] = vectors[text]
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
        return torch.stack([vectors[text] for text in texts])

    def _encode(self, batch: list[str]) -> list[torch.Tensor]:
        with torch.no_grad():
            encoded = self.embedder.encode(
                batch, batch_size=self.batch_size, convert_to_tensor=True, show_progress_bar=False,
            )
        # clone: a row view would keep the whole batch's tensor alive in the cache
        return [row.clone() for row in torch.as_tensor(encoded).float().cpu()]

    def _batches(self, texts: list[str]) -> list[list[str]]:
        """``texts`` in batches by token length (:func:`length_batches`; the embedder's tokenizer, cut at its
        ``max_seq_length`` as ``encode`` cuts); one batch of all texts when the embedder has no tokenizer to count
        with or is not on the CPU (``encode`` then batches them itself)."""
        lengths = self._token_lengths(texts)
        if lengths is None:
            return [texts]
        return [[texts[k] for k in batch] for batch in length_batches(lengths, self.batch_size, self.call_cost_tokens)]

    def _token_lengths(self, texts: list[str]) -> list[int] | None:
        tokenizer = getattr(self.embedder, "tokenizer", None)
        limit = getattr(self.embedder, "max_seq_length", None)
        if tokenizer is None or not callable(tokenizer) or not isinstance(limit, int):
            return None
        if str(getattr(self.embedder, "device", "cpu")) != "cpu":
            return None
        ids = tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
        return [len(row) for row in ids]


def length_batches(lengths: list[int], batch_size: int, call_cost_tokens: float = CALL_COST_TOKENS) -> list[list[int]]:
    """Indices into ``lengths`` (token counts) in batches of at most ``batch_size``, each padded to its longest, that
    minimize (number of batches) x ``call_cost_tokens`` + (padded tokens): contiguous runs of the indices sorted by
    length (ties in index order), shortest first, found by dynamic programming over the run ends. With
    ``call_cost_tokens`` < 1 a batch holds one length only (any pad costs at least a token)."""
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    ordered = [lengths[k] for k in order]
    best = [0.0] + [math.inf] * len(order)  # best[j]: the cheapest batches of the first j sorted texts
    start_of = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(max(0, end - batch_size), end):
            cost = best[start] + call_cost_tokens + (end - start) * ordered[end - 1]
            if cost < best[end]:
                best[end], start_of[end] = cost, start
    batches, end = [], len(order)
    while end:
        batches.append(order[start_of[end] : end])
        end = start_of[end]
    return batches[::-1]
