"""Question: What do the tiny grid's runs say, per method and per paper claim?

Tables, figures and the claims table of the tiny-testbed grid (``benchmarks/tiny/tiny_grid.py``; BENCHMARKS.md section 4).

    python benchmarks/tiny/tiny_report.py [--results-dir benchmarks/results/tiny]

Writes ``summary.json``, ``report.md`` (the tables pasted into BENCHMARKS.md), ``curves.png`` (held-out accuracy vs
optimizer step and vs generated tokens, mean and 95% band over seeds) and ``passk.png``. Every interval is a 95%
t-interval over seeds; a paired difference is the mean over seeds of (method - GRPO) at the same seed. The minimum
detectable effect (MDE) is the paired difference this many seeds detects with 80% power at alpha 0.05 (two-sided),
from the observed spread of the paired differences.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from scipy import stats  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "tiny")
ORDER = ["grpo", "cue_grpo", "oppo", "datpo", "datpo_matched", "srpo", "rrpo", "srpo_oracle", "srpo_oppo", "process",
         "prime"]
LABELS = {"grpo": "GRPO", "cue_grpo": "Cue-GRPO (structure)", "oppo": "OPPO (self)", "datpo": "DATPO (adaptive)",
          "datpo_matched": "DATPO (<= G leaves)", "srpo": "SRPO (self)", "rrpo": "RRPO", "srpo_oracle":
          "SRPO (oracle reset)", "srpo_oppo": "SRPO x OPPO", "process": "process credit (oracle)",
          "prime": "PRIME (implicit PRM)", "prime_filter": "PRIME with the prompt filter"}
COLORS = {"grpo": "black", "cue_grpo": "tab:blue", "oppo": "tab:orange", "datpo": "tab:green",
          "datpo_matched": "tab:olive", "srpo": "tab:red", "rrpo": "tab:purple", "srpo_oracle": "tab:pink",
          "srpo_oppo": "tab:brown", "process": "tab:gray", "prime": "tab:cyan"}
THRESHOLD = 0.85  # held-out accuracy a run must reach for "steps / tokens to threshold"
#: the sweep seeds the committed grids' learning rates were chosen on (later sweep seeds are reported beside them)
GRID_SWEEP_SEEDS = (100, 101)


def interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval); half-width NaN under two values."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def minimum_detectable(values: list[float]) -> float:
    """Paired difference detected with 80% power at alpha 0.05 (two-sided) by len(values) seeds of this spread."""
    n = len(values)
    if n < 3:
        return math.nan
    return (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * statistics.stdev(values) / math.sqrt(n)


def seeds_for(effect: float, sd: float) -> int:
    """Seeds a paired comparison needs to detect ``effect`` (80% power, alpha 0.05) at this spread."""
    if not sd > 0 or not effect > 0:
        return 0
    n = 3
    while (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n) > effect and n < 10000:
        n += 1
    return n


def first_reaching(curve: list[dict], key: str, threshold: float) -> float | None:
    for point in curve:
        if point["accuracy"] >= threshold:
            return point[key]
    return None


def sweep_choices(sweep_dir: str, rates=None, select_by: str = "auc", seeds=None) -> dict:
    """Per method in the sweep, the mean validation AUC per learning rate and the rate with the best one (what the
    grid trained with: benchmarks/tiny/tiny_grid.py); ``select_by`` "greedy_auc" ranks by the greedy-accuracy curve;
    ``seeds``: only these sweep seeds (default: every one run)."""
    aucs: dict[str, dict[float, list[float]]] = {}
    for name in sorted(os.listdir(sweep_dir)) if os.path.isdir(sweep_dir) else []:
        if name.endswith(".json") and "_seed" in name:
            with open(os.path.join(sweep_dir, name)) as f:
                run = json.load(f)
            if (rates is None or run["learning_rate"] in rates) and (seeds is None or run["seed"] in seeds):
                aucs.setdefault(run["method"], {}).setdefault(run["learning_rate"], []).append(run[select_by])
    chosen = {}
    for method, by_rate in aucs.items():
        means = {rate: statistics.fmean(values) for rate, values in sorted(by_rate.items())}
        chosen[method] = dict(learning_rate=max(means, key=means.get), selected_by=select_by,
                              sweep_auc={f"{r:g}": a for r, a in means.items()},
                              sweep_runs={f"{r:g}": len(v) for r, v in sorted(by_rate.items())})
    return chosen


def load_runs(directory: str) -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json") and "_seed" in name:
            with open(os.path.join(directory, name)) as f:
                run = json.load(f)
            runs.setdefault(run["method"], {})[run["seed"]] = run
    return runs


def mean_metric(run: dict, key: str) -> float | None:
    values = [log[key] for log in run["logs"] if key in log and log[key] is not None]
    return statistics.fmean(values) if values else None


def summarize(runs: dict[str, dict[int, dict]]) -> dict:
    grpo = runs.get("grpo", {})
    summary = {}
    for method in [m for m in ORDER if m in runs] + [m for m in runs if m not in ORDER]:
        by_seed = runs[method]
        seeds = sorted(by_seed)
        finals = [by_seed[s]["curve"][-1]["accuracy"] for s in seeds]
        aucs = [by_seed[s]["auc"] for s in seeds]
        pass8 = [by_seed[s]["curve"][-1]["pass_at_k"]["8"] for s in seeds]
        paired = [s for s in seeds if s in grpo]
        diff_final = [by_seed[s]["curve"][-1]["accuracy"] - grpo[s]["curve"][-1]["accuracy"] for s in paired]
        diff_auc = [by_seed[s]["auc"] - grpo[s]["auc"] for s in paired]
        diff_pass8 = [by_seed[s]["curve"][-1]["pass_at_k"]["8"] - grpo[s]["curve"][-1]["pass_at_k"]["8"]
                      for s in paired]
        steps = [by_seed[s]["settings"]["steps"] for s in seeds]
        cpu_step = [by_seed[s]["train_cpu_seconds"] / n for s, n in zip(seeds, steps)]
        tokens = [by_seed[s]["curve"][-1]["generated_tokens"] / n for s, n in zip(seeds, steps)]
        reach_steps = [first_reaching(by_seed[s]["curve"], "step", THRESHOLD) for s in seeds]
        reach_tokens = [first_reaching(by_seed[s]["curve"], "generated_tokens", THRESHOLD) for s in seeds]
        backward = [_share(by_seed[s]["curve"][-1]["structures"], "backward") for s in seeds]
        entry = dict(
            seeds=len(seeds), learning_rate=by_seed[seeds[0]]["learning_rate"],
            final=interval(finals), auc=interval(aucs), pass8=interval(pass8),
            diff_final=interval(diff_final) if paired else None, diff_auc=interval(diff_auc) if paired else None,
            diff_pass8=interval(diff_pass8) if paired else None,
            wins_final=sum(d > 0 for d in diff_final), paired=len(paired),
            mde_final=minimum_detectable(diff_final) if len(paired) > 2 else None,
            sd_diff_final=statistics.stdev(diff_final) if len(paired) > 1 else None,
            cpu_per_step=statistics.fmean(cpu_step), tokens_per_step=statistics.fmean(tokens),
            reached=sum(r is not None for r in reach_steps),
            steps_to_threshold=statistics.fmean([r for r in reach_steps if r is not None]) if any(reach_steps)
            else None,
            tokens_to_threshold=statistics.fmean([r for r in reach_tokens if r is not None]) if any(reach_tokens)
            else None,
            backward_share=statistics.fmean(backward),
            train_cpu_seconds=sum(by_seed[s]["train_cpu_seconds"] for s in seeds),
            eval_cpu_seconds=sum(by_seed[s]["eval_cpu_seconds"] for s in seeds),
        )
        # greedy accuracy and pass@64 beside accuracy at the training temperature (runs that measured them)
        for name, value in (("greedy", final_greedy), ("pass64", final_pass_large(64))):
            values = {s: value(by_seed[s]) for s in seeds}
            if any(v is None for v in values.values()):
                continue
            entry[name] = interval(list(values.values()))
            diffs = [values[s] - value(grpo[s]) for s in paired if value(grpo[s]) is not None]
            entry[f"diff_{name}"] = interval(diffs) if diffs else None
            if len(diffs) > 1:
                entry[f"z_diff_{name}"] = (statistics.fmean(diffs) / (statistics.stdev(diffs) / math.sqrt(len(diffs)))
                                           if statistics.stdev(diffs) > 0 else None)
        for key in ("srpo/localization_exact_rate", "srpo/localization_clean_rate", "srpo/localization_parse_rate",
                    "srpo/correction_rate_clean_prefix", "srpo/correction_rate_erroneous_prefix",
                    "datpo/leaves_per_prompt", "cue/frac_groups_redistributed", "oppo/advantage_abs_mean"):
            values = [v for v in (mean_metric(by_seed[s], key) for s in seeds) if v is not None]
            if values:
                entry[key] = statistics.fmean(values)
        summary[method] = entry
    return summary


def paired(runs: dict, method: str, other: str, value) -> list[float]:
    """Per seed both ran: value(run of method) - value(run of other)."""
    seeds = sorted(set(runs.get(method, {})) & set(runs.get(other, {})))
    return [value(runs[method][s]) - value(runs[other][s]) for s in seeds]


def final_accuracy(run: dict) -> float:
    return run["curve"][-1]["accuracy"]


def final_pass(k: int):
    return lambda run: run["curve"][-1]["pass_at_k"][str(k)]


def final_greedy(run: dict) -> float | None:
    """Greedy held-out accuracy at the last evaluation (None for runs made before the runner measured it)."""
    return run["curve"][-1].get("greedy_accuracy")


def final_pass_large(k: int):
    """pass@k from the last evaluation's large sample (k up to 64; None where it was not drawn)."""
    return lambda run: run["curve"][-1].get("pass_at_k_large", {}).get(str(k))


