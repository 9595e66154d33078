"""Question: On a regime with headroom beyond sharpening, which paper claim holds, by greedy accuracy, pass@8 and T=1?

The claims table of a grid whose runs measured greedy accuracy and pass@64 (``benchmarks/tiny/tiny_grid.py``, e.g.
``--regime trap``; BENCHMARKS.md section 7), the mechanism readings it rests on, and PRIME's share of the process
oracle's gain. Called by ``tiny_report.py``; every number is recomputed from the run JSONs.

- **Paired differences.** Per seed, method A - method B on the same held-out problems; 95% t-interval over seeds.
  Each claim is read on three metrics: greedy accuracy (what the model does when it commits), pass@8 (what it can
  still find: a problem solved by at least one of its 8 samples at T=1) and accuracy at T=1 (the training
  temperature, 8 samples a problem). pass@64 (the first ``passk_problems`` held-out problems x 64 samples at T=1) is
  in the levels table but not a claim: the untrained trap model's pass@64 is 1.000 on those problems, so no run can
  show a gain there (``base_decodings.py`` finds 2 of all 256 held-out problems below 1, outside the runs' sample).
- **Hard problems.** The held-out problems the *untrained* model fails in all 8 of its samples at T=1 (the base
  evaluation every run starts from): the prompts whose GRPO groups carry no gradient at the start, where SRPO's resets
  and DATPO's trees claim to help.
- **All-fail share over training.** The share of held-out problems whose 8 samples at T=1 all fail, at every
  evaluation of the run (the held-out stand-in for the training groups, the same for every method).
- **PRIME's share of the oracle's gain.** mean(PRIME - GRPO) / mean(process - GRPO) over the paired seeds, its 95%
  interval from a paired bootstrap over seeds (10,000 resamples, fixed seed).
"""

from __future__ import annotations

import random
import statistics

from multiplicity import adjust_family, family_counts, holm_note
from tiny_report import LABELS, interval, verdict

#: (claim, method A, method B, problems): A - B per seed; "hard" = the base's all-fail problems
CLAIMS = (
    ("SRPO: resets help on prompts where GRPO's groups are all-fail (abstract, §4)", "srpo", "grpo", "hard"),
    ("SRPO outperforms GRPO (abstract, §5)", "srpo", "grpo", "all"),
    ("SRPO outperforms RRPO: localization matters (abstract, §5)", "srpo", "rrpo", "all"),
    ("... on the hard prompts", "srpo", "rrpo", "hard"),
    ("Resets at the credit-assignment oracle beat random resets (§3, CPI analysis)", "srpo_oracle", "rrpo", "all"),
    ("DATPO: adaptive trees help hard prompts at equal compute (<= G leaves) (abstract, §3.3)", "datpo_matched",
     "grpo", "hard"),
    ("DATPO (adaptive budget) outperforms GRPO, especially pass@k (abstract)", "datpo", "grpo", "all"),
    ("Cue-GRPO improves repeated sampling, most at large k (abstract, §5)", "cue_grpo", "grpo", "all"),
    ("OPPO improves over GRPO (abstract, §5)", "oppo", "grpo", "all"),
    ("Composition: SRPO's resets with OPPO's credit beat OPPO alone", "srpo_oppo", "oppo", "all"),
    ("Process supervision (the step checker's token credit) beats outcome supervision (DeepSeekMath §4.1.3)",
     "process", "grpo", "all"),
    ("PRIME's implicit PRM beats outcome supervision (Cui et al. 2025, §4)", "prime", "grpo", "all"),
    ("... and reaches the process oracle", "prime", "process", "all"),
    ("PRIME with the paper's prompt filter (Algorithm 1) beats outcome supervision", "prime_filter", "grpo", "all"),
    ("PRIME with the prompt filter reaches the process oracle", "prime_filter", "process", "all"),
    ("PRIME with the prompt filter beats PRIME without it", "prime_filter", "prime", "all"),
)
#: the claims' metrics (pass@64 left out: the untrained model's is 1.000 where the runs draw it); the levels' too
METRICS = ("greedy", "pass8", "t1")
LEVEL_METRICS = ("greedy", "pass64", "t1", "pass8")
METRIC_NAMES = {"greedy": "greedy accuracy", "pass64": "pass@64", "pass8": "pass@8 (T=1)", "t1": "accuracy at T=1"}


