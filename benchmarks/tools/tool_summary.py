"""The tool regime grid's summary (``python benchmarks/tools/tool_grid.py summary``): summary.json and report.md under
benchmarks/results/tools/.

- The sweep: each method's mean final T=1 accuracy per rate over its sweep seeds, and the rate chosen.
- The claims: every method against GRPO on the reported seeds both ran (paired by seed), on three metrics: greedy
  accuracy (256 held-out chains), T=1 accuracy and pass@8 (8 samples on the first 64). Each cell is the mean paired
  difference with its 95% t-interval; the verdicts follow the grid's group-sequential plan (sequential.py: looks at 4,
  8 and 16 pairs, error spent by an O'Brien-Fleming-type function, Holm over the planned family at the last look); a
  difference not shown at 16 pairs gets the smallest one its seeds could detect (80% power, alpha 0.05: the MDE).
  Generated model tokens are reported beside every row, as a ratio to GRPO's on the same seeds: the methods are
  compared at equal optimizer steps, DATPO at equal tokens (``tool_grid.method_steps``).
- The length question: the process oracle's greedy edge per number of trap keys and of calls, beside what
  compounding its one-trap gain predicts, and whether the excess over that grows with the chain (per-seed slopes,
  their own family of two for Holm).
"""

from __future__ import annotations

import json
import math
import os
import statistics

import multiplicity
import sequential
from tiny_report import interval, minimum_detectable

# runs as their JSON holds them (pass@k keyed by the string of k)
METRICS = {"greedy": lambda run: run["final"]["greedy_accuracy"], "T=1": lambda run: run["final"]["accuracy"],
           "pass@8": lambda run: run["final"]["pass_at_k"]["8"]}


def _table_order(run: dict) -> tuple:
    """GRPO first, then by method, then by rate as a number (5e-05 before 0.0001)."""
    return run["method"] != "grpo", run["method"], run.get("learning_rate", 0.0)


def by_method(runs: list[dict]) -> dict[str, dict[int, dict]]:
    """Runs keyed by method, then seed; methods in table order (:func:`levels_table` keeps it)."""
    out: dict = {}
    for run in sorted(runs, key=_table_order):
        out.setdefault(run["method"], {})[run["seed"]] = run
    return out


def by_method_rate(runs: list[dict]) -> dict[str, dict[int, dict]]:
    """As :func:`by_method`, keyed ``"method (rate)"``: a sweep runs a method at several rates on a seed."""
    out: dict = {}
    for run in sorted(runs, key=_table_order):
        out.setdefault(f"{run['method']} ({run['learning_rate']:g})", {})[run["seed"]] = run
    return out


def claims(runs: dict) -> list[dict]:
    """Every method against GRPO, per metric: the paired differences over the seeds both ran."""
    rows = []
    for method in sorted(m for m in runs if m != "grpo"):
        seeds = sorted(set(runs[method]) & set(runs.get("grpo", {})))
        tokens = [runs[method][s]["generated_tokens"] / runs["grpo"][s]["generated_tokens"] for s in seeds]
        for metric, value in METRICS.items():
            diffs = [value(runs[method][s]) - value(runs["grpo"][s]) for s in seeds]
            rows.append(dict(method=method, metric=metric, seeds=seeds, diffs=diffs,
                             token_ratio=statistics.fmean(tokens) if tokens else None))
    return rows


def _verdict(diffs: list[float], p, adjusted) -> str:
    if len(diffs) < 2:
        return "not tested (fewer than 2 paired seeds)"
    mean, half = interval(diffs)
    note = multiplicity.holm_note(p, adjusted)
    if mean - half > 0:
        return f"higher than GRPO; {note}"
    if mean + half < 0:
        return f"lower than GRPO; {note}"
    mde = minimum_detectable(diffs)
    return "not shown (MDE " + ("n/a under 3 seeds" if math.isnan(mde) else f"{mde:.3f}") + ")"


#: The grid's plan: every method paired with GRPO on seeds 0-15, looked at after 4, 8 and 16 (sequential.py).
PLANNED_PAIRS = sequential.LOOKS[-1]


