"""Repeated-sampling metrics: unbiased pass@k, AUC@K, avg@k and maj@k (docs/design.md#answer-checking, Cue-GRPO §"Repeated-Sampling
Evaluation", Eq. 9, and Appendix C Eq. 10).

Everything here is a pure function of counts or per-sample lists, with no model and no I/O, so each can be
checked by hand. Probabilities are fractions in [0, 1] (the paper's tables show percentages; AUC@K is linear in
the pass@k values, so the scale carries through unchanged).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from math import comb

__all__ = [
    "AUC_BUDGETS",
    "pass_at_k",
    "mean_pass_at_k",
    "auc_budgets",
    "auc_at_k",
    "avg_at_k",
    "maj_at_k",
    "maj_at_ks",
    "majority_answer",
    "MAJ_MAX_SAMPLES",
]

#: The sampling budgets of Cue-GRPO Eq. 9: AUC@K integrates pass@k over the ones in [1, K].
AUC_BUDGETS: tuple[int, ...] = (1, 4, 8, 16, 32, 64, 128, 256)


def _check_int(name: str, value, minimum: int) -> int:
    # numbers.Integral also admits numpy/torch-free integer scalars such as numpy.int64 counts.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from ``n`` samples of which ``c`` are correct (Chen et al. 2021).

    pass@k = 1 - C(n-c, k) / C(n, k)   (Cue-GRPO Appendix C, Eq. 10, one problem), with C(a, b) = 0 for a < b.

    The ratio of binomials is evaluated as the product C(n-c, k)/C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i), which is
    exact in float arithmetic for any n (no factorials, no overflow). Edge cases: ``c == 0`` gives 0 and
    ``n - c < k`` gives 1 (every k-subset contains a correct sample).

    Raises ``ValueError`` unless ``1 <= k <= n`` and ``0 <= c <= n``.
    """
    n, c, k = _check_int("n", n, 1), _check_int("c", c, 0), _check_int("k", k, 1)
    if k > n:
        raise ValueError(f"k must satisfy 1 <= k <= n (the number of samples), got k={k}, n={n}")
    if c > n:
        raise ValueError(f"c (correct samples) must satisfy 0 <= c <= n, got c={c}, n={n}")
    if c == 0:
        return 0.0
    if n - c < k:
        return 1.0
    none_correct = 1.0
    for i in range(n - c + 1, n + 1):
        none_correct *= 1.0 - k / i
    return 1.0 - none_correct


def mean_pass_at_k(num_samples: int | Sequence[int], num_correct: Sequence[int], k: int) -> float:
    """pass@k of a benchmark: the mean of :func:`pass_at_k` over problems (Cue-GRPO Eq. 10).

    ``num_samples`` is one n shared by all problems or one n per problem; ``num_correct`` has one c per problem.
    """
    if len(num_correct) == 0:
        raise ValueError("num_correct must hold one count per problem; got no problems")
    if isinstance(num_samples, numbers.Integral):
        num_samples = [num_samples] * len(num_correct)
    if len(num_samples) != len(num_correct):
        raise ValueError(
            f"num_samples has {len(num_samples)} entries but num_correct has {len(num_correct)}: give one per problem"
        )
    return sum(pass_at_k(n, c, k) for n, c in zip(num_samples, num_correct)) / len(num_correct)


def auc_budgets(max_k: int) -> list[int]:
    """The budgets {1, 4, 8, 16, 32, 64, 128, 256} ∩ [1, max_k] used by AUC@max_k (Cue-GRPO Eq. 9)."""
    _check_int("K", max_k, 1)
    return [k for k in AUC_BUDGETS if k <= max_k]