def hard_problems(base_eval: dict) -> list[int]:
    """Held-out problems the untrained model fails in all of its samples at T=1."""
    return [i for i, correct in enumerate(base_eval["correct_per_problem"]) if correct == 0]


def metric(run: dict, name: str, problems: list[int] | None, point: dict | None = None) -> float | None:
    """A run's last evaluation (or the curve ``point`` given) on ``problems`` (None: all): greedy accuracy, pass@64
    (problems among the first ``passk_problems``; pass@64 of 64 samples = at least one correct), accuracy at T=1,
    or pass@n of its n samples at T=1 ("pass8": at least one of the evaluation's samples correct)."""
    last = run["curve"][-1] if point is None else point
    if name == "greedy":
        values = last.get("greedy_correct")
    elif name == "t1":
        samples = run.get("settings", {}).get("eval_samples") or len(last["pass_at_k"])  # pass@1..@n of n samples
        values = [c / samples for c in last["correct_per_problem"]]
    elif name == "pass8":
        values = [float(c > 0) for c in last["correct_per_problem"]]
    else:
        per = last.get("passk_correct_per_problem")
        values = None if per is None else [float(c > 0) for c in per]
    if values is None:
        return None
    chosen = range(len(values)) if problems is None else [i for i in problems if i < len(values)]
    chosen = list(chosen)
    return statistics.fmean(float(values[i]) for i in chosen) if chosen else None


def run_tokens(run: dict) -> float | None:
    """Generated tokens over the whole run (every generation call: the last evaluation's cumulative count)."""
    return run["curve"][-1].get("generated_tokens")


def mean_tokens(by_seed: dict) -> float | None:
    values = [t for t in (run_tokens(r) for r in by_seed.values()) if t is not None]
    return statistics.fmean(values) if values else None


def token_ratio(runs: dict, a: str, b: str) -> str:
    """"<A's mean generated tokens / B's>x" over the run, "-" where either is unknown."""
    ta, tb = mean_tokens(runs.get(a, {})), mean_tokens(runs.get(b, {}))
    return f"{ta / tb:.2f}x" if ta and tb else "-"


def paired_diffs(runs: dict, a: str, b: str, name: str, problems: list[int] | None) -> list[float]:
    seeds = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
    diffs = []
    for seed in seeds:
        va, vb = metric(runs[a][seed], name, problems), metric(runs[b][seed], name, problems)
        if va is not None and vb is not None:
            diffs.append(va - vb)
    return diffs


def _cell(values: list[float], tested: tuple = (None, None)) -> str:
    """mean ± half-width: verdict, and whether a significant verdict survives Holm (``tested``: (p, adjusted p))."""
    if not values:
        return "-"
    mean, half = interval(values)
    if len(values) < 2:
        return f"{mean:+.3f}"
    note = holm_note(*tested)
    return f"{mean:+.3f} ± {half:.3f}: {verdict(values).split(' (')[0]}" + (f"; {note}" if note else "")


def claims_family(claims: list[dict]) -> dict:
    """{(claim, metric): (p, Holm-adjusted p)} over every cell of the claims table with 2 or more paired seeds: the
    table's family of comparisons (multiplicity.py; paired t-test over seeds)."""
    return adjust_family({(c["claim"], m): d for c in claims for m, d in c["diffs"].items() if m in METRICS})


def claim_diffs(runs: dict, base_eval: dict) -> list[dict]:
    """Per claim of :data:`CLAIMS` whose two methods ran: its paired differences per metric (lists over seeds)."""
    hard = hard_problems(base_eval)
    return [dict(claim=claim, a=a, b=b, problems=which,
                 diffs={m: paired_diffs(runs, a, b, m, hard if which == "hard" else None)
                        for m in METRICS + ("pass64",)})  # pass@64 kept in summary.json, not a claim
            for claim, a, b, which in CLAIMS if a in runs and b in runs]


