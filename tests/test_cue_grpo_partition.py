"""Group suppression, bag-of-cues cosine graph, connected components, empty cluster (paper Eqs. 5-7; docs/cue_grpo.md#group-suppression, docs/cue_grpo.md#clusters)."""

import math
import random

import numpy as np

from trl_credit.cue_grpo import (
    NUM_CUES,
    cluster_cue_vectors,
    cue_count_vectors,
    cue_partition,
    partition_skeletons,
    random_partition,
    suppress_group_cues,
)


def test_suppression_is_strictly_more_than_rho_times_p():
    # |P| = 4, rho = 0.75 -> limit 3: conclude is in 4 skeletons (> 3) -> removed;
    # substitute is in 3 (not > 3) -> kept; radicals in 1 -> kept.
    skeletons = [
        ["substitute", "conclude"],
        ["substitute", "conclude"],
        ["conclude", "substitute", "conclude"],
        ["radicals", "conclude"],
    ]
    assert suppress_group_cues(skeletons, rho=0.75) == [["substitute"], ["substitute"], ["substitute"], ["radicals"]]
    # rho = 0.5 -> limit 2: substitute (3 > 2) goes too
    assert suppress_group_cues(skeletons, rho=0.5) == [[], [], [], ["radicals"]]


def test_count_vectors_have_27_coordinates_in_catalog_order():
    vectors = cue_count_vectors([["modulo_op", "conclude", "modulo_op"], []])
    assert vectors.shape == (2, NUM_CUES) == (2, 27)
    assert vectors[0, 0] == 2 and vectors[0, 26] == 1 and vectors[0].sum() == 3 and vectors[1].sum() == 0


def _vectors(*rows):
    out = np.zeros((len(rows), NUM_CUES))
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def test_cosine_threshold_inclusive():
    # a = e1, b = e1 + e2: cos = 1/sqrt(2) = 0.707 -> same cluster at eps 0.5, separate at eps 0.75
    ab = _vectors([1, 0], [1, 1])
    assert cluster_cue_vectors(ab, 0.5) == [0, 0]
    assert cluster_cue_vectors(ab, 0.75) == [0, 1]
    # a = e1, b = e1+e2+e3+e4: cos = 1 / (1 * 2) = 0.5 exactly -> edge at eps = 0.5 (>=), none at 0.51
    edge = _vectors([1, 0, 0, 0], [1, 1, 1, 1])
    assert cluster_cue_vectors(edge, 0.5) == [0, 0]
    assert cluster_cue_vectors(edge, 0.51) == [0, 1]


def test_connected_components_chain_through_an_intermediate_vector():
    # a = e1, b = e1 + e2, c = e2: cos(a,b) = cos(b,c) = 0.707 >= 0.5 but cos(a,c) = 0 -> one cluster via b
    assert cluster_cue_vectors(_vectors([1, 0], [0, 1], [1, 1]), 0.5) == [0, 0, 0]
    assert cluster_cue_vectors(_vectors([1, 0], [0, 1]), 0.5) == [0, 1]


def test_empty_vectors_share_one_cluster():
    assert cluster_cue_vectors(_vectors([], [1], [], [0, 1]), 0.5) == [0, 1, 0, 2]
    assert cluster_cue_vectors(_vectors([], []), 0.5) == [0, 0]
    assert cluster_cue_vectors(np.zeros((0, NUM_CUES)), 0.5) == []


def _reference_components(vectors, epsilon):
    # plain loops: cosine of every pair, BFS; empty vectors together
    n = len(vectors)
    norms = [math.sqrt(sum(x * x for x in v)) for v in vectors]
    label = [None] * n
    next_label = 0
    for start in range(n):
        if label[start] is not None:
            continue
        label[start] = next_label
        if norms[start] == 0:
            for j in range(n):
                if norms[j] == 0:
                    label[j] = next_label
        else:
            queue = [start]
            while queue:
                i = queue.pop()
                for j in range(n):
                    if label[j] is None and norms[j] > 0:
                        cos = sum(a * b for a, b in zip(vectors[i], vectors[j])) / (norms[i] * norms[j])
                        if cos >= epsilon - 1e-9:
                            label[j] = next_label
                            queue.append(j)
        next_label += 1
    return label


def test_components_match_a_plain_loop_reference():
    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(1, 12)
        vectors = np.array([[rng.choice([0, 0, 0, 1, 2]) for _ in range(NUM_CUES)] for _ in range(n)], dtype=float)
        for row in range(n):
            if rng.random() < 0.2:
                vectors[row] = 0
        epsilon = rng.choice([0.3, 0.5, 0.7])
        assert cluster_cue_vectors(vectors, epsilon) == _reference_components(vectors.tolist(), epsilon)


def test_cue_partition_of_hand_written_completions():
    a = "We substitute x = 2 into the equation.\n\nTherefore the answer is \\boxed{4}."
    b = "The root is \\sqrt{16} which is exact.\n\nTherefore the answer is \\boxed{4}."
    c = "It is \\sqrt{16} and we substitute it.\n\nThe root is \\sqrt{16} which is exact.\n\nWe substitute x = 2 into the equation."
    empty = "Therefore the answer is \\boxed{4}."
    # skeletons: a=[substitute, conclude], b=[radicals, conclude], c=[radicals, substitute], empty=[conclude].
    # conclude is in 3 of 4 skeletons, 3 > 0.75*4 = 3 is false -> kept.
    # vectors (substitute, radicals, conclude): a=(1,0,1) b=(0,1,1) c=(1,1,0) e=(0,0,1)
    # cos(a,b) = 1/2 -> edge; cos(a,c) = 1/2 -> edge; cos(a,e) = 1/sqrt2 -> edge: all one cluster
    assert cue_partition([a, b, c, empty]) == [0, 0, 0, 0]
    # with rho = 0.5 (limit 2): conclude (3) and radicals... radicals is in b, c only (2, kept); substitute in a, c (kept)
    # a=(1,0) b=(0,1) c=(1,1) e=() -> a-c, b-c edges (0.707): one cluster {a,b,c}; e alone (empty)
    assert cue_partition([a, b, c, empty], rho=0.5) == [0, 0, 0, 1]
    ids, lengths = partition_skeletons([["substitute", "conclude"], ["conclude"]], rho=0.75)
    # conclude in 2 of 2 > 1.5 -> suppressed: lengths 1 and 0; second vector empty -> its own cluster
    assert ids == [0, 1] and lengths == [1, 0]


def test_random_partition_is_seeded_and_bounded():
    first = random_partition(10, 3, random.Random("seed"))
    assert first == random_partition(10, 3, random.Random("seed"))
    assert len(first) == 10 and len(set(first)) <= 3 and first[0] == 0  # canonical ids
    assert random_partition(5, 1, random.Random(0)) == [0] * 5
    assert random_partition(0, 0, random.Random(0)) == []
