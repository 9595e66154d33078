"""Question: Does a claim "A beats B" survive when A and B train at the same learning rate?

The grid trains each method at its own sweep-chosen rate (``tiny_grid.py``), so a compared pair may differ in rate as
well as in method. For each pair given, this picks **one common rate**: the swept rate with the best mean of the
two methods' sweep AUCs (``--select-by``, over the ``--sweep-seeds``: at least 4), and trains whichever of the two did
not already run the grid at that rate, on the grid's seeds and settings, into ``<results-dir>/same_rate/``
(``<method>_lr<rate>_seed<k>.json``; a run whose JSON exists with the same settings is skipped). The report
(``regime_claims.same_rate_table``, via ``tiny_report.py``) pairs A and B at that rate, seed by seed.

    python benchmarks/tiny/same_rate.py --regime trap --pairs srpo:rrpo,srpo:grpo --sweep-seeds 100-103 \\
        --learning-rates 1.5e-4,3e-4,6e-4,1e-3,3e-3 --select-by greedy_auc --steps 20 --eval-every 10 \\
        --passk-problems 64 [--dry-run]

Runs go one at a time (one worker of one thread) unless ``--workers`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def common_rate(choices: dict, a: str, b: str, min_runs: int) -> float | None:
    """The rate with the best mean of the two methods' mean sweep AUCs, among the rates both swept on at least
    ``min_runs`` seeds (``choices``: tiny_report.sweep_choices); None when there is none."""
    if a not in choices or b not in choices:
        return None
    rates = [r for r in choices[a]["sweep_auc"] if r in choices[b]["sweep_auc"]
             and min(choices[a]["sweep_runs"][r], choices[b]["sweep_runs"][r]) >= min_runs]
    if not rates:
        return None
    best = max(rates, key=lambda r: (choices[a]["sweep_auc"][r] + choices[b]["sweep_auc"][r]) / 2)
    return float(best)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--regime", default="trap")
    parser.add_argument("--pairs", required=True, help="comma-separated A:B method pairs, e.g. srpo:rrpo,srpo:grpo")
    parser.add_argument("--seeds", default="0-15")
    parser.add_argument("--sweep-seeds", default="100-103", help="the sweep seeds the common rate is chosen on")
    parser.add_argument("--learning-rates", default="1.5e-4,3e-4,6e-4,1e-3,3e-3")
    parser.add_argument("--select-by", choices=("auc", "greedy_auc"), default="greedy_auc")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--passk-samples", type=int, default=64)
    parser.add_argument("--passk-problems", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--dry-run", action="store_true", help="print the common rates and the runs, run nothing")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    sys.path.insert(0, HERE)
    import tiny_grid
    import tiny_report

    results_dir = os.path.join(tiny_grid.RESULTS_ROOT, args.regime)
    sweep_seeds = tiny_grid._seeds(args.sweep_seeds)
    rates = [float(r) for r in args.learning_rates.split(",")]
    choices = tiny_report.sweep_choices(os.path.join(results_dir, "sweep"), rates, args.select_by, seeds=sweep_seeds)
    grid = tiny_report.load_runs(results_dir)
    wanted: dict[tuple[str, float], list[str]] = {}
    for pair in args.pairs.split(","):
        a, b = pair.split(":")
        rate = common_rate(choices, a, b, len(sweep_seeds))
        if rate is None:
            print(f"{a} vs {b}: no rate swept on {len(sweep_seeds)} seeds by both; skipped", flush=True)
            continue
        at_grid = {m: next(iter(grid[m].values()))["learning_rate"] if m in grid else None for m in (a, b)}
        print(f"{a} vs {b}: common rate {rate:g} (grid: {a} {at_grid[a]}, {b} {at_grid[b]})", flush=True)
        for method in (a, b):
            if at_grid[method] != rate:
                wanted.setdefault((method, rate), []).append(pair)
    if args.dry_run or not wanted:
        print("runs:", {f"{m} lr {r:g}": pairs for (m, r), pairs in wanted.items()})
        return
    tiny_grid._setup_worker()
    with open(os.path.join(results_dir, "model", "build.json")) as f:
        args.model_digest = json.load(f)["weights_sha256"]
    model_path = tiny_grid.committed_model(results_dir, args.regime)
    if model_path is None:
        raise SystemExit(f"no committed {args.regime} model in {results_dir}/model: run tiny_grid.py first")
    base = tiny_grid.base_report("test", args, model_path, os.path.join(results_dir, "base.json"))
    out = os.path.join(results_dir, "same_rate")
    os.makedirs(out, exist_ok=True)
    common = dict(steps=args.steps, eval_every=args.eval_every, eval_samples=args.eval_samples,
                  model_digest=args.model_digest, model_path=model_path, passk_samples=args.passk_samples,
                  passk_problems=args.passk_problems)
    jobs = [dict(common, method=m, learning_rate=r, seed=s, split="test", base=base,
                 path=os.path.join(out, f"{m}_lr{r:g}_seed{s}.json"))
            for (m, r) in wanted for s in tiny_grid._seeds(args.seeds)]
    tiny_grid.run_jobs([j for j in jobs if not tiny_grid._done(j, args)], args.workers)


if __name__ == "__main__":
    main()