def claims_table(rows: list[dict]) -> tuple[str, dict]:
    """The claims table of a fixed number of pairs: every row's paired t-test, Holm over the rows tested."""
    family = multiplicity.adjust_family({(r["method"], r["metric"]): r["diffs"] for r in rows})
    compared, unadjusted, surviving = multiplicity.family_counts(family)
    lines = [f"{compared} comparisons (every method against GRPO on three metrics): {unadjusted} significant "
             f"unadjusted, {surviving} after Holm.", "", _HEADER]
    for r in rows:
        lines.append(_row(r, _verdict(r["diffs"], *family[(r["method"], r["metric"])])))
    counts = dict(comparisons=compared, significant_unadjusted=unadjusted, surviving_holm=surviving)
    return "\n".join(lines) + "\n", counts


_HEADER = ("| method | metric | seeds | difference vs GRPO (95% CI) | verdict | tokens vs GRPO |\n"
           "| --- | --- | --- | --- | --- | --- |")


def _row(r: dict, verdict: str) -> str:
    mean, half = interval(r["diffs"]) if r["diffs"] else (math.nan, math.nan)
    ratio = "-" if r["token_ratio"] is None else f"{r['token_ratio']:.2f}x"
    spread = f"{mean:+.3f}" + ("" if math.isnan(half) else f" ± {half:.3f}")  # one pair: no interval
    return f"| {r['method']} | {r['metric']} | {len(r['seeds'])} | {spread} | {verdict} | {ratio} |"


def sequential_table(rows: list[dict]) -> tuple[str, dict]:
    """The reported seeds' claims table under the grid's sequential plan (sequential.py): each verdict is read at
    the last planned look its pairs reached, and says which look showed it."""
    verdicts = sequential.judge({(r["method"], r["metric"]): r["diffs"] for r in rows})
    looks = " / ".join(map(str, sequential.LOOKS))
    shown = [v for v in verdicts.values() if v["shown"]]
    early = [v for v in shown if v["look"] < sequential.LOOKS[-1]]
    stopped = [m for m in dict.fromkeys(r["method"] for r in rows if len(r["seeds"]) < PLANNED_PAIRS)
               if sequential.stopped(verdicts, m)]
    stop_note = f"; {', '.join(stopped)} need{'s' if len(stopped) == 1 else ''} no more seeds" if stopped else ""
    lines = [f"{sequential.FAMILY} planned comparisons ({len(sequential.PLANNED_METHODS)} methods against GRPO on "
             f"three metrics), looked at after {looks} pairs: {len(shown)} shown, {len(early)} of them at an "
             f"interim look{stop_note}.", "", _HEADER]
    for r in rows:
        lines.append(_row(r, _sequential_verdict(r["diffs"], verdicts[(r["method"], r["metric"])])))
    counts = dict(comparisons=sequential.FAMILY, shown=len(shown), shown_at_interim_look=len(early),
                  stopped=stopped)
    return "\n".join(lines) + "\n", counts


def _sequential_verdict(diffs: list[float], verdict: dict) -> str:
    direction = "higher than GRPO" if diffs and statistics.fmean(diffs) > 0 else "lower than GRPO"
    look, last = verdict["look"], sequential.LOOKS[-1]
    if look is None:
        return f"before the first look ({len(diffs)} of {sequential.LOOKS[0]} pairs)"
    if verdict["shown"] and look < last:
        k = sequential.LOOKS.index(look)
        threshold = sequential.interim_threshold(k)
        return f"{direction}; shown at the look at {look} pairs (p {verdict['p']:.2g} < {threshold:.2g})"
    if verdict["shown"]:
        return (f"{direction}; survives Holm at the last look (adj. p {verdict['adjusted']:.2g} <= "
                f"{verdict['level']:.3g})")
    if look < last:
        k = sequential.LOOKS.index(look)
        return (f"not shown at the look at {look} pairs (p {verdict['p']:.2g} >= "
                f"{sequential.interim_threshold(k):.2g}): its seeds go on")
    mean, half = interval(diffs[:last])
    if abs(mean) > half:
        return (f"{direction} unadjusted only: not after Holm (adj. p {verdict['adjusted']:.2g} > "
                f"{verdict['level']:.3g})")
    mde = minimum_detectable(diffs[:last])
    return f"not shown (MDE {mde:.3f})"


