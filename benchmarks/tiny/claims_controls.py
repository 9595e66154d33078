"""The controls of a claim "A beats B" of the trap grid (regime_claims.py): the same claim with both methods at one
learning rate (``same_rate.py``'s runs), at equal generated tokens (DATPO's), and the sweep's choice of rate on every
sweep seed beside the two the grid was chosen on. Each table counts its comparisons and marks the verdicts that
survive Holm's correction over them (multiplicity.py). Called by regime_claims.report.
"""

from __future__ import annotations

import json
import os
import statistics

from multiplicity import adjust_family, family_counts
from regime_claims import (CLAIMS, METRICS, _cell, hard_problems, metric, paired_diffs, run_tokens,
                           token_ratio)
from tiny_report import LABELS


def metric_at_tokens(run: dict, name: str, problems: list[int] | None, tokens: float) -> float | None:
    """The run's ``metric`` when it had generated ``tokens``: linear in cumulative generated tokens between the two
    evaluations around that count (an evaluation exactly there: its value); None past the run's last evaluation."""
    points = [(p.get("generated_tokens"), metric(run, name, problems, p)) for p in run["curve"]]
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if t0 is not None and t1 is not None and t0 <= tokens <= t1:
            if v0 is None or v1 is None:
                return None
            return v1 if t1 == t0 else v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)
    return None


def metric_at_evaluation(run: dict, name: str, problems: list[int] | None, tokens: float, side: str) -> float | None:
    """The run's ``metric`` at its first evaluation with at least ``tokens`` generated (``side`` "after") or its
    last with at most that many ("before"); None where there is none."""
    points = [p for p in run["curve"] if p.get("generated_tokens") is not None]
    chosen = ([p for p in points if p["generated_tokens"] >= tokens][:1] if side == "after"
              else [p for p in points if p["generated_tokens"] <= tokens][-1:])
    return metric(run, name, problems, chosen[0]) if chosen else None


#: how the run that generated more tokens is read at the other's count: linear between its evaluations around it,
#: or at the evaluation that leaves A at least as many tokens as B (a bound for curves that rise with tokens)
READINGS = ("linear", "a_at_least")


def token_matched_diffs(runs: dict, a: str, b: str, name: str, problems: list[int] | None,
                        reading: str = "linear") -> tuple[list, list]:
    """Per seed both ran, A - B at equal generated tokens: the budget is the smaller of the two runs' token counts,
    the other run is read at its end and the run that generated more at the budget: ``reading`` "linear"
    (metric_at_tokens), or "a_at_least": A (if larger) at its first evaluation at or past the budget, B (if larger)
    at its last at or before it, so A has at least B's tokens (an upper bound on A - B at equal tokens when accuracy
    rises with tokens). The differences and the budgets."""
    diffs, budgets = [], []
    for seed in sorted(set(runs.get(a, {})) & set(runs.get(b, {}))):
        ra, rb = runs[a][seed], runs[b][seed]
        ta, tb = run_tokens(ra), run_tokens(rb)
        if ta is None or tb is None:
            continue
        budget = min(ta, tb)
        if reading == "linear":
            va, vb = metric_at_tokens(ra, name, problems, budget), metric_at_tokens(rb, name, problems, budget)
        else:
            va = metric_at_evaluation(ra, name, problems, budget, "after")
            vb = metric_at_evaluation(rb, name, problems, budget, "before")
        if va is not None and vb is not None:
            diffs.append(va - vb)
            budgets.append(budget)
    return diffs, budgets


#: the claims read at equal generated tokens too: DATPO's, whose trees generate 0.6-1.9x GRPO's tokens
TOKEN_MATCHED_METHODS = ("datpo", "datpo_matched")


