"""The tool regime's grid (docs/testbed.md#the-tool-regime, BENCHMARKS.md §8): every method of
``trl_credit.testbed.tool_runner.TOOL_METHODS`` trained from the regime's model through TRL's tool loop, measured with
the training prompt. Resumable (a run whose JSON exists with the same settings is skipped), one thread per worker::

    python benchmarks/tools/tool_grid.py base                                               # the untrained model
    python benchmarks/tools/tool_grid.py sweep  --methods grpo process oppo --rates 3e-4 1e-3 --seeds 100-103
    python benchmarks/tools/tool_grid.py report --methods grpo process oppo --seeds 0-15   # at each one's sweep rate
    python benchmarks/tools/tool_grid.py summary                                           # summary.json + tables

The sweep's seeds (100+) are kept apart from the reported ones (0-15); a method's rate is the one with the best mean
final T=1 accuracy over the sweep seeds it ran at every rate. ``summary`` pairs every method with GRPO on the
reported seeds it shares with it (the same seed: the same prompts, initial sampling state and evaluation draws).
Every method trains ``--steps`` steps but DATPO, which trains as many as generate GRPO's tokens (``method_steps``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "tools")
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "tiny"))
sys.path.insert(1, os.path.join(ROOT, "benchmarks"))  # the harness package
from harness.machine import cpu_kind  # noqa: E402
from tiny_grid import _setup_worker, run_jobs  # noqa: E402

#: What a run's JSON must match to be reused (with its method, rate and seed, which name its file).
RUN_KEYS = ("steps", "eval_samples", "eval_rows", "eval_every")
#: Methods compared with GRPO at equal generated model tokens, not equal steps: DATPO's trees generate ~2.5x GRPO's
#: tokens a step, and its paper's efficiency claim (DATPO, Fig. 2: pass rate at the same number of generated tokens)
#: is a claim at equal tokens. They train for the steps at which their tokens match GRPO's ``--steps`` steps'.
EQUAL_TOKEN_METHODS = ("datpo",)
#: Where tokens a step are measured, for GRPO and each of those: the first sweep (30 steps, seed 100, 3e-4), where
#: neither had learned yet (GRPO's tokens a step then stay within 2% over its 120-step runs).
TOKEN_RATE_RUN = dict(phase="sweep_30steps", rate=3e-4, seed=100)


def run_path(phase: str, method: str, rate: float, seed: int) -> str:
    return os.path.join(RESULTS, phase, f"{method}_lr{rate:g}_seed{seed}.json")


def one_run(job: dict) -> dict:
    _setup_worker()  # one thread, offline, quiet (the tiny grid's)
    from trl_credit.testbed.tool_runner import run_tools

    result = run_tools(job["method"], job["seed"], job["learning_rate"], steps=job["settings"]["steps"],
                       eval_samples=job["settings"]["eval_samples"], eval_rows=job["settings"]["eval_rows"],
                       eval_every=job["settings"].get("eval_every", 0))
    # per-step logs kept short: the rewards and the methods' own metrics, not TRL's whole log line
    keep = ("reward", "tools/call_frequency", "completions/mean_length", "frac_reward_zero_std")
    result["logs"] = [{k: v for k, v in log.items() if k in keep or "/" in k and k.split("/")[0] in
                       ("srpo", "oppo", "process", "prime", "datpo", "rewards")} for log in result["logs"]]
    result["config"] = result.pop("settings")  # the trainer's settings; "settings" is the grid's (RUN_KEYS)
    saved = dict(method=job["method"], learning_rate=job["learning_rate"], seed=job["seed"],
                 settings=job["settings"], cpu=cpu_model(), **result)
    os.makedirs(os.path.dirname(job["path"]), exist_ok=True)
    with open(job["path"] + ".tmp", "w") as f:
        json.dump(saved, f)
    os.replace(job["path"] + ".tmp", job["path"])
    return saved


def tokens_per_step(method: str) -> float:
    path = run_path(TOKEN_RATE_RUN["phase"], method, TOKEN_RATE_RUN["rate"], TOKEN_RATE_RUN["seed"])
    if not os.path.exists(path):
        raise SystemExit(f"{method} trains at GRPO's tokens, measured on {path}: run that first "
                         f"(tool_grid.py sweep --methods grpo {method} --rates 3e-4 --seeds 100 --steps 30 "
                         f"--phase-dir {TOKEN_RATE_RUN['phase']})")
    with open(path) as f:
        run = json.load(f)
    return run["generated_tokens"] / run["settings"]["steps"]


def method_steps(method: str, steps: int) -> int:
    """The steps ``method`` trains for in a grid of ``steps``-step GRPO runs: ``steps``, or for EQUAL_TOKEN_METHODS
    the number at which its tokens a step add up to GRPO's in ``steps`` (DATPO: 47 for 120)."""
    if method not in EQUAL_TOKEN_METHODS:
        return steps
    return max(1, round(steps * tokens_per_step("grpo") / tokens_per_step(method)))