def auc_at_k(pass_by_k: Mapping[int, float], K: int) -> float:
    """Normalized trapezoidal area under the pass@k curve on the linear k axis (Cue-GRPO Eq. 9).

    With the ordered budgets k_1 < ... < k_m = {1,4,8,16,32,64,128,256} ∩ [1, K] and p_j = pass@k_j:

        AUC@K = 1/(k_m - k_1) * sum_{j=1}^{m-1} (k_{j+1} - k_j) (p_j + p_{j+1}) / 2

    Eq. 9 writes the normalizer as 1/(K-1); that is k_m - k_1 whenever K is one of the budgets (every AUC the
    paper reports). For another K (e.g. K=100) we divide by the span actually integrated (here 64 - 1), so AUC@K
    stays an average pass rate in [0, 1] instead of treating the curve as 0 beyond the last budget.

    ``pass_by_k`` maps k -> pass@k and must contain every budget in [1, K] (extra keys are ignored). AUC needs
    two budgets, so ``K >= 4``.
    """
    _check_int("K", K, 1)
    budgets = auc_budgets(K)
    if len(budgets) < 2:
        raise ValueError(f"AUC@K needs at least two budgets from {AUC_BUDGETS}, i.e. K >= 4; got K={K}")
    missing = [k for k in budgets if k not in pass_by_k]
    if missing:
        raise ValueError(f"pass_by_k lacks pass@k for k={missing}, which AUC@{K} integrates over (budgets {budgets})")
    area = 0.0
    for left, right in zip(budgets, budgets[1:]):
        area += (right - left) * (pass_by_k[left] + pass_by_k[right]) / 2.0
    return area / (budgets[-1] - budgets[0])


def avg_at_k(correct: Sequence[bool | float], k: int | None = None) -> float:
    """avg@k of one problem: the expected mean correctness of k samples drawn without replacement from its n.

    Over a uniformly random k-subset of the n samples this expectation is c/n for every k (c = the number of
    correct samples, or the sum of fractional rewards), so avg@k is the plain sampled accuracy, the same for every
    k and equal to pass@1: the unbiased estimator, as :func:`pass_at_k` is for pass@k. (The mean of the *first* k
    samples is an estimate from k of the n samples only.) ``k`` is validated (1 <= k <= n) but does not change the
    value.
    """
    k = len(correct) if k is None else k
    _check_int("k", k, 1)
    if k > len(correct):
        raise ValueError(f"k must satisfy 1 <= k <= number of samples, got k={k} with {len(correct)} samples")
    return sum(float(x) for x in correct) / len(correct)


def majority_answer(answers: Sequence[str | None]) -> int | None:
    """Index of the sample whose answer wins the majority vote, or None when no sample has an answer.

    Votes are over exact (already normalized) answer strings; ``None`` and ``""`` (unparseable) do not vote.
    Tie rule: among answers with the most votes, the one whose first occurrence comes earliest in sample
    order wins, so the result is deterministic and does not depend on dict/hash order. The returned index is
    that first occurrence.
    """
    votes: dict[str, int] = {}
    first_index: dict[str, int] = {}
    for index, answer in enumerate(answers):
        if answer is None or answer == "":
            continue
        votes[answer] = votes.get(answer, 0) + 1
        first_index.setdefault(answer, index)
    if not votes:
        return None
    best = max(votes.values())
    return min(first_index[a] for a, count in votes.items() if count == best)


#: maj@k is computed in float64 from counts of k-subsets, which reach C(n, k) <= 2**n: exact to rounding up to
#: this many samples per problem (C(1000, 500) ~ 2.7e299 < 1.8e308).
MAJ_MAX_SAMPLES = 1000


def _voting_classes(answers: Sequence[str | None], correct: Sequence[bool | float]) -> list[tuple[int, bool]]:
    """(votes, is_correct) of each distinct answer; samples without an answer (None or "") do not vote."""
    classes: dict[str, list] = {}
    for answer, right in zip(answers, correct):
        if answer is None or answer == "":
            continue
        entry = classes.setdefault(answer, [0, bool(right)])
        if entry[1] != bool(right):
            raise ValueError(
                f"samples with the answer {answer!r} do not all have the same correctness: maj@k needs the voting "
                "key to be what the reward checks (one verdict per distinct answer)"
            )
        entry[0] += 1
    return [(votes, right) for votes, right in classes.values()]


def _times(rows, poly: Sequence[int], length: int):
    """Each row (a polynomial in z) times ``poly``, truncated to ``length`` coefficients."""
    import numpy as np

    if len(poly) <= len(rows):  # short kernel: one shifted add per term, over all rows at once
        out = np.zeros_like(rows)
        for shift, coefficient in enumerate(poly):
            out[:, shift:] += float(coefficient) * rows[:, : length - shift]
        return out
    poly = np.asarray(poly, dtype=float)
    return np.stack([np.convolve(row, poly)[:length] for row in rows])


