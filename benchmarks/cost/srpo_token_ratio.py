"""Question: What does SRPO's generated-token ratio over GRPO depend on?

What SRPO's token ratio depends on: ``srpo/tokens_vs_grpo`` and ``srpo/paper_tokens_vs_grpo`` over seeds and reset
positions (self = SRPO, random = RRPO, oracle = the step checker's), docs/srpo.md#token-cost.

Both metrics divide by the tokens of a GRPO step of the same budget: ``num_generations`` iid rollouts of the step's
mean iid length (base rollouts and seed candidates), ``trl_credit/srpo/step_metrics.py``. The numerator of
``tokens_vs_grpo`` is everything SRPO generated (base + seed candidates + decoded localization + suffixes); the
paper's accounting (Appendix G) counts base + suffix tokens only. Every step's tokens therefore split into three
shares of the GRPO step, read off the logged metrics alone (``base/grpo = tokens_vs_grpo / tokens_vs_base``):

    base share   = tokens_vs_grpo / tokens_vs_base        (b/G when base rollouts are as long as seed candidates)
    suffix share = paper_tokens_vs_grpo - base share      (~ S/G x (1 - fallback) x (1 - kept share of the seed))
    seed share   = tokens_vs_grpo - paper_tokens_vs_grpo  (seed candidates + decoded localization: c/G)

Two parts, either or both:

``--logs DIR`` (repeatable) summarizes the per-step logs runs already wrote: the tiny testbed's grid
(``benchmarks/results/tiny/<method>_seed<k>.json``, ``logs``) and the learning grids
(``benchmarks/results/learning*/<method>_seed<k>.json``, ``reward_curve``): per method the mean and sd over seeds of
each seed's mean, the range over steps, the mean by step, the three shares, and Pearson correlations over steps
with what the ratio could depend on (reset position, resets at the question, seed rounds, fallback rate, the base
group's pass rate, thoughts per seed). Read-only: the directories are never written.

``--measure`` runs SRPO's rollout side by side for each seed and reset (same seed = same prompts and, in the first
batch, the same base rollouts and seeds, so the resets differ only in where they land), generation batches only
(no optimizer step: the ratio is a property of one rollout), on SmolLM2 with the main job's settings
(``--task arithmetic``: SmolLM2-135M-Instruct, 2 prompts x 8, 64 tokens, ``rollout_template="lines"``) or on the chain
task (``--task chain``: the warm-started ``smollm2-135m-chain`` with the chain step checker, so ``oracle`` too).

    python benchmarks/cost/srpo_token_ratio.py --logs benchmarks/results/learning_chain --logs benchmarks/results/learning \\
        --measure --seeds 0 1 2 --resets self random --batches 2 --output benchmarks/results/srpo_token_ratio.json

``--measured-json PATH`` summarizes the batches an earlier ``--measure`` run wrote instead of running again.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
METHODS = ("srpo", "rrpo", "srpo_oracle", "srpo_oppo")
RATIO, PAPER, BASE = "srpo/tokens_vs_grpo", "srpo/paper_tokens_vs_grpo", "srpo/tokens_vs_base"
# What the ratio could depend on (logged every step); "accuracy" is the base group's pass rate.
FACTORS = {
    "reset_position": "srpo/reset_position",
    "reset_at_question_rate": "srpo/reset_at_question_rate",
    "seed_rounds": "srpo/seed_rounds",
    "fallback_rate": "srpo/fallback_rate",
    "accuracy": "srpo/base_pass_rate",
    "thoughts_per_seed": "srpo/thoughts_per_seed",
}


# ---------------------------------------------------------------------------------------------------- statistics


def mean(values) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return sum(values) / len(values) if values else None


def sd(values) -> float | None:
    """Sample standard deviation (n - 1); None below two values."""
    values = [v for v in values if v is not None and v == v]
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def pearson(xs, ys) -> float | None:
    """Pearson's r over the pairs where both are known; None with fewer than 3 pairs or a constant side."""
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None and x == x and y == y]
    if len(pairs) < 3:
        return None
    mx, my = mean([p[0] for p in pairs]), mean([p[1] for p in pairs])
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx, syy = sum((x - mx) ** 2 for x, _ in pairs), sum((y - my) ** 2 for _, y in pairs)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def expected_candidates(pass_rate: float, rounds: int) -> float:
    """Seed candidates a prompt draws, one per round until one fails, at most ``rounds``: 1 + p + ... + p^(R-1) for a
    candidate pass rate p (a prompt's candidates iid; across prompts of different difficulty the mean is higher, the
    sum being convex in p)."""
    return sum(pass_rate ** k for k in range(rounds))