def backward_share(run: dict) -> float:
    return _share(run["curve"][-1]["structures"], "backward")


def verdict(values: list[float], higher_is_claimed: bool = True) -> str:
    """Holds / does not hold / not shown, from the 95% t-interval of paired differences."""
    if len(values) < 2:
        return "not tested yet (fewer than 2 paired seeds)"
    mean, half = interval(values)
    tail = f" ({len(values)} seeds; preliminary)" if len(values) < 16 else f" ({len(values)} seeds)"
    if mean - half > 0:
        return ("holds" if higher_is_claimed else "does not hold") + tail
    if mean + half < 0:
        return ("does not hold: the reverse" if higher_is_claimed else "holds") + tail
    mde = minimum_detectable(values)
    shown = "n/a under 3 seeds" if math.isnan(mde) else f"{mde:.3f}"
    return f"not shown: the interval covers 0 (MDE {shown})" + tail


def _share(structures: dict, name: str) -> float:
    total = sum(count for _, count in structures.values())
    return structures.get(name, [0, 0])[1] / total if total else 0.0


def _abs(pair, digits: int = 3) -> str:
    """mean ± half-width of a level (no sign), "-" when missing."""
    if pair is None:
        return "-"
    return f"{pair[0]:.{digits}f} ± {pair[1]:.{digits}f}" if not math.isnan(pair[1]) else f"{pair[0]:.{digits}f}"


