"""Question: Where do the learning grid's resets land against the step checker, and which suffixes are corrected (Fig. 4)?

Where SRPO's, RRPO's and the oracle's resets land against the chain step checker, pooled over a learning grid
(SRPO paper Fig. 4), and how often the suffixes resampled from them are right.

Every SRPO-like run of ``learning.py --task chain`` records each reset it trained on (``resets`` in its JSON,
``harness.mechanisms.record_resets``): h*, the checker's first wrong step h_o, and its suffixes right / scored. This
script pools them per method over the seeds in ``--learning-dir``: h* before / exactly at / after h_o (Wilson
intervals over resets), and the correction rate after a clean prefix (h* <= h_o) vs an erroneous one (h* > h_o),
with an interval that resamples whole resets (a reset's suffixes share its prefix). Writes ``resets.json`` and
``resets.png`` into the folder and prints the markdown table.

    python benchmarks/mechanisms/chain_resets.py --learning-dir benchmarks/results/learning_chain
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

from harness import mechanisms as common  # noqa: E402
from harness.plots import COLORS, METHOD_ORDER, label_text  # noqa: E402


def pooled_resets(directory: str) -> dict[str, dict]:
    """Per method: its reset records over all seeds (each with its seed) and the seeds they came from."""
    out: dict[str, dict] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*_seed*.json"))):
        with open(path) as f:
            run = json.load(f)
        if "resets" not in run:
            continue
        entry = out.setdefault(run["method"], dict(seeds=[], resets=[]))
        entry["seeds"].append(run["seed"])
        entry["resets"] += [dict(r, seed=run["seed"]) for r in run["resets"]]
    return {m: out[m] for m in sorted(out, key=lambda m: (METHOD_ORDER + [m]).index(m))}


def summarize(directory: str) -> dict:
    return {method: dict(seeds=entry["seeds"], summary=common.reset_summary(entry["resets"]))
            for method, entry in pooled_resets(directory).items()}


def _interval(low_high, value):
    if not low_high or value is None:
        return ""
    return f" [{low_high[0]:.2f}, {low_high[1]:.2f}]"


def markdown(summaries: dict) -> str:
    lines = ["| method | seeds | resets (checked) | before h_o | exact | after h_o | mean h* − h_o | "
             "correction, clean prefix | correction, erroneous prefix |", "|---" * 9 + "|"]
    for method, entry in summaries.items():
        s, n = entry["summary"], max(entry["summary"]["checked"], 1)
        cells = [f"{s[p]} = {s[p] / n:.2f}{_interval(s[f'{p}_rate_ci95'], 1)}" for p in ("before", "exact", "after")]
        for key in ("correction_clean_prefix", "correction_erroneous_prefix"):
            r = s[key]
            cells.append("none" if r["rate"] is None else
                         f"{r['correct']}/{r['suffixes']} = {r['rate']:.2f}{_interval(r['ci95_over_resets'], 1)} "
                         f"({r['resets']} resets)")
        lines.append(f"| {label_text(method)} | {len(entry['seeds'])} | {s['resets']} ({s['checked']}) | "
                     + " | ".join(cells[:3]) + f" | {s['mean_deviation']:+.2f} | " + " | ".join(cells[3:]) + " |")
    return "\n".join(lines)


def plot(summaries: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(summaries)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    width = 0.8 / max(len(methods), 1)
    for panel, (ax, keys, ylabel) in enumerate((
            (axes[0], ("before", "exact", "after"), "share of checked resets (95% Wilson CI)"),
            (axes[1], ("correction_clean_prefix", "correction_erroneous_prefix"),
             "correction rate (95% CI resampling resets)"))):
        for i, method in enumerate(methods):
            s = summaries[method]["summary"]
            values, lows, highs = [], [], []
            for key in keys:
                if panel == 0:
                    n = max(s["checked"], 1)
                    value, ci = s[key] / n, s[f"{key}_rate_ci95"]
                else:
                    value, ci = s[key]["rate"], s[key]["ci95_over_resets"]
                if value is None:  # no reset of this kind: say so rather than draw a 0
                    ax.text(len(values) + (i - (len(methods) - 1) / 2) * width, 0.01, "none", rotation=90,
                            ha="center", va="bottom", fontsize=7)
                    value = 0.0
                values.append(value)
                lows.append(value - ci[0] if ci else 0)
                highs.append(ci[1] - value if ci else 0)
            xs = [k + (i - (len(methods) - 1) / 2) * width for k in range(len(keys))]
            ax.bar(xs, values, width, yerr=[lows, highs], capsize=3, color=COLORS.get(method),
                   label=f"{label_text(method)} ({s['checked']} checked resets)")
        ax.set_xticks(range(len(keys)), ["h* < h_o", "h* = h_o", "h* > h_o"] if panel == 0 else
                      ["clean prefix (h* <= h_o)", "erroneous prefix (h* > h_o)"])
        ax.set_ylim(0, 1.05)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    axes[0].set_title("Reset vs the checker's first wrong step")
    axes[1].set_title("Suffixes right after the reset (paper Fig. 4)")
    common.save_figure(fig, path, title)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--learning-dir", required=True, help="a learning.py --task chain results folder")
    args = parser.parse_args(argv)
    summaries = summarize(args.learning_dir)
    if not summaries:
        raise SystemExit(f"--learning-dir: no run in {args.learning_dir} recorded resets (SRPO-like runs of "
                         "learning.py --task chain record them)")
    with open(os.path.join(args.learning_dir, "resets.json"), "w") as f:
        json.dump(summaries, f, indent=1)
    plot(summaries, os.path.join(args.learning_dir, "resets.png"),
         "Resets against the chain step checker, pooled over the grid's seeds")
    print(markdown(summaries))
    return summaries


if __name__ == "__main__":
    main()
