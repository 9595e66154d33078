"""The tool grid's claims as a group-sequential plan (docs/testbed.md#the-tool-grid): a method's reported seeds come
in at looks of 4, 8 and 16 pairs with GRPO (always its first seeds: 0-3, 0-7, 0-15), and a comparison may be shown
at an interim look, so a method whose three comparisons are all shown there needs no more seeds.

Error spending (Lan & DeMets 1983), O'Brien-Fleming type: by information fraction t = n / 16 the plan has spent
alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t)) of alpha = 0.05 (t = 1/4: 8.9e-5, 1/2: 0.0056, 1: 0.05). Look k may
spend alpha(t_k) - alpha(t_{k-1}). The interim looks test Bonferroni over the whole planned family (FAMILY: every
method against GRPO on three metrics): a comparison is shown at look k when its paired t-test on the look's seeds
gives p < (alpha(t_k) - alpha(t_{k-1})) / FAMILY. The last look runs Holm's step-down over the whole family at what
is left, alpha - alpha(t_{K-1}), the comparisons shown at an interim look entered as rejected (p = 0) and those not
run to 16 pairs as p = 1. The union bound over looks keeps the family-wise error rate at or below alpha whatever the
correlation between looks (Bonferroni across looks: conservative, and the only assumption is each look's own t-test).

A look between the planned ones (6 pairs, say) is no look: the verdict stays the last planned look's.
"""

from __future__ import annotations

import math

from scipy import stats

import multiplicity

ALPHA = 0.05
LOOKS = (4, 8, 16)
#: Every method the grid compares with GRPO (tool_grid's methods but GRPO), three metrics each.
PLANNED_METHODS = ("datpo", "oppo", "prime", "process", "srpo", "srpo_oracle")
METRICS_PER_METHOD = 3
FAMILY = len(PLANNED_METHODS) * METRICS_PER_METHOD


def spent(n: int, planned: int = LOOKS[-1], alpha: float = ALPHA) -> float:
    """alpha(t), t = n / planned: the error the plan may have spent once n pairs are in (0 before any)."""
    if n <= 0:
        return 0.0
    t = min(1.0, n / planned)
    return float(2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(t)))


def look_budget(k: int) -> float:
    """What look k (0-based, of LOOKS) may spend: alpha(t_k) - alpha(t_{k-1})."""
    return spent(LOOKS[k]) - (spent(LOOKS[k - 1]) if k else 0.0)


def interim_threshold(k: int) -> float:
    """A comparison is shown at interim look k when its p-value is below this."""
    return look_budget(k) / FAMILY


def judge(diffs_by_key: dict) -> dict:
    """{key: verdict} for every comparison (key: (method, metric); diffs: the paired differences in seed order). A
    verdict: ``dict(shown=bool, look=pairs or None, p=...)``, where ``look`` is the pairs of the look that showed
    it, or for one not shown the last planned look it reached (None under the first)."""
    unplanned = sorted({method for method, _ in diffs_by_key} - set(PLANNED_METHODS))
    if unplanned:
        raise ValueError(f"{unplanned} are not in the plan's family (PLANNED_METHODS: {PLANNED_METHODS})")
    verdicts: dict = {}
    for key, diffs in diffs_by_key.items():
        reached = [n for n in LOOKS if len(diffs) >= n]
        verdicts[key] = dict(shown=False, look=reached[-1] if reached else None, p=None)
        for k, n in enumerate(LOOKS[:-1]):  # the interim looks this comparison reached, in order
            if len(diffs) < n:
                break
            p = multiplicity.paired_t_pvalue(diffs[:n])
            verdicts[key]["p"] = p
            if p < interim_threshold(k):
                verdicts[key] = dict(shown=True, look=n, p=p)
                break
    final = {key: multiplicity.paired_t_pvalue(diffs[:LOOKS[-1]]) for key, diffs in diffs_by_key.items()
             if len(diffs) >= LOOKS[-1] and not verdicts[key]["shown"]}
    early = [key for key, v in verdicts.items() if v["shown"]]
    keys = early + list(final)
    pvalues = [0.0] * len(early) + list(final.values()) + [1.0] * (FAMILY - len(keys))
    adjusted = multiplicity.holm(pvalues)
    level = ALPHA - spent(LOOKS[-2])
    for key, p, adj in zip(keys[len(early):], pvalues[len(early):], adjusted[len(early):]):
        verdicts[key] = dict(shown=adj <= level, look=LOOKS[-1], p=p, adjusted=adj, level=level)
    return verdicts


def stopped(verdicts: dict, method: str) -> bool:
    """A method needs no more seeds once every one of its comparisons is shown."""
    mine = [v for (m, _), v in verdicts.items() if m == method]
    return bool(mine) and all(v["shown"] for v in mine)