def _fmt(pair, digits: int = 3) -> str:
    if pair is None:
        return "-"
    mean, half = pair
    return f"{mean:+.{digits}f} ± {half:.{digits}f}" if not math.isnan(half) else f"{mean:+.{digits}f}"


def markdown(summary: dict, base: dict, rates: dict) -> str:
    grpo = summary.get("grpo")
    lines = [f"Base model (step 0): held-out accuracy {base['accuracy']:.3f}, pass@8 {base['pass_at_k']['8']:.3f}.",
             "",
             "| method | lr (sweep) | seeds | final accuracy | AUC | vs GRPO: final (wins) | vs GRPO: AUC | "
             "pass@8 vs GRPO | MDE (final) | CPU s/step | gen. tokens/step | steps to 0.85 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method, s in summary.items():
        ratio = f" ({s['cpu_per_step'] / grpo['cpu_per_step']:.1f}x)" if grpo else ""
        tok_ratio = f" ({s['tokens_per_step'] / grpo['tokens_per_step']:.2f}x)" if grpo else ""
        reach = (f"{s['steps_to_threshold']:.0f} ({s['reached']}/{s['seeds']})" if s["steps_to_threshold"]
                 else f"- (0/{s['seeds']})")
        mde = "-" if method == "grpo" or not s["mde_final"] else f"{s['mde_final']:.3f}"
        vs = "-" if method == "grpo" else f"{_fmt(s['diff_final'])} ({s['wins_final']}/{s['paired']})"
        lines.append(
            f"| {LABELS.get(method, method)} | {s['learning_rate']:g} | {s['seeds']} | {_fmt(s['final'])[1:]} | "
            f"{_fmt(s['auc'])[1:]} | {vs} | {'-' if method == 'grpo' else _fmt(s['diff_auc'])} | "
            f"{'-' if method == 'grpo' else _fmt(s['diff_pass8'])} | "
            f"{mde} | "
            f"{s['cpu_per_step']:.2f}{ratio} | {s['tokens_per_step']:.0f}{tok_ratio} | {reach} |")
    lines += ["", "Learning rates chosen on the sweep (mean validation AUC per rate):", ""]
    for method, chosen in rates.items():
        aucs = ", ".join(f"{r}: {a:.3f}" for r, a in chosen["sweep_auc"].items())
        lines.append(f"- {LABELS.get(method, method)}: {chosen['learning_rate']:g} ({aucs})")
    return "\n".join(lines) + "\n"


def beyond_sharpening(summary: dict, base: dict) -> str:
    """Each method's final accuracy at the training temperature, greedy accuracy and pass@64 beside the untrained
    model's sharpening baseline (its best temperature, or its best decoding where base_decodings.py measured them): a
    gain below the baseline is sharpening."""
    if "sharpening_baseline" not in base:
        return ("Greedy accuracy, pass@64 and the sharpening baseline were not measured for these runs (made before "
                "the runner measured them): rerun the grid, or `python -m trl_credit.testbed.profile --results "
                "<results-dir>/base_profile.json` for the baseline.\n")
    sharp = base["sharpening_baseline"]
    temps = ", ".join(f"T={t} {a:.3f}" for t, a in base["accuracy_by_temperature"].items())
    if "decoding" in sharp:  # the best of a wider set of decodings (base_decodings.py)
        named = (f"**Sharpening baseline** (the untrained model at its best of {len(sharp['decodings'])} decodings: "
                 "greedy, temperatures, top-p 0.9, min-p 0.1, each sampled and by majority vote of 8; "
                 f"benchmarks/tiny/base_decodings.py): {sharp['decoding']} {sharp['accuracy']:.3f} (at its best "
                 f"temperature alone, {sharp['best_temperature']['temperature']}: "
                 f"{sharp['best_temperature']['accuracy']:.3f}).")
    else:
        named = (f"**Sharpening baseline** (the untrained model at its best temperature, {sharp['temperature']}): "
                 f"{sharp['accuracy']:.3f}.")
    lines = [f"Base model: greedy {base['greedy_accuracy']:.3f}; {temps}; pass@64 "
             f"{base['pass_at_k_large'].get('64', float('nan')):.3f} (first {base['passk_problems']} held-out "
             f"problems x 64 samples at T=1); training prompts all-fail in their group of 8: "
             f"{base['train_all_fail_share']:.3f}. " + named, "",
             "| method | T=1 accuracy | greedy | greedy vs GRPO (z) | pass@64 | pass@64 vs GRPO | above the sharpening "
             "baseline? (lower 95% bound of its better of greedy and T=1) | gen. tokens/step (x GRPO's) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    grpo_tokens = summary.get("grpo", {}).get("tokens_per_step")
    for method, s in summary.items():
        tokens = f"{s['tokens_per_step']:.0f}" + (f" ({s['tokens_per_step'] / grpo_tokens:.2f}x)" if grpo_tokens else "")
        if "greedy" not in s:  # runs made before the runner measured greedy accuracy and pass@64
            low = s["final"][0] - s["final"][1]
            lines.append(f"| {LABELS.get(method, method)} | {_abs(s['final'])} | not measured | - | not measured | "
                         f"- | {'yes' if low > sharp['accuracy'] else 'no'} (T=1 accuracy) | {tokens} |")
            continue
        z = s.get("z_diff_greedy")
        diff = "-" if method == "grpo" or s.get("diff_greedy") is None else (
            _fmt(s["diff_greedy"]) + (f" ({z:+.1f})" if z is not None else ""))
        low = max(s["greedy"][0] - s["greedy"][1], s["final"][0] - s["final"][1])  # its best, 95% lower bound
        lines.append(f"| {LABELS.get(method, method)} | {_abs(s['final'])} | {_abs(s['greedy'])} | {diff} | "
                     f"{_abs(s.get('pass64'))} | "
                     f"{'-' if method == 'grpo' or not s.get('diff_pass64') else _fmt(s['diff_pass64'])} | "
                     f"{'yes' if low > sharp['accuracy'] else 'no'} | {tokens} |")
    return "\n".join(lines) + "\n"


def wider_baseline(by_temperature: dict, decodings: dict) -> dict:
    """The sharpening baseline as the best of the base profile's (greedy or a temperature) and base_decodings.py's
    decodings (sampled accuracy and maj@n of each): ``decoding``, ``accuracy``, ``decodings`` (every option) and
    ``best_temperature`` (the profile's baseline)."""
    name = "greedy" if by_temperature["temperature"] == "greedy" else f"T={by_temperature['temperature']}"
    options = {f"{name} (profile)": by_temperature["accuracy"]}
    for row in decodings["decodings"]:
        options[f"{row['decoding']} (sampled)"] = row["accuracy"]
        options[f"{row['decoding']} (maj@{decodings['samples']})"] = row["maj"]
    best = max(options, key=options.get)
    return dict(decoding=best, accuracy=options[best], decodings=options, best_temperature=by_temperature)


def plot_curves(runs: dict, base: dict, path: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for method in [m for m in ORDER if m in runs]:
        by_seed = runs[method]
        seeds = sorted(by_seed)
        steps = [c["step"] for c in by_seed[seeds[0]]["curve"]]
        acc = [[by_seed[s]["curve"][i]["accuracy"] for s in seeds] for i in range(len(steps))]
        toks = [statistics.fmean(by_seed[s]["curve"][i]["generated_tokens"] for s in seeds) for i in
                range(len(steps))]
        means = [interval(a) for a in acc]
        low = [max(0.0, m - (0 if math.isnan(h) else h)) for m, h in means]  # accuracy lies in [0, 1]
        high = [min(1.0, m + (0 if math.isnan(h) else h)) for m, h in means]
        for ax, x in zip(axes, (steps, toks)):
            ax.plot(x, [m for m, _ in means], color=COLORS.get(method), label=f"{LABELS.get(method, method)}")
            ax.fill_between(x, low, high, color=COLORS.get(method), alpha=0.15)
    axes[0].set_xlabel("optimizer step")
    axes[1].set_xlabel("generated tokens (all generation calls)")
    for ax in axes:
        ax.set_ylabel("held-out accuracy (8 samples, T=1)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Tiny testbed: held-out accuracy, mean and 95% band over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_pass_at_k(runs: dict, base: dict, path: str) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ks = sorted(int(k) for k in base["pass_at_k"])
    ax.plot(ks, [base["pass_at_k"][str(k)] for k in ks], "k--", label="base")
    for method in [m for m in ORDER if m in runs]:
        by_seed = runs[method]
        ax.plot(ks, [statistics.fmean(r["curve"][-1]["pass_at_k"][str(k)] for r in by_seed.values()) for k in ks],
                color=COLORS.get(method), label=LABELS.get(method, method))
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k (final)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--results-dir", default=RESULTS)
    parser.add_argument("--select-by", choices=("auc", "greedy_auc"), default="auc",
                        help="how the sweep chose each learning rate (benchmarks/tiny/tiny_grid.py --select-by)")
    args = parser.parse_args(argv)
    runs = load_runs(args.results_dir)
    if not runs:
        raise SystemExit(f"no runs in {args.results_dir}")
    with open(os.path.join(args.results_dir, "base.json")) as f:
        saved_base = json.load(f)
    base, profile = saved_base["eval"], saved_base.get("profile")
    profile_path = os.path.join(args.results_dir, "base_profile.json")  # python -m trl_credit.testbed.profile
    if profile is None and os.path.exists(profile_path):
        with open(profile_path) as f:
            profile = json.load(f)
    rates = sweep_choices(os.path.join(args.results_dir, "sweep"), select_by=args.select_by, seeds=GRID_SWEEP_SEEDS)
    summary = summarize(runs)
    base_summary = dict(accuracy=base["accuracy"], pass_at_k=base["pass_at_k"])
    if profile:  # the base at each temperature and the sharpening baseline (trl_credit.testbed.profile)
        base_summary.update({k: profile[k] for k in ("greedy_accuracy", "accuracy_by_temperature",
                                                     "sharpening_baseline", "pass_at_k_large", "passk_problems",
                                                     "train_all_fail_share", "test_all_fail_in_8")})
    decodings_path = os.path.join(args.results_dir, "base_decodings.json")
    if profile and os.path.exists(decodings_path):  # benchmarks/tiny/base_decodings.py: the baseline taken wide
        with open(decodings_path) as f:
            base_summary["sharpening_baseline"] = wider_baseline(base_summary["sharpening_baseline"], json.load(f))
    mechanisms_path = os.path.join(args.results_dir, "mechanisms.json")
    mechanisms = json.load(open(mechanisms_path))["methods"] if os.path.exists(mechanisms_path) else None
    text = markdown(summary, base, rates) + "\n" + beyond_sharpening(summary, base_summary) + "\n"
    saved = dict(base=base_summary, methods=summary)
    import regime_claims  # greedy, pass@64 and T=1 per claim, hard problems, all-fail share, PRIME's share

    if runs.get("grpo") and all("greedy_correct" in run["curve"][-1] for run in runs["grpo"].values()):
        sweep_dir = os.path.join(args.results_dir, "sweep")
        sweeps = (rates, sweep_choices(sweep_dir, select_by=args.select_by))  # seeds 100-101 and every sweep seed
        import claims_controls

        same_rate = claims_controls.load_same_rate(os.path.join(args.results_dir, "same_rate"))
        section, saved["claims"] = regime_claims.report(runs, base, summary, mechanisms, same_rate, sweeps)
        text += section
    else:  # a grid whose GRPO runs predate greedy evaluation: its claims at T=1
        import tiny_claims

        text += tiny_claims.claims_table(runs, summary, base, mechanisms)
        share = regime_claims.share_of_gain(runs, "t1")
        if share:
            saved["prime_share_of_oracle_gain_t1"] = share
            text += (f"\nPRIME's share of the process oracle's gain over GRPO (accuracy at T=1, {share['seeds']} "
                     f"seeds): {share['share']:.2f} (95% paired bootstrap {share['low']:.2f} to {share['high']:.2f}).\n")
    with open(os.path.join(args.results_dir, "summary.json"), "w") as f:
        json.dump(saved, f, indent=1)
    with open(os.path.join(args.results_dir, "report.md"), "w") as f:
        f.write(text)
    plot_curves(runs, base, os.path.join(args.results_dir, "curves.png"))
    plot_pass_at_k(runs, base, os.path.join(args.results_dir, "passk.png"))
    print(text)


if __name__ == "__main__":
    main()