def token_matched_table(runs: dict, base_eval: dict) -> tuple[str, list[dict]]:
    """The claims of a TOKEN_MATCHED_METHODS method read at equal generated tokens (token_matched_diffs: the run
    that generated more, read where it had generated as many as the other), with Holm over this table's cells."""
    hard = hard_problems(base_eval)
    rows = []
    for claim, a, b, which in CLAIMS:
        if (a in TOKEN_MATCHED_METHODS or b in TOKEN_MATCHED_METHODS) and a in runs and b in runs:
            for reading in READINGS:
                read = {m: token_matched_diffs(runs, a, b, m, hard if which == "hard" else None, reading)
                        for m in METRICS}
                rows.append(dict(claim=claim, a=a, b=b, problems=which, reading=reading,
                                 diffs={m: d for m, (d, _) in read.items()},
                                 budget=statistics.fmean(read["t1"][1]) if read["t1"][1] else None))
    if not rows:
        return "", []
    family = adjust_family({(r["claim"], r["reading"], m): d for r in rows for m, d in r["diffs"].items()})
    count, unadjusted, survive = family_counts(family)
    lines = ["Per seed, the run that generated fewer tokens is read at its end and the other where it had generated "
             "as many: *linear*, linear in cumulative generated tokens between its two evaluations around that count "
             "(under a curve that rises fastest early, this understates the run read between evaluations); *A at "
             "least B's tokens*, at the evaluation that leaves A at least as many tokens as B (for curves that rise "
             "with tokens, an upper bound on A - B at equal tokens: a reverse there holds at equal tokens too). "
             f"**Comparisons: {count}**; {unadjusted} significant unadjusted, {survive} survive Holm over them.", "",
             "| claim | A - B (problems) | reading | seeds | generated tokens A / B over the run | equal-token budget "
             "(mean) | greedy accuracy | pass@8 (T=1) | accuracy at T=1 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        cells = [_cell(r["diffs"][m], family[(r["claim"], r["reading"], m)]) for m in METRICS]
        r["holm_p"] = {m: family[(r["claim"], r["reading"], m)][1] for m in METRICS}
        budget = "-" if r["budget"] is None else f"{r['budget']:.0f}"
        reading = "linear" if r["reading"] == "linear" else "A at least B's tokens"
        lines.append(f"| {r['claim']} | {LABELS.get(r['a'], r['a'])} - {LABELS.get(r['b'], r['b'])} ({r['problems']}) "
                     f"| {reading} | {max(len(d) for d in r['diffs'].values())} | {token_ratio(runs, r['a'], r['b'])} | "
                     f"{budget} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", rows


def load_same_rate(directory: str) -> dict[tuple[str, float], dict[int, dict]]:
    """The runs of ``same_rate.py`` in ``directory``: {(method, learning rate): {seed: run}}."""
    runs: dict[tuple[str, float], dict[int, dict]] = {}
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.endswith(".json") and "_seed" in name:
            with open(os.path.join(directory, name)) as f:
                run = json.load(f)
            runs.setdefault((run["method"], run["learning_rate"]), {})[run["seed"]] = run
    return runs


def same_rate_claims(runs: dict, same_rate: dict, base_eval: dict) -> list[dict]:
    """Per claim of :data:`CLAIMS` whose two methods ran the grid at different rates, and per rate at which both
    have runs (a grid run at its own rate or a ``same_rate.py`` run): the paired differences per metric."""
    hard = hard_problems(base_eval)
    by_rate: dict[tuple[str, float], dict[int, dict]] = dict(same_rate)
    for method, by_seed in runs.items():
        by_rate.setdefault((method, next(iter(by_seed.values()))["learning_rate"]), by_seed)
    out = []
    for claim, a, b, which in CLAIMS:
        if a not in runs or b not in runs:
            continue
        rate_a, rate_b = (next(iter(runs[m].values()))["learning_rate"] for m in (a, b))
        if rate_a == rate_b:
            continue
        for rate in sorted({r for m, r in by_rate if m == a} & {r for m, r in by_rate if m == b}):
            pair = {a: by_rate[(a, rate)], b: by_rate[(b, rate)]}
            out.append(dict(claim=claim, a=a, b=b, problems=which, rate=rate, grid_rates=(rate_a, rate_b),
                            tokens=token_ratio(pair, a, b),
                            diffs={m: paired_diffs(pair, a, b, m, hard if which == "hard" else None)
                                   for m in METRICS}))
    return out


def same_rate_table(pairs: list[dict]) -> tuple[str, dict]:
    """The claims whose pair differs in rate in the grid, read at one common rate, with Holm over this table's
    cells; the table and {(claim, rate, metric): (p, Holm p)}."""
    family = adjust_family({(c["claim"], c["rate"], m): d for c in pairs for m, d in c["diffs"].items()})
    count, unadjusted, survive = family_counts(family)
    lines = ["Claims whose two methods trained the grid at different learning rates, with both at one rate (the "
             "grid's run where its rate is that one, else a run of `benchmarks/tiny/same_rate.py` on the same seeds). "
             f"**Comparisons: {count}**; {unadjusted} significant unadjusted, {survive} survive Holm over them.", "",
             "| claim | A - B (problems) | grid rates A / B | common rate | seeds | greedy accuracy | pass@8 (T=1) | "
             "accuracy at T=1 | generated tokens A / B |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in pairs:
        cells = [_cell(c["diffs"][m], family[(c["claim"], c["rate"], m)]) for m in METRICS]
        seeds = max(len(d) for d in c["diffs"].values())
        lines.append(f"| {c['claim']} | {LABELS.get(c['a'], c['a'])} - {LABELS.get(c['b'], c['b'])} ({c['problems']}) "
                     f"| {c['grid_rates'][0]:g} / {c['grid_rates'][1]:g} | {c['rate']:g} | {seeds} | "
                     + " | ".join(cells) + f" | {c['tokens']} |")
    return "\n".join(lines) + "\n", family


def sweep_seeds_table(two: dict, every: dict) -> str:
    """Each method's learning rate chosen on the first two sweep seeds (what the grid trained with) and on every
    sweep seed run, with the mean sweep AUC per rate and the seeds behind it (``tiny_report.sweep_choices``)."""
    lines = ["| method | chosen on seeds 100-101 (grid) | chosen on every sweep seed | seeds per rate | sweep AUC per "
             "rate, every seed |", "| --- | --- | --- | --- | --- |"]
    for method in sorted(every, key=lambda m: LABELS.get(m, m)):
        runs = sorted(set(every[method]["sweep_runs"].values()))
        aucs = ", ".join(f"{r}: {a:.3f}" for r, a in every[method]["sweep_auc"].items())
        old = two.get(method, {}).get("learning_rate")
        new = every[method]["learning_rate"]
        if len(runs) > 1:  # rates swept on different numbers of seeds: only the rates on the most seeds compete
            most = max(runs)
            full = {r: a for r, a in every[method]["sweep_auc"].items() if every[method]["sweep_runs"][r] == most}
            best = max(full, key=full.get)
            changed = "" if old is None or float(best) == old else " (changed)"
            chosen = f"{float(best):g}{changed} (among the rates on {most} seeds)"
        else:
            chosen = f"{new:g}" + ("" if old is None or old == new else " (changed)")
        lines.append(f"| {LABELS.get(method, method)} | {'-' if old is None else f'{old:g}'} | {chosen} | "
                     f"{'/'.join(map(str, runs))} | {aucs} |")
    return "\n".join(lines) + "\n"