def modelled_shares(step: dict, split: dict) -> dict | None:
    """The shares a step should have if every rollout (base, candidate, seed) had the same length and a suffix
    replaced the seed's thoughts from h* on in proportion (docs/srpo.md#token-cost):

        seed   = c(p) / G                                   c(p): expected_candidates at the base pass rate p
        suffix = S / G x (1 - fallback_rate) x (1 - reset_position)

    ``split``: num_generations G, suffixes S (one reset group) and max_seed_rounds R of the runs."""
    p, fallback = step.get("srpo/base_pass_rate"), step.get("srpo/fallback_rate")
    if p is None or fallback is None:
        return None
    position = step.get("srpo/reset_position") or 0.0  # not logged when no prompt found a seed (fallback 1)
    g = split["num_generations"]
    return dict(seed=expected_candidates(p, split["max_seed_rounds"]) / g,
                suffix=split["suffixes"] / g * (1 - fallback) * (1 - position))


def shares(step: dict) -> dict | None:
    """The step's base, seed and suffix tokens as shares of its GRPO step (module docstring); None if not logged."""
    ratio, paper, base = step.get(RATIO), step.get(PAPER), step.get(BASE)
    if ratio is None or paper is None or not base:
        return None
    base_share = ratio / base
    return dict(base=base_share, suffix=paper - base_share, seed=ratio - paper)


# ------------------------------------------------------------------------------------------------ logged runs


def load_logged_runs(directory: str) -> dict[str, list[dict]]:
    """Per method: its runs in ``directory`` as dicts seed -> per-step metric dicts (SRPO-family methods only)."""
    runs: dict[str, list[dict]] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*_seed*.json"))):
        match = re.fullmatch(r"(.+)_seed(\d+)\.json", os.path.basename(path))
        if not match or match.group(1) not in METHODS:
            continue
        try:
            with open(path) as f:
                run = json.load(f)
        except (OSError, json.JSONDecodeError):  # a grid worker may be writing it right now
            continue
        steps = run.get("logs") or run.get("reward_curve") or []
        steps = [s for s in steps if RATIO in s]
        if steps:
            runs.setdefault(match.group(1), []).append(dict(seed=int(match.group(2)), steps=steps))
    return runs