def cpu_model() -> str:
    """The CPU's model name: CPU seconds compare only between runs on one kind (tool_summary.cost)."""
    return cpu_kind().get("model", "")


def _done(job: dict) -> bool:
    if not os.path.exists(job["path"]):
        return False
    with open(job["path"]) as f:
        return json.load(f).get("settings") == job["settings"]


def describe_run(done: dict) -> str:
    final = done["final"]
    return (f"greedy {final['greedy_accuracy']:.3f} T=1 {final['accuracy']:.3f} tokens {done['generated_tokens']} "
            f"train {done['train_cpu_seconds']:.0f} CPU s")


def load(phase: str) -> list[dict]:
    folder = os.path.join(RESULTS, phase)
    if not os.path.isdir(folder):
        return []
    runs = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                runs.append(json.load(f))
    return runs


def chosen_rates(sweep: list[dict]) -> dict:
    """Per method, the rate with the best mean final T=1 accuracy over the sweep seeds it ran at every one of its
    rates (ties: the lower rate); ``{method: {"rate", "means", "seeds"}}``."""
    by_method: dict = {}
    for run in sweep:
        by_method.setdefault(run["method"], {}).setdefault(run["learning_rate"], {})[run["seed"]] = \
            run["final"]["accuracy"]
    choices = {}
    for method, rates in by_method.items():
        seeds = set.intersection(*(set(s) for s in rates.values()))
        if not seeds:
            continue
        means = {rate: statistics.fmean(runs[s] for s in seeds) for rate, runs in rates.items()}
        best = max(sorted(means), key=lambda rate: means[rate])
        # the means unrounded: the report rounds once (0.4775390625 -> 0.478, not 0.4775 -> 0.477)
        choices[method] = dict(rate=best, means={f"{r:g}": m for r, m in sorted(means.items())},
                               seeds=sorted(seeds))
    return choices


def _model_path() -> str:
    from trl_credit.testbed.tool_regime import tool_regime_model_path

    return tool_regime_model_path()


def _seeds(text: str) -> list[int]:
    seeds = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    return seeds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=("base", "sweep", "report", "summary"))
    parser.add_argument("--methods", nargs="+", default=None)
    parser.add_argument("--rates", nargs="+", type=float, default=[3e-4, 1e-3])
    parser.add_argument("--seeds", type=str, default=None, help="e.g. 0-15 or 100-103,107")
    parser.add_argument("--steps", type=int, default=20,
                        help="GRPO's steps; EQUAL_TOKEN_METHODS (DATPO) train as many as match its tokens")
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--eval-rows", type=int, default=64)
    parser.add_argument("--eval-every", type=int, default=0, help="also evaluate every this many steps (a curve)")
    parser.add_argument("--phase-dir", default=None, help="another folder under benchmarks/results/tools (a pilot)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    from trl_credit.testbed.tool_runner import TOOL_METHODS

    methods = args.methods or [m for m in TOOL_METHODS if m != "rrpo"]
    settings = dict(steps=args.steps, eval_samples=args.eval_samples, eval_rows=args.eval_rows)
    if args.eval_every:
        settings["eval_every"] = args.eval_every

    if args.phase == "base":  # the untrained model, measured as every run's end is (the step-0 row of the tables)
        _setup_worker()
        from trl_credit.tasks import keychain
        from trl_credit.testbed.tool_runner import evaluate_tools

        report = evaluate_tools(_model_path(), keychain.make_dataset()["test"], samples=args.eval_samples,
                                sampled_rows=args.eval_rows)
        with open(os.path.join(RESULTS, "base_eval.json"), "w") as f:
            json.dump(dict(settings=settings, final=report), f)
        print({k: v for k, v in report.items() if not k.endswith(("correct", "per_row"))})
        return
    if args.phase == "summary":
        import tool_summary

        tool_summary.main(RESULTS, chosen_rates(load("sweep")))
        return
    settings_of = {m: dict(settings, steps=method_steps(m, args.steps)) for m in methods}  # a run's, per method
    if args.phase == "sweep":
        jobs = [dict(method=m, learning_rate=r, seed=s, settings=settings_of[m],
                     path=run_path(args.phase_dir or "sweep", m, r, s))
                for s in _seeds(args.seeds or "100-103") for m in methods for r in args.rates]
    else:
        rates = chosen_rates(load("sweep"))
        missing = [m for m in methods if m not in rates]
        if missing:
            raise SystemExit(f"no sweep for {missing}: run the sweep first")
        jobs = [dict(method=m, learning_rate=rates[m]["rate"], seed=s, settings=settings_of[m],
                     path=run_path("runs", m, rates[m]["rate"], s))
                for s in _seeds(args.seeds or "0-15") for m in methods]
    run_jobs([job for job in jobs if not _done(job)], args.workers, run=one_run, describe=describe_run)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