def maj_at_ks(answers: Sequence[str | None], correct: Sequence[bool | float]) -> list[float]:
    """maj@k of one problem for every k = 1..n (element k - 1): see :func:`maj_at_k` for the definition.

    Exact (to float rounding) by a dynamic programme over the distinct answers instead of the C(n, k) subsets:
    for each value v of the winning vote count, the product over answers of their count polynomials
    sum_x C(votes_i, x) z^x (x < v, or x = v marking a tie) is expanded, tracking the number t of answers at v and
    the number of correct ones among them; [z^k] of the tied configurations weighted by (correct at v) / t,
    times the non-voting samples' (1 + z)^m, counts the credit over all k-subsets, divided by C(n, k). Cost
    about (largest vote count) x (distinct answers)^2 convolutions of length n: ~0.1 s on a CPU for n = 256 with a
    handful of answers. Up to :data:`MAJ_MAX_SAMPLES` samples (float64 range of C(n, k)); more raise ValueError.
    """
    import numpy as np

    if len(answers) != len(correct):
        raise ValueError(f"answers ({len(answers)}) and correct ({len(correct)}) must have one entry per sample")
    n = len(answers)
    _check_int("number of samples", n, 1)
    if n > MAJ_MAX_SAMPLES:
        raise ValueError(
            f"maj@k is computed exactly for up to {MAJ_MAX_SAMPLES} samples per problem (float64 range of C(n, k)), "
            f"got {n}"
        )
    classes = _voting_classes(answers, correct)
    credit = np.zeros(n + 1)  # credit[k]: sum over k-subsets of the majority vote's credit
    for v in range(1, max((votes for votes, _ in classes), default=0) + 1):
        ties = sum(votes >= v for votes, _ in classes)  # answers that can have exactly v votes
        # ways[t, s]: subsets of size s of the answers so far where every answer has <= v votes and t have v;
        # right[t, s]: the same subsets weighted by how many of the t answers at v are correct.
        ways, right = np.zeros((ties + 1, n + 1)), np.zeros((ties + 1, n + 1))
        ways[0, 0] = 1.0
        for votes, is_correct in classes:
            below = [comb(votes, x) for x in range(min(v, votes + 1))]
            new_ways, new_right = _times(ways, below, n + 1), _times(right, below, n + 1)
            if votes >= v:  # this answer at exactly v: one more tie, z^v
                at = float(comb(votes, v))
                new_ways[1:, v:] += at * ways[:-1, : n + 1 - v]
                new_right[1:, v:] += at * (right[:-1, : n + 1 - v] + (ways[:-1, : n + 1 - v] if is_correct else 0.0))
            ways, right = new_ways, new_right
        for t in range(1, ties + 1):  # t tied answers: a uniformly random one of them wins
            credit += right[t] / t
    silent = n - sum(votes for votes, _ in classes)
    credit = _times(credit[None], [comb(silent, x) for x in range(silent + 1)], n + 1)[0]
    # min: float rounding can put a certain win a few ulps above 1
    return [min(1.0, float(credit[k]) / comb(n, k)) for k in range(1, n + 1)]


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool | float], k: int | None = None) -> float:
    """maj@k of one problem: the probability, over a uniformly random k-subset of its n samples (drawn without
    replacement), that the subset's majority-vote answer is correct (all n samples when k is None).

    ``answers[i]`` is sample i's normalized answer (None/"" when unparseable: it does not vote) and ``correct[i]``
    its reward; samples with the same answer must have the same correctness (the answer string is what the reward
    checks; otherwise ValueError). Tie rule: a tie among t answers is broken uniformly at random, i.e. the subset
    earns (number of correct answers among the t) / t. A subset in which no sample has an answer earns 0.
    Averaged over the subsets this is the unbiased estimator of maj@k from n >= k samples (as :func:`pass_at_k` is
    for pass@k); maj@n is the majority vote of all n samples. Computed exactly by :func:`maj_at_ks` (up to
    :data:`MAJ_MAX_SAMPLES` samples).
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers ({len(answers)}) and correct ({len(correct)}) must have one entry per sample")
    k = len(answers) if k is None else k
    _check_int("k", k, 1)
    if k > len(answers):
        raise ValueError(f"k must satisfy 1 <= k <= number of samples, got k={k} with {len(answers)} samples")
    return maj_at_ks(answers, correct)[k - 1]


def wilson_interval(hits: int, total: int, z: float = 1.959964) -> list[float] | None:
    """Wilson score interval of the rate ``hits / total`` (95% for the default ``z``), bounds rounded to 4 decimals;
    None for ``total`` 0. Unlike the normal approximation it stays inside [0, 1] at rates near 0 or 1 and small
    counts, which is where localization and fork counts on small runs sit."""
    if not total:
        return None
    p = hits / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return [round(centre - half, 4), round(centre + half, 4)]
