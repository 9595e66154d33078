"""PNG plots of the benchmark results (matplotlib, Agg backend): reward curves, pass@k before/after, overhead bars.

    python benchmarks/plots.py                         # reads benchmarks/results/{learning_seed0,overhead}.json
    python benchmarks/plots.py --learning benchmarks/results/learning_seed1.json
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
COLORS = {"grpo": "black", "cue_grpo": "tab:blue", "oppo": "tab:orange", "datpo": "tab:green", "srpo": "tab:red"}
LABELS = {"grpo": "GRPO", "cue_grpo": "Cue-GRPO", "oppo": "OPPO (self)", "datpo": "DATPO", "srpo": "SRPO"}


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
                  "step x from own work | generated tokens x | method components (median s/step) |",
                  "|---|---|---|---|---|---|---|---|"]
        for m, r in overhead["methods"].items():
            ratio = own_work_ratio(m, r)
            own = "-" if ratio is None else f"{ratio:.3f}"
            parts = ", ".join(f"{k} {v:.1f}" for k, v in r["components"][m].items() if v >= 0.05)
            lines.append(f"| {LABELS.get(m, m)} | {r['settings']['num_generations']} | {r['grpo_median_seconds']:.1f} | "
                         f"{r['method_median_seconds']:.1f} | {r['step_time_ratio']:.2f} | {own} | {r['token_ratio']:.2f} | "
                         f"{parts} |")
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
            lines.append(f"| {LABELS.get(m, m)} | {r['seconds_per_step']:.0f} | {first:.2f} / {last:.2f} "
                         f"(mean {sum(c['reward'] for c in curve) / max(len(curve), 1):.2f}) | "
                         f"{r['eval']['accuracy']:.3f} | "
                         + " | ".join(f"{r['eval']['pass_at_k'][str(k)]:.3f}" for k in ks) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learning", default=os.path.join(RESULTS, "learning_seed0.json"))
    parser.add_argument("--overhead", default=os.path.join(RESULTS, "overhead.json"))
    parser.add_argument("--markdown", action="store_true", help="also print the markdown tables of BENCHMARKS.md")
    args = parser.parse_args()
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
