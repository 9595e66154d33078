"""Question: At which setting does GRPO learn on the chain task, and what would the grid cost?

Summary of the GRPO pilot on the chain task (docs/testbed.md, "Learning comparison"): base vs trained held-out
accuracy with standard errors, and the core-hours the full grid would take at each pilot setting.

The runs are ``benchmarks/learning/learning.py --task chain --methods grpo --seeds 0 --samples 8 --steps S
--learning-rate LR --results-dir benchmarks/results/learning_chain_pilot/lr<LR>_steps<S>`` (``--threads 1``,
``OMP_NUM_THREADS=1``; base.json copied between the folders: same evaluation settings). Standard errors are over the
64 held-out problems (per-problem accuracy c/n; the gain paired over problems, ``plots.paired_problem_se``): they
carry sampling noise and the draw of problems, not the training seed's variance.

Runs on another warm-start build (``python -m trl_credit.testbed.warm_start --epochs 1 ...`` into another cache or
``--output_dir``, trained with ``learning.py --model``) keep that build's ``warm_start.json`` (its settings and
weights digest) in their folder, or have the digest in their settings; the summary names the build. A folder whose
run used a learning rate of ~0 is the evaluation control: trained = base exactly, gain 0 with SE 0.

Grid projection: per seed, every method's training costs GRPO's CPU seconds per step times its cost ratio to GRPO
(``COST_RATIO``: seconds per step of the committed arithmetic grid, benchmarks/results/learning, divided by GRPO's;
srpo_oracle taken as RRPO: no localization call; srpo_oppo, the composed method, as SRPO's ratio times OPPO's, an
estimate: OPPO's extra pass over SRPO's rows), plus one held-out evaluation at GRPO's measured CPU cost.

    python benchmarks/learning/chain_pilot.py   # writes benchmarks/results/chain_pilot.json
"""

from __future__ import annotations

import glob
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

from learning import DEFAULT_METHODS  # noqa: E402
from harness.plots import paired_problem_se  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
PILOT = os.path.join(RESULTS, "learning_chain_pilot")
METHODS = DEFAULT_METHODS["chain"]  # the chain grid's methods (Cue-GRPO with its structure partition there)


def accuracy_se(report: dict) -> tuple[float, float]:
    rates = [p["num_correct"] / p["num_samples"] for p in report["problems"]]
    m = sum(rates) / len(rates)
    return m, math.sqrt(sum((r - m) ** 2 for r in rates) / (len(rates) - 1) / len(rates))


def warm_start_of(folder: str, run: dict) -> str:
    """The warm-start build a pilot trained from: its record in the folder, else the digest in the run's settings,
    else the default build (runs before the digest was recorded)."""
    record = os.path.join(folder, "warm_start.json")
    if os.path.exists(record):
        with open(record) as f:
            build = json.load(f)
        config = build["config"]
        return (f"{build['weights_sha256']}: {config['epochs']:g} epochs, lr {config['learning_rate']:g}, "
                f"{config['num_examples']} examples")
    digest = run["settings"].get("model_sha256")
    return digest or "default smollm2-135m-chain (21424815b972987a)"


def cost_ratios() -> dict:
    per_step = {}
    for path in glob.glob(os.path.join(RESULTS, "learning", "*_seed*.json")):
        with open(path) as f:
            run = json.load(f)
        per_step.setdefault(run["method"], []).append(run["seconds_per_step"])
    mean = {m: sum(v) / len(v) for m, v in per_step.items()}
    ratios = {m: mean[m] / mean["grpo"] for m in mean}
    ratios["cue_grpo_structure"] = ratios["cue_grpo"]  # the same trainer, another partition function
    ratios["srpo_oracle"] = ratios["rrpo"]
    ratios["srpo_oppo"] = ratios["srpo"] * ratios["oppo"]
    return ratios


