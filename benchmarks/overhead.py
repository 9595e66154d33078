"""Cost of each method over GRPOTrainer: step time and generated tokens, measured side by side in one run.

For every method, a GRPOTrainer baseline gets the same model (offline SmolLM2-135M-Instruct + LoRA), data, seed
and shared settings (rollouts per prompt, temperature, loss type, lengths: harness.METHODS, i.e. the offline
settings of examples/train_<method>.py). Steps are interleaved (GRPO, method, GRPO, method, ...) so machine load
hits both alike; after warm-up steps the median step time, the median of the paired per-step ratios and the
generated tokens are reported, with a per-component profile (generation, no-grad log-prob passes, rewards, and the
method's own work: cue processing, OPPO oracle pass, DATPO tree/branches, SRPO seeds + localization + suffixes).

    python benchmarks/overhead.py                           # all methods; writes benchmarks/results/overhead.json
    python benchmarks/overhead.py --methods oppo,srpo --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (sets offline environment variables before torch/transformers)
import torch  # noqa: E402

from trl_credit.data import make_arithmetic_dataset  # noqa: E402
from trl_credit.models import default_model_path  # noqa: E402
from trl_credit.rewards import final_number_reward  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TARGETS = {  # from the issue: what each method should cost over GRPO
    "cue_grpo": ("step_time_ratio", 1.01),
    "oppo": ("step_time_ratio", 1.35),
    "srpo": ("token_ratio", 1.10),
    "datpo": ("branch_tokens_per_branch_over_rollout", 0.5),  # "well below 1 full rollout": read as <= half
}


def median(values):
    return statistics.median(values) if values else float("nan")


def measure(method: str, model_path: str, dataset, args, out_dir: str) -> dict:
    settings = harness.common_settings(args.prompts, args.tokens, args.warmup + args.steps, args.seed, 1e-6)
    runs = {}
    for name, grpo_like in (("grpo", method), (method, None)):
        config = harness.method_config(name if grpo_like is None else "grpo", os.path.join(out_dir, name),
                                       settings, grpo_like=grpo_like)
        trainer = harness.build_trainer("grpo" if grpo_like else method, config, model_path, dataset,
                                        [final_number_reward], peft_config=harness.lora_config())
        profiler = harness.Profiler()
        harness.instrument(trainer, "grpo" if grpo_like else method, profiler)
        runs[name] = dict(trainer=trainer, batches=harness.prepare_manual_stepping(trainer), profiler=profiler,
                          steps=[])
    for step in range(args.warmup + args.steps):
        for name, run in runs.items():  # interleaved
            run["profiler"].reset()
            seconds = harness.run_step(run["trainer"], run["batches"])
            record = dict(step_seconds=seconds, **run["profiler"].snapshot(),
                          metrics=harness.last_metrics(run["trainer"], prefix=method.split("_")[0] + "/"))
            if name == "srpo":
                trainer = run["trainer"]
                record["srpo_tokens"] = harness.srpo_token_breakdown(
                    run["profiler"].events, args.prompts, trainer.args.num_base_generations,
                    trainer.args.seed_candidates_per_round)
            if step >= args.warmup:
                run["steps"].append(record)
            print(f"[{method}] step {step} {name:<9} {seconds:6.2f} s  tokens {record['tokens'].get('generation', 0)}"
                  + ("  (warm-up)" if step < args.warmup else ""), flush=True)
    for run in runs.values():
        run["profiler"].unpatch()  # module-level wrappers (DATPO/SRPO) must not leak into the next method

    base, meth = runs["grpo"]["steps"], runs[method]["steps"]
    base_tokens = [s["tokens"].get("generation", 0) for s in base]
    meth_tokens = [s["tokens"].get("generation", 0) for s in meth]
    result = dict(
        settings={**harness.METHODS[method]["shared"], **harness.METHODS[method]["own"]},
        grpo_seconds=[s["step_seconds"] for s in base], method_seconds=[s["step_seconds"] for s in meth],
        grpo_median_seconds=median([s["step_seconds"] for s in base]),
        method_median_seconds=median([s["step_seconds"] for s in meth]),
        step_time_ratio=median([m["step_seconds"] / g["step_seconds"] for m, g in zip(meth, base)]),
        grpo_tokens=base_tokens, method_tokens=meth_tokens,
        token_ratio=sum(meth_tokens) / max(sum(base_tokens), 1),
        components={name: {key: median([s["seconds"].get(key, 0.0) for s in steps])
                           for key in sorted({k for s in steps for k in s["seconds"]})}
                    for name, steps in (("grpo", base), (method, meth))},
        method_metrics={k: median([s["metrics"][k] for s in meth if k in s["metrics"]])
                        for k in sorted({k for s in meth for k in s["metrics"]})},
    )
    result["ratio_of_medians"] = result["method_median_seconds"] / result["grpo_median_seconds"]
    rollouts = args.prompts * harness.METHODS[method]["shared"]["num_generations"]
    result["grpo_tokens_per_rollout"] = sum(base_tokens) / (rollouts * len(base))
    if method == "datpo":
        branch_tokens = [s["tokens"].get("datpo: branch generation", 0) for s in meth]
        leaves = [s["metrics"].get("datpo/leaves_per_prompt", 0.0) * args.prompts for s in meth]
        branches = [leaf - rollouts for leaf in leaves]
        result["datpo_branch_tokens"] = branch_tokens
        result["datpo_branches"] = branches
        result["branch_tokens_per_branch"] = sum(branch_tokens) / max(sum(branches), 1)
        result["generated_tokens_per_leaf"] = sum(meth_tokens) / max(sum(leaves), 1)
        result["branch_tokens_per_branch_over_rollout"] = (
            result["branch_tokens_per_branch"] / max(result["grpo_tokens_per_rollout"], 1e-9))
    if method == "srpo":
        keys = sorted({k for s in meth for k in s["srpo_tokens"]})
        result["srpo_tokens_per_step"] = {k: sum(s["srpo_tokens"].get(k, 0) for s in meth) / len(meth) for k in keys}
    for run in runs.values():
        del run["trainer"]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="cue_grpo,oppo,datpo,srpo")
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is steadier on a busy machine)")
    parser.add_argument("--output", default=os.path.join(RESULTS, "overhead.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for method in methods:
        if method not in harness.METHODS or method == "grpo":
            raise SystemExit(f"--methods: unknown method {method!r}; choose from {sorted(set(harness.METHODS) - {'grpo'})}")
    model_path = default_model_path()
    dataset = make_arithmetic_dataset(num_train=64, num_test=4, seed=0)["train"]
    out_dir = tempfile.mkdtemp(prefix="overhead_")
    results = dict(settings=dict(vars(args), model="SmolLM2-135M-Instruct + LoRA r=64", reward="final_number",
                                 device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                                 threads=torch.get_num_threads()), methods={})
    if os.path.exists(args.output):  # keep other methods' results when re-running a subset
        with open(args.output) as f:
            results["methods"] = {m: r for m, r in json.load(f).get("methods", {}).items() if m not in methods}
    for method in methods:
        results["methods"][method] = measure(method, model_path, dataset, args, out_dir)
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)

    print(f"\nSmolLM2-135M-Instruct + LoRA, {args.prompts} prompts x {args.tokens} tokens, {args.steps} timed steps "
          f"(+{args.warmup} warm-up), {results['settings']['device']}, {results['settings']['threads']} thread(s)")
    print(f"{'method':<9} {'G':>2} {'GRPO s':>7} {'meth s':>7} {'time x':>7} {'tokens x':>8}  target")
    for method, r in results["methods"].items():
        key, limit = TARGETS[method]
        value = r.get(key, float("nan"))
        print(f"{method:<9} {r['settings']['num_generations']:>2} {r['grpo_median_seconds']:7.2f} "
              f"{r['method_median_seconds']:7.2f} {r['step_time_ratio']:7.3f} {r['token_ratio']:8.3f}  "
              f"{key} {value:.3f} <= {limit} {'met' if value <= limit else 'NOT met'}")
        for name, parts in r["components"].items():
            print(f"    {name:<9} " + ", ".join(f"{k} {v:.2f}s" for k, v in parts.items()))
        if method == "srpo":
            print("    srpo tokens/step: " + ", ".join(f"{k} {v:.0f}" for k, v in r["srpo_tokens_per_step"].items()))
        if method == "datpo":
            print(f"    datpo: {r['branch_tokens_per_branch']:.1f} tokens per branch vs {r['grpo_tokens_per_rollout']:.1f}"
                  f" per GRPO rollout; {r['generated_tokens_per_leaf']:.1f} generated tokens per leaf")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