def summarize_method(runs: list[dict], split: dict) -> dict:
    """Mean and sd over seeds, range over steps, by step, shares and correlations of one method's runs."""
    per_seed = {}
    for run in runs:
        steps = run["steps"]
        per_seed[run["seed"]] = {key: mean(s.get(key) for s in steps) for key in (RATIO, PAPER)}
    all_steps = [s for run in runs for s in run["steps"]]
    out = dict(seeds=sorted(per_seed), steps=len(all_steps))
    for name, key in (("tokens_vs_grpo", RATIO), ("paper_tokens_vs_grpo", PAPER)):
        seed_means = [per_seed[seed][key] for seed in sorted(per_seed)]
        values = [s[key] for s in all_steps if s.get(key) is not None]
        out[name] = dict(
            mean_over_seeds=mean(seed_means), sd_over_seeds=sd(seed_means),
            seed_means={str(seed): per_seed[seed][key] for seed in sorted(per_seed)},
            step_min=min(values), step_max=max(values), step_sd=sd(values),
            step_quartiles=quantiles(values, (0.25, 0.5, 0.75)),
        )
    longest = max(len(run["steps"]) for run in runs)
    out["by_step"] = [dict(step=i + 1,
                           tokens_vs_grpo=mean(run["steps"][i].get(RATIO) for run in runs if i < len(run["steps"])),
                           paper_tokens_vs_grpo=mean(run["steps"][i].get(PAPER)
                                                     for run in runs if i < len(run["steps"])))
                      for i in range(longest)]
    split_shares = [shares(s) for s in all_steps]
    out["shares"] = {part: mean(s[part] for s in split_shares if s) for part in ("base", "seed", "suffix")}
    out["factor_means"] = {name: mean(s.get(key) for s in all_steps) for name, key in FACTORS.items()}
    modelled = [modelled_shares(s, split) for s in all_steps]
    out["model"] = {part: dict(observed=mean(x[part] for x in split_ if x),
                               modelled=mean(m[part] for m in modelled if m),
                               r_over_steps=pearson([m[part] if m else None for m in modelled],
                                                    [x[part] if x else None for x in split_]))
                    for part, split_ in (("seed", split_shares), ("suffix", split_shares))}
    out["correlation_over_steps"] = {
        target: {name: pearson([s.get(key) for s in all_steps], ys) for name, key in FACTORS.items()}
        for target, ys in (("tokens_vs_grpo", [s.get(RATIO) for s in all_steps]),
                           ("paper_tokens_vs_grpo", [s.get(PAPER) for s in all_steps]),
                           ("seed_share", [x["seed"] if x else None for x in split_shares]),
                           ("suffix_share", [x["suffix"] if x else None for x in split_shares]))
    }
    return out


def quantiles(values, qs) -> list[float]:
    """Linear-interpolation quantiles (numpy's default)."""
    ordered = sorted(values)
    out = []
    for q in qs:
        position = q * (len(ordered) - 1)
        low = int(math.floor(position))
        high = min(low + 1, len(ordered) - 1)
        out.append(ordered[low] + (ordered[high] - ordered[low]) * (position - low))
    return out


def summarize_logs(directories: list[str], split: dict) -> dict:
    return {directory: {method: summarize_method(runs, split) for method, runs in load_logged_runs(directory).items()}
            for directory in directories}


# ----------------------------------------------------------------------------------------------- measurement


def measure(cli) -> list[dict]:
    """Generation batches of SRPO's rollout per seed and reset (module docstring); each batch's srpo/ metrics."""
    from harness import mechanisms as common
    import torch

    rows = []
    for seed in cli.seeds:
        for reset in cli.resets:
            args = argparse.Namespace(prompts=cli.prompts, generations=8, tokens=cli.tokens, temperature=0.7,
                                      steps=cli.batches, learning_rate=5e-5, digits=1, operands=2, seed=seed,
                                      task=cli.task, threads=cli.threads)
            start = time.perf_counter()
            trainer = common.build_trainer("srpo", args, own=dict(reset=reset))
            common.collect(trainer, cli.batches, train=False)
            metrics = getattr(trainer, "_metrics", {}).get("train", {})
            for batch in range(cli.batches):
                step = {key: float(values[batch]) for key, values in metrics.items()
                        if key.startswith("srpo/") and len(values) > batch}
                step.update(seed=seed, reset=reset, batch=batch + 1, shares=shares(step))
                rows.append(step)
                print(f"seed {seed} reset {reset:6s} batch {batch + 1}: tokens_vs_grpo {step.get(RATIO, float('nan')):.3f}"
                      f" paper {step.get(PAPER, float('nan')):.3f} reset_position "
                      f"{step.get('srpo/reset_position', float('nan')):.2f} seed_rounds "
                      f"{step.get('srpo/seed_rounds', float('nan')):.0f}", flush=True)
            print(f"  ({time.perf_counter() - start:.0f} s)", flush=True)
            del trainer
            torch.set_num_threads(cli.threads)
    return rows