def other_methods(folder: str, base: dict, grpo: dict) -> dict:
    """Other methods run in a pilot's folder at its setting (``learning.py --methods M``, seed 0): held-out accuracy,
    the paired change against the base and against GRPO's run, and the per-structure tally."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "*_seed0.json"))):
        method = os.path.basename(path)[: -len("_seed0.json")]
        if method == "grpo":
            continue
        with open(path) as f:
            run = json.load(f)
        trained = run["eval"]
        out[method] = dict(accuracy=accuracy_se(trained), gain=paired_problem_se(trained, base),
                           vs_grpo=paired_problem_se(trained, grpo), pass_at_8=trained["pass_at_k"]["8"],
                           structures=trained.get("structures"), cpu_seconds_per_step=run["cpu_seconds_per_step"])
    return out


def main():
    ratios = cost_ratios()
    settings = []
    for folder in sorted(glob.glob(os.path.join(PILOT, "*"))):
        path = os.path.join(folder, "grpo_seed0.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            run = json.load(f)
        with open(os.path.join(folder, "base.json")) as f:
            base = json.load(f)["eval"]
        trained = run["eval"]
        gain, se = paired_problem_se(trained, base)
        build = warm_start_of(folder, run)
        steps, seeds = run["settings"]["steps"], 4
        train_cpu = run["cpu_seconds_per_step"] * steps * sum(ratios[m] for m in METHODS)
        eval_cpu = trained["eval_cpu_seconds"] * len(METHODS)
        settings.append(dict(
            folder=os.path.relpath(folder, RESULTS), warm_start=build,
            distributive_fraction=run["settings"].get("distributive_fraction") or 0.5,
            factor_friendly=run["settings"].get("factor_friendly", False), steps=steps,
            learning_rate=run["settings"]["learning_rate"], beta=run["settings"].get("beta", 0.0),
            prompts_per_step=run["settings"]["prompts"], generations=run["settings"]["generations"],
            base_accuracy=accuracy_se(base), trained_accuracy=accuracy_se(trained),
            base_pass_at_8=base["pass_at_k"]["8"], trained_pass_at_8=trained["pass_at_k"]["8"],
            gain=gain, gain_se=se, gain_z=gain / se if se > 0 else None,
            train_reward=[c["reward"] for c in run["reward_curve"]],
            # held-out samples per solution structure, [correct, samples] (runs since learning.py tallies them)
            base_structures=base.get("structures"), trained_structures=trained.get("structures"),
            cpu_seconds_per_step=run["cpu_seconds_per_step"], eval_cpu_seconds=trained["eval_cpu_seconds"],
            grid_core_hours=None if run["settings"]["learning_rate"] < 1e-9 else  # the evaluation control
            (seeds * (train_cpu + eval_cpu) + trained["eval_cpu_seconds"]) / 3600,
            other_methods=other_methods(folder, base, trained),
        ))
    out = dict(description=__doc__.split("\n\n")[0], cost_ratio_to_grpo=ratios, grid=f"{len(METHODS)} methods x 4 seeds",
               settings=settings)
    path = os.path.join(RESULTS, "chain_pilot.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    for s in settings:
        z = "n/a" if s["gain_z"] is None else f"{s['gain_z']:.1f}"
        print(f"{s['folder']} [{s['warm_start']}, distributive {s['distributive_fraction']}"
              f"{' factor-friendly' if s['factor_friendly'] else ''}, beta {s['beta']:g}]: "
              f"base {s['base_accuracy'][0]:.3f} ± {s['base_accuracy'][1]:.3f} -> trained "
              f"{s['trained_accuracy'][0]:.3f} ± {s['trained_accuracy'][1]:.3f}, gain {s['gain']:+.3f} (SE "
              f"{s['gain_se']:.3f}, z {z}); {s['cpu_seconds_per_step']:.0f} CPU s/step, eval "
              f"{s['eval_cpu_seconds']:.0f} CPU s"
              + ("" if s["grid_core_hours"] is None else f"; grid {s['grid_core_hours']:.1f} core-hours"))
        if s["trained_structures"]:
            print("  held-out samples per structure [correct, samples]: base", s["base_structures"], "-> trained",
                  s["trained_structures"])
        for method, m in s["other_methods"].items():
            print(f"  {method} (same setting, seed 0): {m['accuracy'][0]:.3f} ± {m['accuracy'][1]:.3f}, vs base "
                  f"{m['gain'][0]:+.3f} (SE {m['gain'][1]:.3f}), vs GRPO {m['vs_grpo'][0]:+.3f} (SE {m['vs_grpo'][1]:.3f}); "
                  f"{m['cpu_seconds_per_step']:.0f} CPU s/step; per structure {m['structures']}")
    print(path)


if __name__ == "__main__":
    main()