def claims_table(runs: dict, base_eval: dict, claims: list[dict] | None = None) -> str:
    """The claims table (``claims``: :func:`claim_diffs`, computed here when not given)."""
    hard = hard_problems(base_eval)
    claims = claims if claims is not None else claim_diffs(runs, base_eval)
    measured = {c["claim"]: c["diffs"] for c in claims}
    family = claims_family(claims)
    count, unadjusted, survive = family_counts(family)
    drawn = {r["curve"][-1].get("passk_problems") for by_seed in runs.values() for r in by_seed.values()} - {None}
    untrained64 = base_eval.get("pass_at_k_large", {}).get("64")
    untrained64 = "-" if untrained64 is None else f"{untrained64:.3f}"
    lines = [f"Hard problems: the {len(hard)} of {len(base_eval['correct_per_problem'])} held-out problems the "
             f"untrained model fails in all 8 samples at T=1 (their pass@8 is 0 before training). pass@64 is not a "
             f"claim here: the untrained model's is {untrained64} on the held-out problems the runs draw it on (the "
             f"first {'/'.join(str(d) for d in sorted(drawn)) or '-'}), so no run can show a gain in it; coverage is "
             "read at pass@8 of the 8 samples at T=1. Each cell: paired difference A - B, mean ± 95% t half-width over "
             "seeds, and its verdict.", "",
             f"**Comparisons: {count}** (every cell with 2 or more paired seeds). A verdict that holds or "
             "shows the reverse is significant unadjusted (its 95% interval excludes 0, i.e. the two-sided paired "
             "t-test over seeds gives p < 0.05); \"survives Holm\" marks one whose Holm-adjusted p-value over all "
             f"{count} comparisons is <= 0.05 too, \"unadjusted only\" one that does not. "
             f"{unadjusted} verdicts are significant unadjusted, {survive} survive Holm.", "",
             "| claim (paper section) | A - B (problems) | seeds | greedy accuracy | pass@8 (T=1) | accuracy at T=1 | "
             "generated tokens A / B |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for claim, a, b, which in CLAIMS:
        if claim not in measured:
            lines.append(f"| {claim} | {LABELS.get(a, a)} - {LABELS.get(b, b)} ({which}) | 0 | not run | | | |")
            continue
        cells = [measured[claim][m] for m in METRICS]
        seeds = max(len(c) for c in cells)
        lines.append(f"| {claim} | {LABELS.get(a, a)} - {LABELS.get(b, b)} ({which}) | {seeds} | "
                     + " | ".join(_cell(measured[claim][m], family[(claim, m)]) for m in METRICS)
                     + f" | {token_ratio(runs, a, b)} |")
    return "\n".join(lines) + "\n"


def levels_table(runs: dict, base_eval: dict) -> str:
    """Per method, the mean over seeds of each metric on all problems and on the hard ones (the untrained model's
    row first: its greedy and T=1 from the base evaluation)."""
    hard = hard_problems(base_eval)
    base_run = dict(settings={}, curve=[base_eval])  # its samples per problem: len(pass_at_k)
    lines = ["| method | greedy (all / hard) | pass@64 (all / hard) | T=1 (all / hard) | pass@8 at T=1 (all / hard) | "
             "generated tokens over the run (x GRPO's) |", "| --- | --- | --- | --- | --- | --- |"]
    rows = [("untrained", {0: base_run})] + [(LABELS.get(m, m), by_seed) for m, by_seed in runs.items()]
    for label, by_seed in rows:
        cells = []
        for name in LEVEL_METRICS:
            pair = []
            for problems in (None, hard):
                values = [v for v in (metric(r, name, problems) for r in by_seed.values()) if v is not None]
                pair.append(f"{statistics.fmean(values):.3f}" if values else "-")
            cells.append(" / ".join(pair))
        tokens = mean_tokens(by_seed)
        grpo = mean_tokens(runs.get("grpo", {}))
        cells.append("0" if label == "untrained" else "-" if tokens is None else
                     f"{tokens:.0f}" + (f" ({tokens / grpo:.2f}x)" if grpo else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def all_fail_over_training(runs: dict) -> dict[str, dict[int, float]]:
    """Per method, per evaluated step: the mean over seeds of the share of held-out problems all-fail in 8 at T=1."""
    out = {}
    for method, by_seed in runs.items():
        steps: dict[int, list[float]] = {}
        for run in by_seed.values():
            for point in run["curve"]:
                per = point.get("correct_per_problem")
                if per:
                    steps.setdefault(point["step"], []).append(sum(c == 0 for c in per) / len(per))
        out[method] = {step: statistics.fmean(v) for step, v in sorted(steps.items())}
    return out


def all_fail_table(shares: dict) -> str:
    steps = sorted({s for by_step in shares.values() for s in by_step})
    lines = ["| method | " + " | ".join(f"step {s}" for s in steps) + " |", "| --- |" + " --- |" * len(steps)]
    for method, by_step in shares.items():
        lines.append(f"| {LABELS.get(method, method)} | "
                     + " | ".join(f"{by_step[s]:.3f}" if s in by_step else "-" for s in steps) + " |")
    return "\n".join(lines) + "\n"


def all_fail_share(run: dict, step: int) -> float | None:
    """The share of held-out problems all-fail in the run's samples at T=1 at the evaluation of ``step``."""
    for point in run["curve"]:
        if point["step"] == step and point.get("correct_per_problem"):
            per = point["correct_per_problem"]
            return sum(c == 0 for c in per) / len(per)
    return None


def all_fail_vs_grpo(runs: dict) -> dict[str, dict[int, list[float]]]:
    """Per method but GRPO, per evaluated step after 0: per seed both ran, its all-fail share minus GRPO's (negative:
    it emptied the all-fail problems faster)."""
    grpo = runs.get("grpo", {})
    steps = sorted({p["step"] for by_seed in runs.values() for r in by_seed.values() for p in r["curve"]} - {0})
    out = {}
    for method, by_seed in runs.items():
        if method == "grpo":
            continue
        out[method] = {}
        for step in steps:
            diffs = [(a - b) for a, b in ((all_fail_share(by_seed[s], step), all_fail_share(grpo[s], step))
                                          for s in sorted(set(by_seed) & set(grpo))) if a is not None and b is not None]
            if diffs:
                out[method][step] = diffs
    return out


def _fewer_cell(values: list[float], tested: tuple) -> str:
    """mean ± half-width: fewer / more all-fail problems than GRPO (the interval excludes 0) or not shown, with Holm."""
    mean, half = interval(values)
    if len(values) < 2:
        return f"{mean:+.3f}"
    said = "fewer" if mean + half < 0 else "more" if mean - half > 0 else "not shown: the interval covers 0"
    note = holm_note(*tested)
    return f"{mean:+.3f} ± {half:.3f}: {said}" + (f"; {note}" if note else "")


def all_fail_vs_grpo_table(paired: dict, runs: dict | None = None) -> tuple[str, dict]:
    """The paired differences of :func:`all_fail_vs_grpo` with their verdicts and Holm over the table's cells; the
    table and {(method, step): (p, Holm p)}."""
    family = adjust_family({(m, step): d for m, by_step in paired.items() for step, d in by_step.items()})
    steps = sorted({step for by_step in paired.values() for step in by_step})
    count, unadjusted, survive = family_counts(family)
    lines = [f"Method - GRPO per seed, mean ± 95% t half-width over seeds (negative: fewer all-fail problems than "
             f"GRPO's). **Comparisons: {count}**; {unadjusted} significant unadjusted, {survive} survive Holm over "
             "them.", "", "| method | " + " | ".join(f"step {s}: method - GRPO" for s in steps)
             + " | generated tokens vs GRPO's |", "| --- |" + " --- |" * (len(steps) + 1)]
    for method, by_step in paired.items():
        cells = [_fewer_cell(by_step[s], family[(method, s)]) if s in by_step else "-" for s in steps]
        lines.append(f"| {LABELS.get(method, method)} | " + " | ".join(cells)
                     + f" | {token_ratio(runs or {}, method, 'grpo')} |")
    return "\n".join(lines) + "\n", family


def share_of_gain(runs: dict, name: str, resamples: int = 10_000, seed: int = 0, prime: str = "prime") -> dict | None:
    """mean(PRIME - GRPO) / mean(process - GRPO) on ``name`` over the seeds all three ran, with a paired bootstrap
    95% interval (seeds resampled together); None when a method is missing. ``prime``: the PRIME run's method name
    ("prime_filter": with the paper's prompt filter)."""
    if not all(m in runs for m in (prime, "process", "grpo")):
        return None
    seeds = sorted(set(runs[prime]) & set(runs["process"]) & set(runs["grpo"]))
    rows = []
    for s in seeds:
        values = [metric(runs[m][s], name, None) for m in (prime, "process", "grpo")]
        if None not in values:
            rows.append((values[0] - values[2], values[1] - values[2]))
    if len(rows) < 2:
        return None

    def ratio(sample):
        oracle = statistics.fmean(o for _, o in sample)
        return statistics.fmean(p for p, _ in sample) / oracle if oracle != 0 else float("nan")

    rng = random.Random(seed)
    boots = sorted(r for r in (ratio([rng.choice(rows) for _ in rows]) for _ in range(resamples)) if r == r)
    low, high = boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]
    return dict(seeds=len(rows), share=ratio(rows), low=low, high=high,
                prime_gain=interval([p for p, _ in rows]), oracle_gain=interval([o for _, o in rows]))


def resets_landing(summary: dict) -> str:
    """Where the resets of SRPO, RRPO and the oracle land against the checker's first wrong thought h*, from the
    training logs: on h* (exact), before it (a clean prefix, not h*), after it (the prefix keeps the error)."""
    lines = ["| resets | on h* | before h* | after h* (prefix keeps the error) |", "| --- | --- | --- | --- |"]
    for method in ("srpo", "rrpo", "srpo_oracle", "srpo_oppo"):
        entry = summary.get(method, {})
        exact, clean = entry.get("srpo/localization_exact_rate"), entry.get("srpo/localization_clean_rate")
        if exact is None or clean is None:
            continue
        lines.append(f"| {LABELS.get(method, method)} | {exact:.2f} | {clean - exact:.2f} | {1 - clean:.2f} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def mechanism_lines(mechanisms: dict | None) -> str:
    """Where the negative advantage of a failed completion lands, on its first wrong line when that is the trap step
    (benchmarks/tiny/tiny_mechanisms.py --regime trap)."""
    if not mechanisms:
        return ""
    lines = ["| credit | failed completions | first error = the trap step | negative mass on the trap step | its tokens |",
             "| --- | --- | --- | --- | --- |"]
    for method, m in mechanisms.items():
        trap = m.get("trap_steps") if isinstance(m, dict) else None
        if not trap or trap.get("mass_on") is None:
            continue
        lines.append(f"| {LABELS.get(method, method)} | {m['completions']} | {m['trap_share_of_first_errors']:.2f} | "
                     f"{trap['mass_on']:.2f} | {trap['tokens_on']:.2f} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def report(runs: dict, base_eval: dict, summary: dict, mechanisms: dict | None, same_rate: dict | None = None,
           sweeps: tuple[dict, dict] | None = None) -> tuple[str, dict]:
    """The markdown section and its numbers (for summary.json); ``same_rate``: :func:`load_same_rate`'s runs,
    ``sweeps``: the sweep's choices on seeds 100-101 and on every sweep seed (tiny_report.sweep_choices); their tables
    are claims_controls.py's."""
    shares = all_fail_over_training(runs)
    claims = claim_diffs(runs, base_eval)
    family = claims_family(claims)
    fail_paired = all_fail_vs_grpo(runs)
    fail_table, fail_family = all_fail_vs_grpo_table(fail_paired, runs)
    gain = {m: share_of_gain(runs, m) for m in ("greedy", "t1")}
    gain_filter = {m: share_of_gain(runs, m, prime="prime_filter") for m in ("greedy", "t1")}
    text = ["### Levels after training, on all held-out problems and on the hard ones (mean over seeds)", "",
            levels_table(runs, base_eval),
            "### Claims, by greedy accuracy, pass@8 and T=1", "", claims_table(runs, base_eval, claims),
            "### All-fail share over training (held-out problems, 8 samples at T=1)", "", all_fail_table(shares),
            "### All-fail share against GRPO's, paired over seeds", "", fail_table]
    import claims_controls  # the same claims at one learning rate and at equal generated tokens

    numbers_extra = {}
    matched_text, matched = claims_controls.token_matched_table(runs, base_eval)
    if matched:
        text += ["### DATPO's claims at equal generated tokens", "", matched_text]
        numbers_extra["equal_tokens"] = [dict(claim=r["claim"], a=r["a"], b=r["b"], problems=r["problems"],
                                              reading=r["reading"],
                                              budget=r["budget"], holm_p=r["holm_p"],
                                              **{m: (list(interval(d)) if d else None) for m, d in r["diffs"].items()})
                                         for r in matched]
    if sweeps and any(max(c["sweep_runs"].values()) > 2 for c in sweeps[1].values()):
        text += ["### The learning rates on 2 sweep seeds and on every sweep seed run", "",
                 claims_controls.sweep_seeds_table(*sweeps)]
        numbers_extra["sweep_every_seed"] = sweeps[1]
    pairs = claims_controls.same_rate_claims(runs, same_rate or {}, base_eval)
    if pairs:
        table, pair_family = claims_controls.same_rate_table(pairs)
        text += ["### Claims whose pair trained at different rates, at one rate", "", table]
        numbers_extra["same_rate"] = [dict(claim=c["claim"], a=c["a"], b=c["b"], problems=c["problems"], rate=c["rate"],
                                           **{m: (list(interval(d)) if d else None) for m, d in c["diffs"].items()},
                                           holm_p={m: pair_family[(c["claim"], c["rate"], m)][1] for m in METRICS})
                                      for c in pairs]
    landing = resets_landing(summary)
    if landing:
        text += ["### Where the resets land (training logs, against the checker's first wrong thought h*)", "", landing]
    mech = mechanism_lines(mechanisms)
    if mech:
        text += ["### Token credit on the trap step (starting model's rollouts)", "", mech]
    for label, shares_of in (("PRIME", gain), ("PRIME with the prompt filter", gain_filter)):
        for name, g in shares_of.items():
            if g:
                text.append(f"{label}'s share of the process oracle's gain over GRPO ({METRIC_NAMES[name]}, "
                            f"{g['seeds']} seeds): {g['share']:.2f} (95% bootstrap {g['low']:.2f} to {g['high']:.2f}); "
                            f"{label} - GRPO {g['prime_gain'][0]:+.3f} ± {g['prime_gain'][1]:.3f}, process - GRPO "
                            f"{g['oracle_gain'][0]:+.3f} ± {g['oracle_gain'][1]:.3f}.\n")
    numbers = dict(hard_problems=len(hard_problems(base_eval)), all_fail_over_training=shares,
                   prime_share_of_oracle_gain=gain, prime_filter_share_of_oracle_gain=gain_filter,
                   comparisons=family_counts(family)[0],
                   all_fail_vs_grpo={m: {str(step): dict(interval=list(interval(d)), paired_t_p=fail_family[(m, step)][0],
                                                         holm_p=fail_family[(m, step)][1])
                                         for step, d in by_step.items()} for m, by_step in fail_paired.items()},
                   claims=[dict(claim=c["claim"], a=c["a"], b=c["b"], problems=c["problems"],
                                **{m: (list(interval(d)) if d else None) for m, d in c["diffs"].items()},
                                paired_t_p={m: family[(c["claim"], m)][0] for m in METRICS},
                                holm_p={m: family[(c["claim"], m)][1] for m in METRICS})
                           for c in claims], **numbers_extra)
    return "\n".join(text), numbers
