"""How many comparisons a claims table makes, and which of its verdicts survive Holm's correction over them.

Every verdict of a claims table (``tiny_report.py``, ``regime_claims.py``) reads a 95% t-interval of paired
differences over seeds: it excludes 0 exactly when the two-sided paired t-test over seeds (the one-sample t-test of
the per-seed differences against 0, n - 1 degrees of freedom) gives p < 0.05. That same test's p-value is what
Holm's step-down procedure (Holm 1979) adjusts over the m comparisons of the table: a verdict that "holds" or shows
"the reverse" survives when its adjusted p-value is below 0.05 too, and holds only unadjusted otherwise.
"""

from __future__ import annotations

import math
import statistics

from scipy import stats

ALPHA = 0.05


def paired_t_pvalue(diffs: list[float]) -> float | None:
    """Two-sided p-value of the paired t-test over seeds (mean of ``diffs`` against 0, len - 1 degrees of freedom):
    the test whose 95% interval tiny_report.interval gives. None under two values; with no spread, 1.0 for a mean of
    0 and 0.0 otherwise (every seed moves the same way by the same amount)."""
    if len(diffs) < 2:
        return None
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    t = mean / (sd / math.sqrt(len(diffs)))
    return float(2 * stats.t.sf(abs(t), len(diffs) - 1))


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sort ascending, the i-th smallest (i = 0, 1, ...) is
    multiplied by (m - i), capped at 1, and made non-decreasing along the sorted order (a running maximum). A
    comparison survives the correction at level alpha when its adjusted p-value is <= alpha; this controls the
    family-wise error rate over all m comparisons without assuming them independent."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[index]))
        adjusted[index] = running
    return adjusted


def holm_note(p: float | None, adjusted: float | None, alpha: float = ALPHA) -> str:
    """The words a verdict gains: whether its significance survives Holm over the table (empty for a comparison
    that is not significant unadjusted, or not tested)."""
    if p is None or adjusted is None or p >= alpha:
        return ""
    if adjusted <= alpha:
        return f"survives Holm (adj. p {adjusted:.2g})"
    return f"unadjusted only: not after Holm (adj. p {adjusted:.2g})"


def adjust_family(diffs_by_key: dict) -> dict:
    """{key: (p, Holm-adjusted p)} over every entry with at least 2 paired seeds (the family: those entries); the
    others map to (None, None). ``diffs_by_key``: {key: list of paired differences}."""
    tested = {key: paired_t_pvalue(d) for key, d in diffs_by_key.items()}
    keys = [key for key, p in tested.items() if p is not None]
    adjusted = dict(zip(keys, holm([tested[k] for k in keys])))
    return {key: (tested[key], adjusted.get(key)) for key in diffs_by_key}


def family_counts(family: dict, alpha: float = ALPHA) -> tuple[int, int, int]:
    """(comparisons, significant unadjusted, surviving Holm) of a family from :func:`adjust_family`: the entries
    tested (2 or more paired seeds), those with p < ``alpha``, and those whose Holm-adjusted p is <= ``alpha``."""
    tested = [(p, adjusted) for p, adjusted in family.values() if p is not None]
    return (len(tested), sum(p < alpha for p, _ in tested), sum(adjusted <= alpha for _, adjusted in tested))
