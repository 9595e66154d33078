"""PNG plots of the benchmark results (matplotlib, Agg backend): reward curves, pass@k before/after, overhead bars,
and the seeded learning comparison (one JSON per method and seed, ``benchmarks/learning/learning.py``): held-out accuracy and
pass@k with 95% confidence intervals over seeds, paired differences vs GRPO per seed, reward curves (mean and band).

    python benchmarks/harness/plots.py                         # reads benchmarks/results/{learning_seed0,overhead}.json
    python benchmarks/harness/plots.py --learning benchmarks/results/learning_seed1.json
    python benchmarks/harness/plots.py --learning-dir benchmarks/results/learning --markdown
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
COLORS = {"grpo": "black", "cue_grpo": "tab:blue", "cue_grpo_structure": "tab:cyan", "oppo": "tab:orange",
          "datpo": "tab:green", "srpo": "tab:red", "rrpo": "tab:purple", "srpo_base": "tab:brown",
          "srpo_oracle": "tab:pink", "srpo_oppo": "tab:olive"}
LABELS = {"grpo": "GRPO", "cue_grpo": "Cue-GRPO", "cue_grpo_structure": "Cue-GRPO\n(structure partition)",
          "oppo": "OPPO (self)", "datpo": "DATPO", "srpo": "SRPO", "rrpo": "RRPO", "srpo_base": "SRPO\n(base seeds)",
          "srpo_oracle": "SRPO\n(oracle reset)", "srpo_oppo": "SRPO x OPPO"}


def tick_label(method: str) -> str:
    """A method's label wrapped to ~10 characters a line: eight methods side by side on one axis overlap otherwise."""
    return "\n".join(textwrap.fill(line, 10) for line in LABELS.get(method, method).split("\n"))


METHOD_ORDER = ["grpo", "cue_grpo", "cue_grpo_structure", "oppo", "datpo", "srpo", "rrpo", "srpo_oracle", "srpo_oppo"]