def levels_table(runs: dict, base: dict | None = None) -> str:
    lines = ["| method | seeds | greedy | T=1 | pass@8 | held-out all-fail | training all-fail, first -> last fifth | "
             "tokens (mean) | train CPU s |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    if base is not None:  # the untrained model (tool_grid.py base), measured as every run's end is
        cells = [value(base) for value in METRICS.values()]
        lines.append("| untrained | - | " + " | ".join(f"{c:.3f}" for c in cells)
                     + f" | {base['final']['all_fail_share']:.3f} | - | - | - |")
    for method in runs:  # in the order by_method / by_method_rate built
        seeds = runs[method]
        cells = [statistics.fmean(value(r) for r in seeds.values()) for value in METRICS.values()]
        all_fail = statistics.fmean(r["final"].get("all_fail_share", math.nan) for r in seeds.values())
        tokens = statistics.fmean(r["generated_tokens"] for r in seeds.values())
        cpu = statistics.fmean(r["train_cpu_seconds"] for r in seeds.values())
        lines.append(f"| {method} | {len(seeds)} | " + " | ".join(f"{c:.3f}" for c in cells)
                     + f" | {all_fail:.3f} | {_training_all_fail(seeds)} | {tokens:,.0f} | {cpu:.0f} |")
    return "\n".join(lines) + "\n"


def _training_all_fail(seeds: dict) -> str:
    """The training all-fail share, first -> last fifth, where every reward call of a run scored one training batch
    of ``num_generations``-row groups (GRPO's). A method that calls the rewards more often than once a step (SRPO
    scores its seed candidates in calls of their own, and its training batch's groups of 8 hold base and reset rows
    together; DATPO scores its branches in a call of their own) records shares that are not GRPO's: the cell says
    so instead of a number."""
    calls = [len(r["train_all_fail_share"]) / r["settings"]["steps"] for r in seeds.values()
             if r.get("settings", {}).get("steps")]
    if calls and max(calls) > 1:
        return f"- ({statistics.fmean(calls):.1f} reward calls a step)"
    first, last = (statistics.fmean(_fifth(r["train_all_fail_share"], end) for r in seeds.values())
                   for end in (False, True))
    return f"{first:.3f} -> {last:.3f}"


def _fifth(shares: list[float], last: bool) -> float:
    """The mean all-fail share of a run's first (or last) fifth of training groups, in the order they were scored."""
    n = max(1, len(shares) // 5)
    return statistics.fmean(shares[-n:] if last else shares[:n])


#: The CPU the grid's costs are measured on: every run before a run recorded its own (``cpu``) ran on it.
REFERENCE_CPU = "Intel(R) Xeon(R) Processor"


def cost(runs: list[dict], sweep_runs: int, reported_seeds: int = PLANNED_PAIRS,
         steps_of=lambda method: 120) -> dict:
    """CPU seconds of one run per method (training + final evaluation; the mean over its runs of ``steps_of(method)``
    steps on REFERENCE_CPU, else its 30-step runs' training scaled by steps / 30) and what the whole grid would cost:
    ``sweep_runs`` + ``reported_seeds`` runs of every method. Runs on another CPU count only in
    ``other_cpu_ratio``: their mean over the reference runs' of the same method and steps."""
    per_method: dict = {}
    other: dict = {}
    for run in runs:
        if run["settings"].get("eval_every") or run.get("from_pilot"):  # a curve's evaluations are not a run's
            continue
        scale = steps_of(run["method"]) / run["settings"]["steps"]
        kind = per_method if run.get("cpu", REFERENCE_CPU) == REFERENCE_CPU else other
        entry = kind.setdefault(run["method"], {}).setdefault(run["settings"]["steps"], [])
        entry.append(run["train_cpu_seconds"] * scale + run.get("eval_cpu_seconds", 0.0))
    out = {}
    for method, by_steps in sorted(per_method.items()):
        steps = steps_of(method)
        measured = steps in by_steps
        seconds = statistics.fmean(by_steps[steps] if measured else next(iter(by_steps.values())))
        out[method] = dict(steps=steps, run_cpu_seconds=seconds, measured_at_steps=measured,
                           grid_cpu_hours=seconds * (sweep_runs + reported_seeds) / 3600)
        there = other.get(method, {}).get(steps) if measured else None
        if there:
            out[method]["other_cpu_ratio"] = statistics.fmean(there) / seconds
    out["total_cpu_hours"] = sum(m["grid_cpu_hours"] for m in out.values())  # unrounded: cost_table rounds once
    return out


def cost_table(costs: dict) -> str:
    lines = ["| method | steps | CPU min per run | whole grid, CPU h | |", "| --- | --- | --- | --- | --- |"]
    for method, c in costs.items():
        if method != "total_cpu_hours":
            lines.append(f"| {method} | {c['steps']} | {c['run_cpu_seconds'] / 60:.1f} | {c['grid_cpu_hours']:.1f} | "
                         + ("measured" if c["measured_at_steps"] else "training scaled from 30 steps")
                         + (f"; its runs on another CPU took {c['other_cpu_ratio']:.2f}x"
                            if "other_cpu_ratio" in c else "")
                         + " |")
    return "\n".join(lines) + (f"\n\nAll methods: {costs['total_cpu_hours']:.1f} CPU hours, on {REFERENCE_CPU} (2 "
                                "cores, one thread per run).\n")


def test_rows() -> list[dict]:
    """Per held-out chain (the grid's greedy rows, in order): its trap keys and its calls (lookups and the submit)."""
    from trl_credit.tasks import keychain

    test = keychain.make_dataset()["test"]
    return [dict(traps=t, calls=len(keychain.expected_calls(store, start)))
            for t, store, start in zip(test["traps"], test["store"], test["start"])]


def by_chain(runs: dict, rows: list[dict], method: str, key: str) -> list[dict]:
    """The method's greedy edge over GRPO per value of ``key`` (``traps`` or ``calls``) of the held-out chains, paired
    by seed, beside what compounding predicts and the excess over it. A chain with t trap keys is right when each of
    its t trap keys is copied right, so with q the seed's accuracy on one-trap chains (per method) compounding
    predicts a chain's edge q_method^t - q_GRPO^t; a group's prediction is its chains' mean, and its excess (observed
    edge - prediction, per seed, then a t-interval over seeds) is what the edge grows beyond compounding. With
    ``traps`` the excess at 1 is 0 by construction."""
    seeds = sorted(set(runs.get(method, {})) & set(runs.get("grpo", {})))
    values = sorted({r[key] for r in rows})

    def mean_over(run_of, picked):
        return statistics.fmean(run_of[i] for i in picked) if picked else math.nan

    one_trap = [i for i, r in enumerate(rows) if r["traps"] == 1]
    groups = {v: [i for i, r in enumerate(rows) if r[key] == v] for v in values}
    per_seed = []  # {value: (edge, predicted)} per seed
    for s in seeds:
        correct = {m: runs[m][s]["final"]["greedy_correct"] for m in (method, "grpo")}
        q = {m: mean_over(correct[m], one_trap) for m in correct}
        chain_prediction = [q[method] ** r["traps"] - q["grpo"] ** r["traps"] for r in rows]
        chain_edge = [a - b for a, b in zip(correct[method], correct["grpo"])]
        per_seed.append({v: (mean_over(chain_edge, g), mean_over(chain_prediction, g)) for v, g in groups.items()})
    out = []
    for value in values:
        edges = [seed[value][0] for seed in per_seed]
        excess = [seed[value][0] - seed[value][1] for seed in per_seed]
        mean, half = interval(edges) if edges else (math.nan, math.nan)
        excess_mean, excess_half = interval(excess) if excess else (math.nan, math.nan)
        out.append(dict(value=value, chains=len(groups[value]), seeds=len(seeds), edge=mean,
                        half_width=half,
                        compounding=statistics.fmean(seed[value][1] for seed in per_seed) if seeds else math.nan,
                        excess=excess_mean, excess_half_width=excess_half, excess_by_seed=excess))
    return out


def chain_tables(runs: dict, rows: list[dict], method: str = "process") -> dict[str, list[dict]]:
    """:func:`by_chain` by trap keys and by calls: what :func:`chain_table` and :func:`growth` read."""
    return {key: by_chain(runs, rows, method, key) for key in ("traps", "calls")}


def growth(tables: dict[str, list[dict]]) -> dict:
    """Does the edge grow with the chain beyond compounding? Per seed, the least-squares slope of the excess (see
    :func:`by_chain`; ``tables`` from :func:`chain_tables`) over the number of calls, and over the number of trap
    keys; each slope is tested over seeds (paired t), the two forming one family for Holm. A positive slope: the
    longer the chain, the more the method's edge exceeds what compounding its one-trap gain explains."""
    out = {}
    for key in ("calls", "traps"):
        table = tables[key]
        xs = [r["value"] for r in table]
        out[key] = [statistics.linear_regression(xs, [r["excess_by_seed"][s] for r in table]).slope
                    for s in range(table[0]["seeds"] if table else 0)]
    family = multiplicity.adjust_family(out)
    return {key: dict(slopes=slopes, p=family[key][0], adjusted_p=family[key][1]) for key, slopes in out.items()}


def chain_table(tables: dict[str, list[dict]], method: str = "process") -> str:
    lines = [f"| {method} vs GRPO, greedy | chains | edge (95% CI) | compounding predicts "
             "| beyond compounding (95% CI) |",
             "| --- | --- | --- | --- | --- |"]
    for key, table in tables.items():
        for r in table:
            lines.append(f"| {r['value']} {'trap keys' if key == 'traps' else 'calls'} | {r['chains']} | "
                         f"{r['edge']:+.3f} ± {r['half_width']:.3f} | {r['compounding']:+.3f} | "
                         f"{r['excess']:+.3f} ± {r['excess_half_width']:.3f} |")
    slopes = growth(tables)
    lines.append("")
    lines.append("Growth beyond compounding, per seed the slope of the excess (2 comparisons, Holm over the two):")
    for key, g in slopes.items():
        per = "call" if key == "calls" else "trap key"
        if len(g["slopes"]) < 2:
            lines.append(f"- per {per}: not tested (fewer than 2 paired seeds)")
            continue
        mean, half = interval(g["slopes"])
        shown = mean - half > 0 or mean + half < 0
        verdict = (("grows; " if mean > 0 else "shrinks; ") + multiplicity.holm_note(g["p"], g["adjusted_p"])
                   if shown else f"not shown (MDE {minimum_detectable(g['slopes']):.3f})")
        lines.append(f"- per {per}: {mean:+.3f} ± {half:.3f} "
                     f"({len(g['slopes'])} seeds; {verdict})")
    return "\n".join(lines) + "\n"


def pilot_table(runs: list[dict]) -> str:
    lines = ["| method (rate, seed) | greedy along the run | T=1 at the end | tokens | train CPU s |",
             "| --- | --- | --- | --- | --- |"]
    for run in sorted(runs, key=lambda r: (r["method"] != "grpo", r["method"])):
        greedy = [point["greedy_accuracy"] for point in run.get("curve", [])] + [run["final"]["greedy_accuracy"]]
        lines.append(f"| {run['method']} ({run['learning_rate']:g}, {run['seed']}) | "
                     + " / ".join(f"{g:.3f}" for g in greedy) + f" | {run['final']['accuracy']:.3f} | "
                     f"{run['generated_tokens']:,} | {run['train_cpu_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def sweep_table(choices: dict) -> str:
    rates = sorted({r for c in choices.values() for r in c["means"]}, key=float)
    lines = ["| method | sweep seeds | " + " | ".join(f"T=1 at {r}" for r in rates) + " | chosen |",
             "| --- | --- |" + " --- |" * len(rates) + " --- |"]
    for method, c in sorted(choices.items()):
        lines.append(f"| {method} | {', '.join(map(str, c['seeds']))} | "
                     + " | ".join(f"{c['means'][r]:.3f}" if r in c["means"] else "-" for r in rates)
                     + f" | {c['rate']:g} |")
    return "\n".join(lines) + "\n"


def main(results: str, choices: dict) -> dict:
    import tool_grid

    phases = {phase: tool_grid.load(phase)  # every run of every folder, read once
              for phase in ("runs", "sweep", "sweep_dropped", "sweep_30steps", "pilot_long")}
    rows_by_chain = test_rows()
    runs = by_method(phases["runs"])

    def length_tables(by_seed: dict) -> dict | None:  # the length question pairs the oracle with GRPO: both or none
        return chain_tables(by_seed, rows_by_chain) if "process" in by_seed and "grpo" in by_seed else None

    def length_text(tables: dict | None) -> str:
        return chain_table(tables) if tables else "not run yet\n"

    reported_length = length_tables(runs)
    base_path = os.path.join(results, "base_eval.json")
    base = json.load(open(base_path)) if os.path.exists(base_path) else None
    sweep = by_method_rate(phases["sweep"])
    rows = claims(runs)
    costs = cost(phases["sweep"] + phases["runs"] + phases["sweep_30steps"], sweep_runs=8,
                 steps_of=lambda method: tool_grid.method_steps(method, 120))
    table, counts = sequential_table(rows) if rows else ("no reported runs yet\n", {})
    at_chosen = by_method([run for run in phases["sweep"]
                           if run["method"] in choices and run["learning_rate"] == choices[run["method"]]["rate"]])
    indicative = claims_table(claims(at_chosen))[0] if len(at_chosen) > 1 else "not run yet\n"
    report = "\n".join([
        "# Tool regime grid", "", "## Sweep (seeds kept apart; final T=1 accuracy, 8 samples x 64 chains)", "",
        sweep_table(choices), "## Sweep levels (every run of the sweep, by method)", "", levels_table(sweep, base),
        "## Rates dropped on the first sweep seed: collapsed, or nearly (greedy below 0.1, untrained 0.387; "
        "sweep_dropped/)", "",
        levels_table(by_method_rate(phases["sweep_dropped"]), base),
        "## The first sweep, at 30 steps (sweep_30steps/, seed 100)", "",
        levels_table(by_method_rate(phases["sweep_30steps"]), base),
        "## Pilots at 120 steps (pilot_long/: greedy accuracy at steps 40 / 80 / 120)", "",
        pilot_table(phases["pilot_long"]), "## Pilot levels", "",
        levels_table(by_method_rate(phases["pilot_long"]), base), "## Reported seeds", "",
        levels_table(runs, base) if runs else "none yet\n", "## Against GRPO", "", table,
        "## The length question: the process oracle's greedy edge by chain", "",
        length_text(reported_length),
        "## The same on the sweep seeds at the chosen rates (they chose the rates: indicative, not a claim)", "",
        length_text(length_tables(at_chosen)),
        "## Against GRPO on the sweep seeds at the chosen rates (indicative, not a claim)", "", indicative,
        "## The same on the 120-step pilot (one seed: no interval)", "",
        length_text(length_tables(by_method(phases["pilot_long"]))),
        f"## Cost of the whole grid at 120 steps, DATPO at equal tokens (2 rates x 4 sweep seeds + {PLANNED_PAIRS} "
        "reported seeds per method)", "",
        cost_table(costs)])
    summary = dict(chosen_rates=choices, claims=rows, family=counts, cost=costs,
                   length_growth=growth(reported_length) if reported_length else None,
                   reported_seeds={m: sorted(s) for m, s in runs.items()},
                   sweep_seeds={m: sorted(s) for m, s in sweep.items()})
    with open(os.path.join(results, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(results, "report.md"), "w") as f:
        f.write(report)
    print(report)
    return summary