def measured_summary(rows: list[dict], resets: list[str]) -> dict:
    """Per reset: mean, sd over seeds and range over batches; per seed, each reset's ratio minus SRPO's (paired)."""
    out = {}
    for reset in resets:
        mine = [r for r in rows if r["reset"] == reset]
        entry = {}
        for name, key in (("tokens_vs_grpo", RATIO), ("paper_tokens_vs_grpo", PAPER)):
            seed_means = [mean(r.get(key) for r in mine if r["seed"] == seed) for seed in sorted({r["seed"] for r in mine})]
            values = [r[key] for r in mine if r.get(key) is not None]
            entry[name] = dict(mean_over_seeds=mean(seed_means), sd_over_seeds=sd(seed_means),
                               batch_min=min(values) if values else None, batch_max=max(values) if values else None)
        entry["shares"] = {part: mean(r["shares"][part] for r in mine if r["shares"]) for part in ("base", "seed", "suffix")}
        entry["factor_means"] = {name: mean(r.get(key) for r in mine) for name, key in FACTORS.items()}
        if reset != resets[0]:
            # First batches only: one seed gives every reset the same prompts, base rollouts and seeds there, so the
            # difference is where the resets landed (later batches' sampling has diverged).
            first = {r["seed"]: r for r in rows if r["reset"] == resets[0] and r["batch"] == 1}
            pairs = [r.get(RATIO) - first[r["seed"]].get(RATIO) for r in mine
                     if r["batch"] == 1 and r["seed"] in first and r.get(RATIO) is not None
                     and first[r["seed"]].get(RATIO) is not None]
            entry[f"first_batch_minus_{resets[0]}"] = dict(values=pairs, mean=mean(pairs))
        out[reset] = entry
    return out


