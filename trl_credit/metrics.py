"""Repeated-sampling metrics: unbiased pass@k, AUC@K, avg@k and maj@k (docs/design.md#answer-checking, Cue-GRPO §"Repeated-Sampling
Evaluation", Eq. 9, and Appendix C Eq. 10).

Everything here is a pure function of counts or per-sample lists, with no model and no I/O, so each can be
checked by hand. Probabilities are fractions in [0, 1] (the paper's tables show percentages; AUC@K is linear in
the pass@k values, so the scale carries through unchanged).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

__all__ = [
    "AUC_BUDGETS",
    "pass_at_k",
    "mean_pass_at_k",
    "auc_budgets",
    "auc_at_k",
    "avg_at_k",
    "maj_at_k",
    "majority_answer",
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
    """avg@k of one problem: the mean correctness of its first ``k`` samples (all of them when k is None).

    Averaged over problems this is the plain sampled accuracy (an estimate of pass@1 from k samples).
    """
    k = len(correct) if k is None else k
    _check_int("k", k, 1)
    if k > len(correct):
        raise ValueError(f"k must satisfy 1 <= k <= number of samples, got k={k} with {len(correct)} samples")
    return sum(float(x) for x in correct[:k]) / k


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


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool | float], k: int | None = None) -> float:
    """maj@k of one problem: 1.0 if the majority-vote answer of the first ``k`` samples is correct, else 0.0.

    ``answers[i]`` is sample i's normalized answer (None/"" when unparseable) and ``correct[i]`` its reward;
    samples with the same answer string must have the same correctness (true when the answer string is what the
    reward checks). Ties: see :func:`majority_answer` (earliest first occurrence wins). No answer at all -> 0.0.
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers ({len(answers)}) and correct ({len(correct)}) must have one entry per sample")
    k = len(answers) if k is None else k
    _check_int("k", k, 1)
    if k > len(answers):
        raise ValueError(f"k must satisfy 1 <= k <= number of samples, got k={k} with {len(answers)} samples")
    winner = majority_answer(answers[:k])
    return 0.0 if winner is None else float(bool(correct[winner]))
