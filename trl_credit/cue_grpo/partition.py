r"""Partitions of a group's positive completions P (paper Eqs. 5-7, Algorithm 1 steps 3-5, Appendix G; docs/cue_grpo.md#algorithm).

A partition is a list of integer cluster ids, one per completion of P, numbered 0, 1, 2, ... in order of first
appearance (so equal partitions have equal id lists).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import numpy as np

from .catalog import CUE_INDEX, NUM_CUES
from .cues import extract_cues_batch

__all__ = [
    "suppress_group_cues",
    "cue_count_vectors",
    "cluster_cue_vectors",
    "partition_skeletons",
    "cue_partition",
    "random_partition",
    "canonical_cluster_ids",
]

_COSINE_TOLERANCE = 1e-9  # cos = 0.5 computed in floating point must still pass a threshold of 0.5


def canonical_cluster_ids(labels: Sequence) -> list[int]:
    """Relabel arbitrary hashable cluster labels as 0, 1, 2, ... in order of first appearance."""
    mapping: dict = {}
    return [mapping.setdefault(label, len(mapping)) for label in labels]


def suppress_group_cues(skeletons: Sequence[Sequence[str]], rho: float = 0.75) -> list[list[str]]:
    """Group suppression (paper Eq. 5; docs/cue_grpo.md#group-suppression): q_λ = number of skeletons of P containing cue λ; every λ with
    q_λ > ρ·|P| (strictly) is removed from every skeleton. Returns the cleaned skeletons s_i."""
    limit = rho * len(skeletons)
    presence = Counter(label for skeleton in skeletons for label in set(skeleton))
    common = {label for label, q in presence.items() if q > limit}
    return [[label for label in skeleton if label not in common] for skeleton in skeletons]


def cue_count_vectors(skeletons: Sequence[Sequence[str]]) -> np.ndarray:
    """Bag-of-cues count vectors c_i ∈ Z^27 (docs/cue_grpo.md#clusters): coordinate id-1 counts cue ``id`` in the skeleton."""
    vectors = np.zeros((len(skeletons), NUM_CUES), dtype=np.float64)
    for row, skeleton in enumerate(skeletons):
        for label in skeleton:
            vectors[row, CUE_INDEX[label]] += 1.0
    return vectors


def cluster_cue_vectors(vectors: np.ndarray, epsilon: float = 0.5) -> list[int]:
    """Strategy-Cue partition C_Φ (paper Eqs. 6-7; docs/cue_grpo.md#clusters): all-zero vectors form one "no-retained-cue"
    cluster; the others are the connected components of the graph with an edge {i, j} when
    cos(c_i, c_j) ≥ ε (so clusters chain through intermediate vectors). Returns canonical cluster ids."""
    count = len(vectors)
    if count == 0:
        return []
    norms = np.linalg.norm(vectors, axis=1)
    nonzero = norms > 0
    parent = list(range(count))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    index = np.flatnonzero(nonzero)
    if len(index) > 1:
        unit = vectors[index] / norms[index, None]
        similar = unit @ unit.T >= epsilon - _COSINE_TOLERANCE
        for a, b in zip(*np.nonzero(np.triu(similar, k=1))):
            root_a, root_b = find(int(index[a])), find(int(index[b]))
            if root_a != root_b:
                parent[root_b] = root_a
    empty_label = -1  # one shared label for every all-zero vector
    return canonical_cluster_ids([find(i) if nonzero[i] else empty_label for i in range(count)])


def partition_skeletons(
    skeletons: Sequence[Sequence[str]], rho: float = 0.75, epsilon: float = 0.5
) -> tuple[list[int], list[int]]:
    """Algorithm 1 steps 3 (suppression) to 5 (clusters) from raw skeletons s̄_i of P. Returns
    ``(cluster_ids, cleaned_skeleton_lengths)``; the lengths L_i = |s_i| feed the singleton-artifact reset."""
    cleaned = suppress_group_cues(skeletons, rho)
    return cluster_cue_vectors(cue_count_vectors(cleaned), epsilon), [len(s) for s in cleaned]


def cue_partition(texts: Sequence[str], rho: float = 0.75, epsilon: float = 0.5) -> list[int]:
    """Cue-GRPO's Strategy-Cue partition of the positive completions ``texts`` (= P of one group; docs/cue_grpo.md#algorithm):
    extract cue skeletons, suppress group-common cues (ρ), bag-of-cues cosine graph (ε), connected components,
    one cluster for empty vectors. Returns one cluster id per text."""
    return partition_skeletons(extract_cues_batch(texts), rho, epsilon)[0]


def random_partition(num_positive: int, num_clusters: int, rng: random.Random) -> list[int]:
    """Random-Cluster ablation (paper Appendix G; docs/cue_grpo.md#partition-sources): each positive completion draws a label uniformly
    from {1..m}, m = ``num_clusters`` (the number of cue clusters of the group). Returns canonical ids."""
    if num_positive == 0:
        return []
    if num_clusters < 1:
        raise ValueError(f"num_clusters must be >= 1 when there are positive completions, got {num_clusters}")
    return canonical_cluster_ids([rng.randint(1, num_clusters) for _ in range(num_positive)])