# ---------------------------------------------------------------------------------------------------- printing


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_logs(summary: dict) -> None:
    for directory, methods in summary.items():
        print(f"\n== {directory}")
        print("| method | seeds x steps | tokens_vs_grpo mean +- sd (seeds) | steps [min, max] | paper mean +- sd | "
              "steps [min, max] | shares base / seed / suffix |")
        print("|---" * 7 + "|")
        for method, s in methods.items():
            t, p, sh = s["tokens_vs_grpo"], s["paper_tokens_vs_grpo"], s["shares"]
            print(f"| {method} | {len(s['seeds'])} x {s['steps'] // max(len(s['seeds']), 1)} | "
                  f"{fmt(t['mean_over_seeds'])} +- {fmt(t['sd_over_seeds'])} | [{fmt(t['step_min'])}, {fmt(t['step_max'])}] | "
                  f"{fmt(p['mean_over_seeds'])} +- {fmt(p['sd_over_seeds'])} | [{fmt(p['step_min'])}, {fmt(p['step_max'])}] | "
                  f"{fmt(sh['base'])} / {fmt(sh['seed'])} / {fmt(sh['suffix'])} |")
        print("Pearson r over steps (tokens_vs_grpo; suffix share; seed share) with:")
        for method, s in methods.items():
            c = s["correlation_over_steps"]
            cells = ", ".join(f"{name} {fmt(c['tokens_vs_grpo'][name])}; {fmt(c['suffix_share'][name])}; "
                              f"{fmt(c['seed_share'][name])}" for name in FACTORS)
            print(f"  {method}: {cells}")
        print("Modelled shares (seed = c(p)/G, suffix = S/G (1 - fallback)(1 - reset_position)): observed vs "
              "modelled mean, r over steps")
        for method, s in methods.items():
            cells = ", ".join(f"{part} {fmt(v['observed'], 3)} vs {fmt(v['modelled'], 3)} (r {fmt(v['r_over_steps'])})"
                              for part, v in s["model"].items())
            print(f"  {method}: {cells}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--logs", action="append", default=[],
                        help="a folder of <method>_seed<k>.json runs to summarize (repeatable; read-only)")
    parser.add_argument("--measure", action="store_true", help="also run the side-by-side measurement")
    parser.add_argument("--measured-json", default=None,
                        help="summarize the batches of an earlier --measure run's JSON instead of running again")
    parser.add_argument("--task", choices=["arithmetic", "chain"], default="arithmetic",
                        help="arithmetic: the main job's SmolLM2-135M-Instruct; chain: smollm2-135m-chain + checker")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--resets", nargs="+", choices=["self", "random", "oracle"], default=["self", "random"])
    parser.add_argument("--batches", type=int, default=2, help="generation batches per seed and reset")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per batch (the main job: 2)")
    parser.add_argument("--tokens", type=int, default=64, help="max_completion_length (the main job: 64)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--num_generations", type=int, default=8,
                        help="the logged runs' split, for the modelled shares (all grids: 8 = 4 base + 1 x 4)")
    parser.add_argument("--suffixes", type=int, default=4, help="the logged runs' suffixes_per_reset")
    parser.add_argument("--max_seed_rounds", type=int, default=4, help="the logged runs' max_seed_rounds")
    parser.add_argument("--output", default=None, help="JSON path for everything (default: print only)")
    cli = parser.parse_args(argv)
    if "oracle" in cli.resets and cli.task != "chain":
        parser.error("--resets oracle needs the chain step checker: add --task chain")
    if not cli.logs and not cli.measure and not cli.measured_json:
        parser.error("nothing to do: give --logs DIR and/or --measure (or --measured-json)")
    if cli.measure and cli.measured_json:
        parser.error("--measure runs the measurement, --measured-json reuses one: give one of them")
    for directory in cli.logs:
        if not os.path.isdir(directory):
            parser.error(f"--logs {directory}: not a folder")
    payload = dict(settings=vars(cli))
    if cli.logs:
        split = dict(num_generations=cli.num_generations, suffixes=cli.suffixes, max_seed_rounds=cli.max_seed_rounds)
        payload["logs"] = summarize_logs(cli.logs, split)
        print_logs(payload["logs"])
    if cli.measure or cli.measured_json:
        if cli.measured_json:
            with open(cli.measured_json) as f:
                earlier = json.load(f)
            rows, resets = earlier["measured"]["batches"], earlier["settings"]["resets"]
            payload["settings"].update({key: earlier["settings"][key] for key in
                                        ("task", "seeds", "resets", "batches", "prompts", "tokens", "threads")})
        else:
            rows, resets = measure(cli), cli.resets
        payload["measured"] = dict(batches=rows, summary=measured_summary(rows, resets))
        for reset, s in payload["measured"]["summary"].items():
            t, p, sh = s["tokens_vs_grpo"], s["paper_tokens_vs_grpo"], s["shares"]
            print(f"measured {reset}: tokens_vs_grpo {fmt(t['mean_over_seeds'])} +- {fmt(t['sd_over_seeds'])} "
                  f"[{fmt(t['batch_min'])}, {fmt(t['batch_max'])}], paper {fmt(p['mean_over_seeds'])} +- "
                  f"{fmt(p['sd_over_seeds'])}; shares base/seed/suffix {fmt(sh['base'])}/{fmt(sh['seed'])}/"
                  f"{fmt(sh['suffix'])}; reset_position {fmt(s['factor_means']['reset_position'])}")
            for key, paired in s.items():
                if key.startswith("first_batch_minus_"):
                    print(f"  first batches, {reset} minus {key[len('first_batch_minus_'):]} (same seeds): "
                          f"{', '.join(fmt(v, 3) for v in paired['values'])} (mean {fmt(paired['mean'], 3)})")
    if cli.output:
        os.makedirs(os.path.dirname(os.path.abspath(cli.output)), exist_ok=True)
        with open(cli.output, "w") as f:
            json.dump(payload, f, indent=1)
        print(f"wrote {cli.output}")
    return payload


if __name__ == "__main__":
    main()