def plot_rewards(learning: dict, path: str) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for method, run in learning["methods"].items():
        curve = run["reward_curve"]
        ax.plot([c["step"] for c in curve], [c["reward"] for c in curve], marker="o", color=COLORS.get(method),
                label=LABELS.get(method, method))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean training reward (final_number)")
    s = learning["settings"]
    ax.set_title(f"Training reward, SmolLM2-135M + LoRA, seed {s['seed']}, {s['prompts']} prompts/step")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_pass_at_k(learning: dict, path: str) -> str:
    fig, ax = plt.subplots(figsize=(6.4, 4))
    base = learning["base"]["pass_at_k"]
    ks = sorted(int(k) for k in base)
    ax.plot(ks, [base[str(k)] for k in ks], "k--", marker="s", label="base model (before)")
    for method, run in learning["methods"].items():
        after = run["eval"]["pass_at_k"]
        ax.plot(ks, [after[str(k)] for k in ks], marker="o", color=COLORS.get(method),
                label=f"{LABELS.get(method, method)} (after)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("k (samples per problem)")
    ax.set_ylabel("pass@k (unbiased)")
    s = learning["settings"]
    ax.set_title(f"Held-out pass@k, {s['test_problems']} problems x {s['samples']} samples, after {s['steps']} steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_overhead(overhead: dict, path: str) -> str:
    methods = list(overhead["methods"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = range(len(methods))
    width = 0.38
    times = [overhead["methods"][m]["step_time_ratio"] for m in methods]
    tokens = [overhead["methods"][m]["token_ratio"] for m in methods]
    ax1.bar([i - width / 2 for i in x], times, width, label="step time / GRPO", color="tab:blue")
    ax1.bar([i + width / 2 for i in x], tokens, width, label="generated tokens / GRPO", color="tab:gray")
    ax1.axhline(1.0, color="black", lw=0.8)
    ax1.set_xticks(list(x), [LABELS.get(m, m) for m in methods])
    ax1.set_ylabel("ratio to GRPO (same settings, interleaved)")
    ax1.set_title("Cost over GRPO")
    ax1.legend(fontsize=8)
    for i, (t, k) in enumerate(zip(times, tokens)):
        ax1.text(i - width / 2, t, f"{t:.2f}", ha="center", va="bottom", fontsize=8)
        ax1.text(i + width / 2, k, f"{k:.2f}", ha="center", va="bottom", fontsize=8)
    # Component profile: median seconds per step of each timed component, GRPO baseline vs method.
    bars, labels = [], []
    for m in methods:
        for who in ("grpo", m):
            parts = overhead["methods"][m]["components"][who]
            step = overhead["methods"][m]["grpo_median_seconds" if who == "grpo" else "method_median_seconds"]
            bars.append((parts, step))
            labels.append(f"{LABELS.get(m, m)}\n" + ("GRPO" if who == "grpo" else "method"))
    # The generic timers do not overlap (method timers do: DATPO's tree contains its branch generation, OPPO's
    # oracle pass is a no-grad log-prob pass), so the stack is generation + no-grad log-prob passes + rewards +
    # the rest of the step (method bookkeeping, loss forward/backward, optimizer). Method timers are in the JSON.
    stack = [("generation", "tab:green"), ("logprob_passes (no grad)", "tab:orange"), ("rewards", "tab:purple")]
    for i, (parts, step) in enumerate(bars):
        bottom = 0.0
        for key, color in stack:
            value = parts.get(key, 0.0)
            ax2.bar(i, value, 0.7, bottom=bottom, color=color, label=key if i == 0 else None)
            bottom += value
        ax2.bar(i, max(step - bottom, 0.0), 0.7, bottom=bottom, color="lightgray",
                label="rest (method work, loss fwd/bwd, optimizer)" if i == 0 else None)
    ax2.set_xticks(range(len(labels)), labels, fontsize=7)
    ax2.set_ylabel("seconds per step (median)")
    ax2.set_title("Where the time goes (median seconds per step)")
    ax2.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# The method's own work (timer names of harness.instrument); nested generation/log-prob time is included.
OWN_WORK = {"cue_grpo": "cue: cue extraction + partition + weights", "oppo": "oppo: oracle pass + recursion",
            "datpo": "datpo: tree (forks + branches + scoring)"}


def own_work_ratio(method: str, result: dict) -> float | None:
    """Step time over the same step without the method's own work: median step / (median step - own work).

    A second estimate of the overhead, insensitive to the two runs sampling completions of different lengths
    (which moves whole-step times on a CPU far more than the method itself)."""
    key = OWN_WORK.get(method)
    if key is None or key not in result["components"][method]:
        return None
    own, step = result["components"][method][key], result["method_median_seconds"]
    return step / max(step - own, 1e-9)


def markdown_tables(learning: dict | None, overhead: dict | None) -> str:
    """The tables of BENCHMARKS.md, from the result JSONs."""
    lines = []
    if overhead:
        lines += ["| method | rollouts/prompt | GRPO s/step | method s/step | step time x (median paired) | "
                  "step x from own work | generated tokens x [per-step range] | method components (median s/step) |",
                  "|---|---|---|---|---|---|---|---|"]
        for m, r in overhead["methods"].items():
            ratio = own_work_ratio(m, r)
            own = "-" if ratio is None else f"{ratio:.3f}"
            parts = ", ".join(f"{k} {v:.1f}" for k, v in r["components"][m].items() if v >= 0.05)
            time_x, token_x = f"{r['step_time_ratio']:.2f}", f"{r['token_ratio']:.2f}"
            if "step_time_ratios" in r:  # median [min, max] of the paired steps
                spread = r["step_time_ratios"]
                time_x += f" [{spread['min']:.2f}, {spread['max']:.2f}]"
                spread = r["token_ratios"]
                token_x += f" [{spread['min']:.2f}, {spread['max']:.2f}]"
            lines.append(f"| {label_text(m)} | {r['settings']['num_generations']} | {r['grpo_median_seconds']:.1f} | "
                         f"{r['method_median_seconds']:.1f} | {time_x} | {own} | {token_x} | {parts} |")
        lines.append("")
    if learning:
        base = learning["base"]
        ks = sorted(int(k) for k in base["pass_at_k"])
        lines += ["| model | s/step | mean train reward (first / last step) | accuracy | "
                  + " | ".join(f"pass@{k}" for k in ks) + " |", "|---" * (4 + len(ks)) + "|"]
        lines.append("| base (before) | - | - | " + f"{base['accuracy']:.3f} | "
                     + " | ".join(f"{base['pass_at_k'][str(k)]:.3f}" for k in ks) + " |")
        for m, r in learning["methods"].items():
            curve = r["reward_curve"]
            first, last = (curve[0]["reward"], curve[-1]["reward"]) if curve else (float("nan"),) * 2
            lines.append(f"| {label_text(m)} | {r['seconds_per_step']:.0f} | {first:.2f} / {last:.2f} "
                         f"(mean {sum(c['reward'] for c in curve) / max(len(curve), 1):.2f}) | "
                         f"{r['eval']['accuracy']:.3f} | "
                         + " | ".join(f"{r['eval']['pass_at_k'][str(k)]:.3f}" for k in ks) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ seeded learning comparison (learning.py)


def mean_ci(values, level: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of the two-sided ``level`` t-interval, n) of independent values (seeds); half-width NaN
    for n < 2."""
    import math

    from scipy import stats

    values = [float(v) for v in values]
    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), 0
    m = sum(values) / n
    if n < 2:
        return m, float("nan"), n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m, stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n), n


def paired_problem_se(after: dict, before: dict) -> tuple[float, float]:
    """Held-out gain of one trained model over the base model and its standard error, paired over problems:
    d_p = accuracy_p(after) − accuracy_p(before) (same problems, same number of samples), SE = sd(d_p)/sqrt(P).
    Carries both the sampling noise and which problems were drawn; not the training seed's variance."""
    return pooled_gain([after], before)


def pooled_gain(afters: list[dict], before: dict) -> tuple[float, float]:
    """Held-out gain of several trained models (one per seed) over the base model, pooled over seeds and paired over
    problems: d_p = mean over seeds of accuracy_p(after) − accuracy_p(before), SE = sd(d_p)/sqrt(P). The seeds'
    samples average out sampling noise; which problems were drawn stays; the seeds' spread is in the t-interval over
    the per-seed gains instead."""
    import math

    rate = {p["question"]: p["num_correct"] / p["num_samples"] for p in before["problems"]}
    after_rates = [{p["question"]: p["num_correct"] / p["num_samples"] for p in after["problems"]} for after in afters]
    diffs = [sum(r[q] for r in after_rates) / len(after_rates) - rate[q] for q in rate]
    n = len(diffs)
    m = sum(diffs) / n
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / (n - 1)) if n > 1 else float("nan")
    return m, sd / math.sqrt(n)


def gains_over(afters: dict[int, dict], before: dict) -> tuple[list[dict], dict]:
    """Gain over ``before`` of each seed's report (``afters``: seed -> report) and of all seeds pooled, paired over
    problems (``pooled_gain``), with z = gain / SE; the pooled entry adds the t-interval over the per-seed gains."""
    per_seed = []
    for seed, after in afters.items():
        gain, se = pooled_gain([after], before)
        per_seed.append(dict(seed=seed, gain=gain, se=se, z=gain / se if se else float("nan")))
    gain, se = pooled_gain(list(afters.values()), before)
    return per_seed, dict(gain=gain, se=se, z=gain / se if se else float("nan"),
                          seeds_ci=mean_ci([row["gain"] for row in per_seed]))


def seed_gains_text(per_seed: list[dict]) -> str:
    return ", ".join(f"seed {row['seed']}: {row['gain']:+.3f} (SE {row['se']:.3f}, z {row['z']:.1f})"
                     for row in per_seed)


def greedy_report(report: dict) -> dict:
    """One greedy decode per problem as a report of one sample per problem (``greedy_correct`` is in the order of
    ``problems``), so the paired gains above apply to greedy accuracy unchanged."""
    return {"problems": [dict(question=p["question"], num_correct=int(c), num_samples=1)
                         for p, c in zip(report["problems"], report["greedy_correct"], strict=True)]}


def pass_curve(report: dict) -> dict:
    """Unbiased pass@k for every k = 1..n from the per-problem counts (``trl_credit.evaluation.metrics.pass_at_k``), averaged
    over problems; ``report["pass_at_k"]`` only holds the budgets 1, 4, 8, ..."""
    from trl_credit.evaluation.metrics import pass_at_k

    n = min(p["num_samples"] for p in report["problems"])
    return {k: sum(pass_at_k(p["num_samples"], p["num_correct"], k) for p in report["problems"])
            / len(report["problems"]) for k in range(1, n + 1)}


def load_learning_dir(directory: str) -> dict:
    """{"base": report, "base_file": base.json, "runs": {method: {seed: run}}} from ``base.json`` and
    ``<method>_seed<k>.json``."""
    import glob
    import re

    out = {"base": None, "base_file": None, "runs": {}}
    base_path = os.path.join(directory, "base.json")
    if os.path.exists(base_path):
        with open(base_path) as f:
            out["base_file"] = json.load(f)  # + by_temperature and sharpening_baseline where measured
        out["base"] = out["base_file"]["eval"]
    for path in sorted(glob.glob(os.path.join(directory, "*_seed*.json"))):
        match = re.fullmatch(r"(.+)_seed(\d+)\.json", os.path.basename(path))
        if not match:
            continue
        with open(path) as f:
            out["runs"].setdefault(match.group(1), {})[int(match.group(2))] = json.load(f)
    out["runs"] = {m: out["runs"][m] for m in sorted(out["runs"], key=lambda m: (METHOD_ORDER + [m]).index(m))}
    return out


def learning_summary(data: dict) -> dict:
    """Per method: accuracy and pass@k (mean, 95% CI over seeds), paired differences vs GRPO (same seed), and the
    per-run gain over the base model with its paired-over-problems standard error."""
    base = data["base"]
    grpo = data["runs"].get("grpo", {})
    summary = {}
    for method, runs in data["runs"].items():
        seeds = sorted(runs)
        curves = {s: pass_curve(runs[s]["eval"]) for s in seeds}
        ks = sorted(set.intersection(*(set(c) for c in curves.values())))
        entry = dict(seeds=seeds, accuracy=mean_ci([runs[s]["eval"]["accuracy"] for s in seeds]),
                     pass_at_k={k: mean_ci([curves[s][k] for s in seeds]) for k in ks},
                     seconds_per_step=mean_ci([runs[s]["seconds_per_step"] for s in seeds])[0])
        if base is not None:
            entry["gain_over_base"], entry["gain_over_base_pooled"] = gains_over({s: runs[s]["eval"] for s in seeds},
                                                                                  base)
        if all("greedy_accuracy" in runs[s]["eval"] for s in seeds):  # runs made with --greedy-eval
            entry["greedy_accuracy"] = mean_ci([runs[s]["eval"]["greedy_accuracy"] for s in seeds])
            greedy_paired = [s for s in seeds if "greedy_accuracy" in grpo.get(s, {}).get("eval", {})]
            greedy_known = base is not None and "greedy_correct" in base
            if greedy_known and all("greedy_correct" in runs[s]["eval"] for s in seeds):
                # Learning beyond sharpening where the base's best decoding is greedy: the trained model's greedy
                # answer against the base's on the same problems.
                per_seed, pooled = gains_over({s: greedy_report(runs[s]["eval"]) for s in seeds}, greedy_report(base))
                entry["greedy_gain_over_base"] = dict(per_seed=per_seed, pooled=pooled)
            if method != "grpo" and greedy_paired:
                entry["diff_greedy_accuracy"] = mean_ci([runs[s]["eval"]["greedy_accuracy"]
                                                         - grpo[s]["eval"]["greedy_accuracy"] for s in greedy_paired])
        if method != "grpo":
            paired = [s for s in seeds if s in grpo]
            entry["paired_seeds"] = paired
            entry["diff_accuracy"] = mean_ci([runs[s]["eval"]["accuracy"] - grpo[s]["eval"]["accuracy"] for s in paired])
            grpo_curves = {s: pass_curve(grpo[s]["eval"]) for s in paired}
            entry["diff_pass_at_k"] = {k: mean_ci([curves[s][k] - grpo_curves[s][k] for s in paired
                                                   if k in grpo_curves[s]]) for k in ks}
            entry["diff_per_seed"] = {s: runs[s]["eval"]["accuracy"] - grpo[s]["eval"]["accuracy"] for s in paired}
            # The same difference per seed with its 95% CI paired over problems (sampling noise, not seed variance).
            entry["diff_per_seed_problem_ci"] = {s: (d, 1.96 * se) for s in paired
                                                 for d, se in [paired_problem_se(runs[s]["eval"], grpo[s]["eval"])]}
        summary[method] = entry
    return summary


def plot_learning_dir(data: dict, summary: dict, path: str) -> str:
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    methods = list(data["runs"])
    base = data["base"]
    ax = axes[0][0]  # held-out accuracy, mean and 95% CI, seeds as dots
    for i, m in enumerate(methods):
        mean, half, n = summary[m]["accuracy"]
        ax.errorbar(i, mean, yerr=None if half != half else half, fmt="o", color=COLORS.get(m), capsize=5, ms=8)
        ax.scatter([i + 0.15] * n, [data["runs"][m][s]["eval"]["accuracy"] for s in summary[m]["seeds"]],
                   color=COLORS.get(m), s=12, alpha=0.6)
    if base is not None:
        ax.axhline(base["accuracy"], color="gray", ls="--", label=f"base model {base['accuracy']:.3f}")
        ax.legend(fontsize=8)
    ax.set_xticks(range(len(methods)), [tick_label(m) for m in methods], fontsize=8)
    ax.set_ylabel("held-out accuracy (pass@1)")
    ax.set_title("Held-out accuracy: mean, 95% CI over seeds, each seed")

    ax = axes[0][1]  # pass@k with CI bands
    for m in methods:
        ks = sorted(summary[m]["pass_at_k"])
        means = [summary[m]["pass_at_k"][k][0] for k in ks]
        halves = [summary[m]["pass_at_k"][k][1] for k in ks]
        ax.plot(ks, means, marker="o", ms=3, color=COLORS.get(m), label=LABELS.get(m, m))
        if all(h == h for h in halves):
            # pass@k is a probability: a t-interval over 2-3 seeds can reach past [0, 1], the band stops there
            ax.fill_between(ks, [max(a - h, 0.0) for a, h in zip(means, halves)],
                            [min(a + h, 1.0) for a, h in zip(means, halves)], color=COLORS.get(m), alpha=0.12)
    if base is not None:
        base_curve = pass_curve(base)
        ax.plot(list(base_curve), list(base_curve.values()), "k--", lw=1, label="base model")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("k")
    ax.set_ylabel("pass@k (unbiased)")
    ax.set_title("Held-out pass@k, k = 1..16 (band: 95% CI over seeds)")
    ax.legend(fontsize=7)

    ax = axes[1][0]  # paired differences vs GRPO
    others = [m for m in methods if m != "grpo"]
    for i, m in enumerate(others):
        mean, half, n = summary[m].get("diff_accuracy", (float("nan"),) * 2 + (0,))
        ax.errorbar(i, mean, yerr=None if half != half else half, fmt="o", color=COLORS.get(m), capsize=5, ms=8)
        per_seed = summary[m].get("diff_per_seed", {})
        ax.scatter([i + 0.15] * len(per_seed), list(per_seed.values()), color=COLORS.get(m), s=12, alpha=0.6)
    ax.axhline(0.0, color="black", lw=1)
    ax.set_xticks(range(len(others)), [tick_label(m) for m in others], fontsize=8)
    ax.set_ylabel("accuracy − GRPO's (same seed)")
    ax.set_title("Paired difference vs GRPO: mean, 95% CI, each seed")

    ax = axes[1][1]  # reward curves, mean and min-max band over seeds
    for m in methods:
        curves = [[c["reward"] for c in data["runs"][m][s]["reward_curve"]] for s in summary[m]["seeds"]]
        length = min(len(c) for c in curves)
        steps = list(range(1, length + 1))
        columns = list(zip(*[c[:length] for c in curves]))
        ax.plot(steps, [sum(col) / len(col) for col in columns], color=COLORS.get(m), label=LABELS.get(m, m))
        ax.fill_between(steps, [min(col) for col in columns], [max(col) for col in columns], color=COLORS.get(m),
                        alpha=0.12)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("mean training reward")
    ax.set_title("Training reward (mean over seeds, band: min-max)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def label_text(method: str) -> str:
    """A method's label on one line (figure labels break lines; a markdown table row cannot)."""
    return LABELS.get(method, method).replace("\n", " ")


def beyond_sampling_lines(data: dict, summary: dict) -> list[str]:
    """Greedy accuracy per method (paired with GRPO) beside the sharpening baseline: the base model at its best
    decoding (benchmarks/learning/learning.py base_by_temperature). A method learned only where it beats it."""
    sharp = (data.get("base_file") or {}).get("sharpening_baseline")
    lines = []
    if sharp:
        options = ", ".join(f"{name} {value:.3f}" for name, value in sharp["options"].items())
        lines.append(f"Sharpening baseline (the base model at its best decoding, {sharp['decoding']}): "
                     f"{sharp['accuracy']:.3f} ({options}).")
    else:
        lines.append("Sharpening baseline: not measured for this grid (rerun learning.py: it samples the base at "
                     "--base-temperatures and greedily once).")
    for m, entry in summary.items():
        if "greedy_accuracy" not in entry:
            # An older grid: its accuracy at the evaluation temperature is the only decoding measured. Above the
            # baseline it learned beyond sharpening; below, the runs cannot say (greedy might have been higher).
            acc = entry["accuracy"][0]
            verdict = ("" if not sharp else f" — above the sharpening baseline with accuracy {acc:.3f}"
                       if acc > sharp["accuracy"] else f" — accuracy {acc:.3f} is not above the sharpening baseline: "
                       "these runs do not show a gain beyond sharpening")
            lines.append(f"- {label_text(m)}: greedy accuracy not measured (runs made before --greedy-eval)"
                         + verdict)
            continue
        g, half, n = entry["greedy_accuracy"]
        diff = entry.get("diff_greedy_accuracy")
        best = max(g, entry["accuracy"][0])
        verdict = ("" if not sharp else " — above the sharpening baseline" if best > sharp["accuracy"]
                   else " — not above the sharpening baseline: what it gained is sharpening")
        lines.append(f"- {label_text(m)}: greedy {g:.3f}" + ("" if half != half else f" ± {half:.3f}")
                     + ("" if diff is None else f", vs GRPO {diff[0]:+.3f} ± {diff[1]:.3f} (n={diff[2]})") + verdict)
        gain = entry.get("greedy_gain_over_base")
        if gain:
            pooled = gain["pooled"]
            lines.append("  greedy gain over the base's greedy (paired over problems; z = gain / SE): "
                         + seed_gains_text(gain["per_seed"])
                         + (f"; pooled over the {len(gain['per_seed'])} seeds {pooled['gain']:+.3f} "
                            f"(SE {pooled['se']:.3f}, z {pooled['z']:.1f})" if len(gain["per_seed"]) > 1 else ""))
    return lines


def learning_markdown(data: dict, summary: dict) -> str:
    base = data["base"]
    lines = []
    # pass@k at every power of 2 any model was sampled for (the base often has more samples than the runs)
    largest = max([max(pass_curve(base))] if base is not None else []
                  + [max(entry["pass_at_k"], default=1) for entry in summary.values()])
    ks = [2 ** i for i in range(largest.bit_length()) if 2 ** i <= largest]
    header = "| model | seeds | s/step | accuracy (95% CI) | " + " | ".join(f"pass@{k}" for k in ks) + \
        " | Δ accuracy vs GRPO (paired, 95% CI) |"
    lines += [header, "|---" * (5 + len(ks)) + "|"]
    if base is not None:
        base_curve = pass_curve(base)
        lines.append(f"| base model | - | - | {base['accuracy']:.3f} | "
                     + " | ".join(f"{base_curve.get(k, float('nan')):.3f}" for k in ks) + " | - |")
    for m, entry in summary.items():
        acc, half, n = entry["accuracy"]
        cells = []
        for k in ks:
            v = entry["pass_at_k"].get(k)
            cells.append("-" if v is None else f"{v[0]:.3f}" + ("" if v[1] != v[1] else f" ± {v[1]:.3f}"))
        diff = entry.get("diff_accuracy")
        diff_text = "-" if diff is None else f"{diff[0]:+.3f} ± {diff[1]:.3f} (n={diff[2]})"
        acc_text = f"{acc:.3f}" + ("" if half != half else f" ± {half:.3f}")
        lines.append(f"| {label_text(m)} | {n} | {entry['seconds_per_step']:.0f} | {acc_text} | "
                     + " | ".join(cells) + f" | {diff_text} |")
    lines += [""] + beyond_sampling_lines(data, summary)
    lines.append("")
    lines.append("Per-run held-out gain over the base model (paired over problems; z = gain / SE):")
    lines.append("")
    for m, entry in summary.items():
        gains = seed_gains_text(entry.get("gain_over_base", []))
        pooled = entry.get("gain_over_base_pooled")
        if pooled and len(entry["seeds"]) > 1:
            g, half, n = pooled["seeds_ci"]
            gains += (f"; pooled over the {n} seeds {pooled['gain']:+.3f} (SE {pooled['se']:.3f} over problems, "
                      f"z {pooled['z']:.1f}; 95% t-interval over seeds ± {half:.3f})")
        lines.append(f"- {label_text(m)}: {gains}")
    lines += ["", "Per-seed difference in accuracy vs GRPO (same seed; 95% CI paired over problems):", ""]
    for m, entry in summary.items():
        if entry.get("diff_per_seed_problem_ci"):
            lines.append(f"- {label_text(m)}: " + ", ".join(
                f"seed {s}: {d:+.3f} ± {h:.3f}" for s, (d, h) in entry["diff_per_seed_problem_ci"].items()))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--learning-dir", default=None,
                        help="directory of learning.py's per-run JSONs (base.json, <method>_seed<k>.json)")
    parser.add_argument("--learning", default=os.path.join(RESULTS, "learning_seed0.json"))
    parser.add_argument("--overhead", default=os.path.join(RESULTS, "overhead.json"))
    parser.add_argument("--markdown", action="store_true", help="also print the markdown tables of BENCHMARKS.md")
    args = parser.parse_args()
    if args.learning_dir:
        data = load_learning_dir(args.learning_dir)
        if not data["runs"]:
            raise SystemExit(f"no <method>_seed<k>.json in {args.learning_dir}")
        summary = learning_summary(data)
        with open(os.path.join(args.learning_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print(plot_learning_dir(data, summary, os.path.join(args.learning_dir, "learning.png")))
        print(learning_markdown(data, summary))
        return
    learning = overhead = None
    if os.path.exists(args.learning):
        with open(args.learning) as f:
            learning = json.load(f)
        tag = os.path.splitext(os.path.basename(args.learning))[0]
        print(plot_rewards(learning, os.path.join(RESULTS, f"{tag}_reward.png")))
        print(plot_pass_at_k(learning, os.path.join(RESULTS, f"{tag}_pass_at_k.png")))
    if os.path.exists(args.overhead):
        with open(args.overhead) as f:
            overhead = json.load(f)
        print(plot_overhead(overhead, os.path.join(RESULTS, "overhead.png")))
    if args.markdown:
        print(markdown_tables(learning, overhead))


if __name__ == "__main__":
    main()
