"""Question: What does each method cost over GRPO: step time, generated tokens, extra scoring rows?

Cost of each method over GRPOTrainer: step time and generated tokens, measured side by side in one run.

For every method, a GRPOTrainer baseline gets the same model (offline SmolLM2-135M-Instruct + LoRA), data, seed
and shared settings (rollouts per prompt, temperature, loss type, lengths: harness.METHODS, i.e. the offline
settings of examples/train_<method>.py). Steps are interleaved (GRPO, method, GRPO, method, ...) so machine load
hits both alike, and both steps of a pair start from the same sampling seed (so they sample the same base rollouts
while the policies are still nearly the same); after warm-up steps the median step time, the median of the paired
per-step ratios and the generated tokens are reported, with a per-component profile (generation, no-grad log-prob
passes, rewards, and the method's own work: cue processing, OPPO oracle pass, DATPO tree/branches, SRPO seeds +
localization + suffixes).

    python benchmarks/cost/overhead.py                           # all methods; writes benchmarks/results/overhead.json
    python benchmarks/cost/overhead.py --methods oppo,srpo --steps 8

Every ratio is given as the median and range of >= 5 paired steps (2 prompts per step by default).

``--model tiny`` measures the same pairs on the tiny testbed (docs/testbed.md#the-tiny-testbed: the committed build
``benchmarks/results/tiny/model``, full fine-tuning, the sums task and rewards, each method with the grid's settings
from ``trl_credit.testbed.runner``, 8 prompts per step, GRPO with G = 8): a model so small that what a method costs
per fork, per generation call and per Python loop shows, where on SmolLM2 the model's own compute hides it.

    python benchmarks/cost/overhead.py --model tiny --methods datpo,cue_grpo,oppo,srpo,rrpo --steps 6

For DATPO both models report its step time per leaf over GRPO's per rollout (``step_time_per_leaf_over_rollout``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

import harness  # noqa: E402  (sets offline environment variables before torch/transformers)
import torch  # noqa: E402
from transformers import set_seed  # noqa: E402

from trl_credit.models import default_model_path  # noqa: E402
from trl_credit.tasks.data import make_arithmetic_dataset  # noqa: E402
from trl_credit.tasks.rewards import final_number_reward  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
# What each method should cost over GRPO (issue 12; the papers: Cue-GRPO 1.06x, OPPO 1.35x step time, SRPO 1.08x and
# RRPO 1.23x tokens, DATPO's tree shares prefixes): (result key, limit).
TARGETS = {
    "cue_grpo": ("step_time_ratio", 1.01),
    "oppo": ("step_time_ratio", 1.25),
    "srpo": ("token_ratio", 1.08),
    "rrpo": ("token_ratio", 1.08),
    "srpo_base": ("token_ratio", 1.08),
    "datpo": ("tokens_per_leaf_over_rollout", 0.6),
}
# DATPO's saving needs long answers (a fork then leaves a long shared prefix): its run uses a step-by-step
# instruction on 2-digit, 3-operand problems and a longer token budget (--datpo-tokens).
LONG_ANSWER_INSTRUCTION = (
    "Compute {question} step by step. Explain each step in a full sentence, then put the final answer in \\boxed{{}}."
)


def median(values):
    return statistics.median(values) if values else float("nan")


# two-sided 95% Student t quantiles by degrees of freedom (scipy is not a dependency)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
       25: 2.060, 30: 2.042}


def spread(values) -> dict:
    """Median and range of per-step values: what a ratio from a handful of paired steps can claim; for positive
    values (ratios) also their geometric mean with a 95% t-interval over steps (``geomean``, ``ci95``)."""
    values = [v for v in values if v == v]
    if not values:
        return dict(median=float("nan"), min=float("nan"), max=float("nan"), n=0)
    result = dict(median=statistics.median(values), min=min(values), max=max(values), n=len(values))
    if len(values) >= 2 and min(values) > 0:
        logs = [math.log(v) for v in values]
        mean, sd = statistics.mean(logs), statistics.stdev(logs)
        t = T95[max(k for k in T95 if k <= len(values) - 1)]  # between table rows: the fewer df (wider)
        half = t * sd / math.sqrt(len(values))
        result.update(geomean=math.exp(mean), ci95=[math.exp(mean - half), math.exp(mean + half)])
    return result


def smollm2_trainers(method: str, model_path: str, datasets: dict, args, out_dir: str, steps: int):
    """(name, trainer) of the GRPO baseline and the method on SmolLM2 + LoRA, with the examples' settings."""
    tokens = args.datpo_tokens if method == "datpo" else (args.tokens or harness.METHODS[method]["tokens"])
    dataset = datasets["long" if method == "datpo" else "short"]
    settings = harness.common_settings(args.prompts, tokens, args.warmup + steps, args.seed, 1e-6)
    baseline_dataset = dataset
    if method in ("srpo", "rrpo", "srpo_base"):
        # SRPO rolls out from its thought template ("lines" here): its GRPO baseline gets the same wrapped prompts,
        # so the token ratio measures the method, not what the template does to the answers' length.
        from trl_credit.srpo.prompts import resolve_rollout_template, wrap_prompt

        template = resolve_rollout_template(harness.METHODS[method]["own"]["rollout_template"])
        baseline_dataset = dataset.map(lambda row: {"prompt": wrap_prompt(row["prompt"], template)})
    for name, grpo_like in (("grpo", method), (method, None)):
        config = harness.method_config(name if grpo_like is None else "grpo", os.path.join(out_dir, name),
                                       settings, grpo_like=grpo_like)
        for key, value in ({} if grpo_like else args.method_fields).items():
            setattr(config, key, value)
        yield name, harness.build_trainer("grpo" if grpo_like else method, config, model_path,
                                          baseline_dataset if grpo_like else dataset,
                                          [final_number_reward], peft_config=harness.lora_config())


TINY_MODEL = os.path.join(RESULTS, "tiny", "model")


def tiny_trainers(method: str, model_path: str, datasets: dict, args, out_dir: str, steps: int):
    """(name, trainer) of the GRPO baseline and the method on the tiny testbed, each with the grid's settings
    (``trl_credit.testbed.runner``: SHARED, then the method's own fields) and full fine-tuning, as ``runner.run``
    builds them, at the pairs' learning rate (1e-6: the two policies stay the same)."""
    from transformers import LlamaForCausalLM

    from trl_credit.tasks import sums
    from trl_credit.testbed import runner
    from trl_credit.testbed.model import make_tokenizer

    for name in ("grpo", method):
        spec = runner.method_spec(name)
        settings = dict(runner.SHARED, output_dir=os.path.join(out_dir, name), learning_rate=1e-6,
                        max_steps=args.warmup + steps, logging_steps=1, save_strategy="no", report_to="none",
                        seed=args.seed, use_cpu=True, disable_tqdm=True)
        settings.update(spec["fields"])
        if name == method:
            settings.update(args.method_fields)
        settings["per_device_train_batch_size"] = args.prompts * settings["num_generations"]
        model = LlamaForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        yield name, spec["trainer"](model=model, reward_funcs=[sums.accuracy_reward, sums.format_reward],
                                    args=spec["config"](**settings), train_dataset=datasets["tiny"],
                                    processing_class=make_tokenizer(), **spec["kwargs"])


def measure(method: str, model_path: str, datasets: dict, args, out_dir: str) -> dict:
    steps = args.method_steps.get(method, args.steps)
    build = tiny_trainers if args.model == "tiny" else smollm2_trainers
    runs = {}
    for name, trainer in build(method, model_path, datasets, args, out_dir, steps):
        profiler = harness.Profiler()
        harness.instrument(trainer, name, profiler)
        runs[name] = dict(trainer=trainer, batches=harness.prepare_manual_stepping(trainer), profiler=profiler,
                          steps=[])
    prefix = {"cue_grpo": "cue/", "rrpo": "srpo/", "srpo_base": "srpo/"}.get(method, method + "/")
    for step in range(args.warmup + steps):
        # interleaved, the method first on odd steps: whatever running second costs (or saves) hits both alike
        order = list(runs.items()) if step % 2 == 0 else list(runs.items())[::-1]
        for name, run in order:
            run["profiler"].reset()
            # the same sampling seed for both steps of a pair: while the two policies are still (nearly) the same
            # (learning rate 1e-6), GRPO and the method sample the same base rollouts, so a ratio measures the
            # method rather than two different draws of completion lengths
            set_seed(args.seed * 100_003 + step)
            cpu_start = time.process_time()
            seconds = harness.run_step(run["trainer"], run["batches"])
            # this process's CPU seconds (all its threads): unlike wall time, not stretched by other processes
            record = dict(step_seconds=seconds, step_cpu_seconds=time.process_time() - cpu_start,
                          **run["profiler"].snapshot(),
                          metrics=harness.last_metrics(run["trainer"], prefix=prefix))
            if step >= args.warmup:
                run["steps"].append(record)
            print(f"[{method}] step {step} {name:<9} {seconds:6.2f} s  tokens {record['tokens'].get('generation', 0)}"
                  + ("  (warm-up)" if step < args.warmup else ""), flush=True)
    for run in runs.values():
        run["profiler"].unpatch()  # module-level wrappers (DATPO/SRPO) must not leak into the next method

    base, meth = runs["grpo"]["steps"], runs[method]["steps"]
    base_tokens = [s["tokens"].get("generation", 0) for s in base]
    meth_tokens = [s["tokens"].get("generation", 0) for s in meth]
    no_grad_rows = "logprob_passes (no grad)"
    method_args = runs[method]["trainer"].args
    result = dict(
        settings={**({} if args.model == "tiny" else {**harness.METHODS[method]["shared"],
                                                      **harness.METHODS[method]["own"]}),
                  **args.method_fields,
                  **dict(num_generations=method_args.num_generations, temperature=method_args.temperature,
                         max_completion_length=method_args.max_completion_length, loss_type=method_args.loss_type,
                         grpo_num_generations=runs["grpo"]["trainer"].args.num_generations)},
        grpo_seconds=[s["step_seconds"] for s in base], method_seconds=[s["step_seconds"] for s in meth],
        grpo_median_seconds=median([s["step_seconds"] for s in base]),
        method_median_seconds=median([s["step_seconds"] for s in meth]),
        step_time_ratios=spread([m["step_seconds"] / g["step_seconds"] for m, g in zip(meth, base)]),
        cpu_time_ratios=spread([m["step_cpu_seconds"] / g["step_cpu_seconds"] for m, g in zip(meth, base)]),
        grpo_tokens=base_tokens, method_tokens=meth_tokens,
        token_ratios=spread([m / g for m, g in zip(meth_tokens, base_tokens) if g]),
        token_ratio=sum(meth_tokens) / max(sum(base_tokens), 1),
        # rows scored by no-grad passes per step (GRPO with beta 0 and one iteration scores none; OPPO's floor is B)
        grpo_no_grad_rows=spread([s["rows"].get(no_grad_rows, 0) for s in base]),
        method_no_grad_rows=spread([s["rows"].get(no_grad_rows, 0) for s in meth]),
        rows_per_step=args.prompts * runs["grpo"]["trainer"].args.num_generations,  # GRPO's rollouts per step
        components={name: {key: median([s["seconds"].get(key, 0.0) for s in steps])
                           for key in sorted({k for s in steps for k in s["seconds"]})}
                    for name, steps in (("grpo", base), (method, meth))},
        method_metrics={k: spread([s["metrics"][k] for s in meth if k in s["metrics"]])
                        for k in sorted({k for s in meth for k in s["metrics"]})},
    )
    result["step_time_ratio"] = result["step_time_ratios"]["median"]
    result["ratio_of_medians"] = result["method_median_seconds"] / result["grpo_median_seconds"]
    rollouts = result["rows_per_step"]
    result["grpo_tokens_per_rollout"] = sum(base_tokens) / (rollouts * len(base))
    result["grpo_generation_seconds_per_rollout"] = (
        median([s["seconds"].get("generation", 0.0) for s in base]) / rollouts)
    if method == "datpo":
        leaves = [s["metrics"].get("datpo/leaves_per_prompt", 0.0) * args.prompts for s in meth]
        tree_seconds = [s["seconds"].get("datpo: tree (forks + branches + scoring)", float("nan")) for s in meth]
        result["datpo_leaves"] = leaves
        # the whole step (generation, tree, credit, loss) per leaf over GRPO's step per rollout, pair by pair
        result["step_time_per_leaf_over_rollout"] = spread(
            [m["step_seconds"] / max(leaf, 1) / (g["step_seconds"] / rollouts)
             for m, g, leaf in zip(meth, base, leaves)])
        # the same less the sibling-diversity embedder's seconds (a sentence-transformers model the size of which
        # does not follow the policy's: on the tiny testbed it is 100x the policy)
        embedder = "datpo: sibling diversity (embedder)"
        result["step_time_per_leaf_over_rollout_without_embedder"] = spread(
            [(m["step_seconds"] - m["seconds"].get(embedder, 0.0)) / max(leaf, 1) / (g["step_seconds"] / rollouts)
             for m, g, leaf in zip(meth, base, leaves)])
        result["cpu_time_per_leaf_over_rollout"] = spread(
            [m["step_cpu_seconds"] / max(leaf, 1) / (g["step_cpu_seconds"] / rollouts)
             for m, g, leaf in zip(meth, base, leaves)])
        result["generated_tokens_per_leaf"] = sum(meth_tokens) / max(sum(leaves), 1)
        result["tokens_per_leaf_over_rollout"] = (
            result["generated_tokens_per_leaf"] / max(result["grpo_tokens_per_rollout"], 1e-9))
        # "generation" times every _generate_single_turn call, the branch calls included; the base rollouts' share is
        # the rest
        base_generation = [s["seconds"].get("generation", 0.0) - s["seconds"].get("datpo: branch generation", 0.0)
                           for s in meth]
        # seconds spent on the whole tree (base rollouts + forks + branches + their scoring) per leaf, over GRPO's
        # generation seconds per rollout
        result["tree_seconds_per_leaf_over_rollout"] = spread(
            [(g + t) / max(leaf, 1) / max(result["grpo_generation_seconds_per_rollout"], 1e-9)
             for g, t, leaf in zip(base_generation, tree_seconds, leaves)])
    for run in runs.values():
        del run["trainer"]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--methods", default="cue_grpo,oppo,srpo,rrpo,datpo,srpo_base",
                        help="srpo_base: SRPO with seed_source='base' (seeds from the failed base rollouts)")
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2",
                        help="smollm2: SmolLM2-135M-Instruct + LoRA, the examples' settings; tiny: the tiny testbed "
                             "(committed build, full fine-tuning, the grid's settings)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (default: 2; tiny: 8)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="max completion tokens of every method but DATPO (default: each example's own, "
                             "48; SRPO/RRPO 64); the GRPO baseline gets the same")
    parser.add_argument("--datpo-tokens", type=int, default=192,
                        help="DATPO's completion budget (long step-by-step answers; its GRPO baseline gets the same)")
    parser.add_argument("--steps", type=int, default=5, help="timed (paired) steps per trainer")
    parser.add_argument("--method-steps", default="",
                        help="timed steps for some methods instead of --steps, e.g. cue_grpo=15,oppo=15 (cheap pairs "
                             "whose ratio is close to 1 need more pairs to resolve a few percent)")
    parser.add_argument("--method-fields", default="",
                        help="config fields of the method (not of its GRPO baseline) over its settings, as JSON "
                             "values, e.g. use_diversity=false,rows_per_forward=256: what a setting costs")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is steadier on a busy machine)")
    parser.add_argument("--output", default=None,
                        help="default: benchmarks/results/overhead.json (tiny: overhead_tiny.json)")
    parser.add_argument("--mmap-threshold", type=int, default=65536,
                        help="glibc mmap threshold in bytes (harness.fix_mmap_threshold: bounds the memory of DATPO's "
                             "long trees, slows decoding of both trainers of a pair alike); 0: glibc's default")
    args = parser.parse_args()
    tiny = args.model == "tiny"
    if args.prompts is None:
        args.prompts = 8 if tiny else 2
    if args.prompts < 1:
        raise SystemExit(f"--prompts: at least 1, got {args.prompts}")
    args.output = args.output or os.path.join(RESULTS, "overhead_tiny.json" if tiny else "overhead.json")
    try:
        args.method_steps = {k.strip(): int(v) for k, v in
                             (item.split("=") for item in args.method_steps.split(",") if item.strip())}
    except ValueError:
        raise SystemExit(f"--method-steps: expected method=steps[,method=steps], got {args.method_steps!r}")
    fields = {}
    for item in (i for i in args.method_fields.split(",") if i.strip()):
        key, sep, value = item.partition("=")
        try:
            fields[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            raise SystemExit(f"--method-fields: expected field=<JSON value>[,...], got {item!r}")
        if not sep or not key.strip():
            raise SystemExit(f"--method-fields: expected field=<JSON value>[,...], got {item!r}")
    args.method_fields = fields
    measurable = ["cue_grpo", "datpo", "oppo", "rrpo", "srpo"] if tiny else sorted(set(harness.METHODS) - {"grpo"})
    if set(args.method_steps) - set(measurable) or any(n < 1 for n in args.method_steps.values()):
        raise SystemExit(f"--method-steps: methods from {measurable} and steps >= 1, got {args.method_steps}")
    if args.mmap_threshold:
        harness.fix_mmap_threshold(args.mmap_threshold)
    torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for method in methods:
        if method not in measurable:
            raise SystemExit(f"--methods: unknown method {method!r}; choose from {measurable}")
    if tiny:
        from trl_credit.tasks import sums

        model_path, datasets = TINY_MODEL, dict(tiny=sums.make_dataset()["train"])
        model_name, reward = "tiny testbed (committed build, full fine-tuning)", "sums accuracy + format"
    else:
        model_path = default_model_path()
        datasets = dict(
            short=make_arithmetic_dataset(num_train=64, num_test=4, seed=0)["train"],
            long=make_arithmetic_dataset(num_train=64, num_test=4, seed=0, digits=2, num_operands=3, operators="+-",
                                         instruction=LONG_ANSWER_INSTRUCTION)["train"],
        )
        model_name, reward = "SmolLM2-135M-Instruct + LoRA r=64", "final_number"
    out_dir = tempfile.mkdtemp(prefix="overhead_")
    results = dict(settings=dict(vars(args), model=model_name, reward=reward,
                                 device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                                 threads=torch.get_num_threads()), methods={})
    if os.path.exists(args.output):  # keep other methods' results when re-running a subset
        with open(args.output) as f:
            results["methods"] = {m: r for m, r in json.load(f).get("methods", {}).items() if m not in methods}
    for method in methods:
        results["methods"][method] = measure(method, model_path, datasets, args, out_dir)
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)
    print_summary(results, args.output)


def print_summary(results: dict, output: str) -> None:
    settings = results["settings"]
    print(f"\n{settings['model']}, {settings['prompts']} prompts per step, {settings['steps']} paired steps "
          f"(+{settings['warmup']} warm-up), {settings['device']}, {settings['threads']} thread(s); "
          "ratios: median [min, max] over paired steps")
    for method, r in results["methods"].items():
        key, limit = TARGETS[method]
        value = r.get(key, float("nan"))
        times, toks = r["step_time_ratios"], r["token_ratios"]
        print(f"{method:<9} G={r['settings']['num_generations']} (GRPO {r['settings'].get('grpo_num_generations')}) "
              f"T={r['settings']['max_completion_length']}  "
              f"step time x {times['median']:.3f} [{times['min']:.3f}, {times['max']:.3f}] over {times['n']} pairs"
              + (f" (geometric mean {times['geomean']:.3f}, 95% CI [{times['ci95'][0]:.3f}, {times['ci95'][1]:.3f}])"
                 if "ci95" in times else "") + "  "
              + (f"CPU time x {r['cpu_time_ratios']['median']:.3f} [{r['cpu_time_ratios']['min']:.3f}, "
                 f"{r['cpu_time_ratios']['max']:.3f}]  " if "cpu_time_ratios" in r else "")
              + f"tokens x {r['token_ratio']:.3f} (per step {toks['median']:.3f} [{toks['min']:.3f}, {toks['max']:.3f}])  "
              f"no-grad rows/step {r['method_no_grad_rows']['median']:.0f} vs GRPO {r['grpo_no_grad_rows']['median']:.0f}"
              f" ({r['rows_per_step']} rollouts)  target {key} <= {limit}: {value:.3f} "
              f"{'met' if value <= limit else 'NOT met'}")
        for name, parts in r["components"].items():
            print(f"    {name:<9} " + ", ".join(f"{k} {v:.2f}s" for k, v in parts.items()))
        shown = {k: v for k, v in r["method_metrics"].items() if "tokens" in k or "rate" in k or "leaves" in k}
        if shown:
            print("    metrics: " + ", ".join(f"{k} {v['median']:.3f}" for k, v in shown.items()))
        if method == "datpo":
            print(f"    datpo: {r['generated_tokens_per_leaf']:.1f} generated tokens per leaf vs "
                  f"{r['grpo_tokens_per_rollout']:.1f} per GRPO rollout; tree generation time per leaf / GRPO's per "
                  f"rollout {r['tree_seconds_per_leaf_over_rollout']['median']:.3f} (target <= 0.5: "
                  f"{'met' if r['tree_seconds_per_leaf_over_rollout']['median'] <= 0.5 else 'NOT met'})")
            for key in ("step_time_per_leaf_over_rollout", "cpu_time_per_leaf_over_rollout",
                        "step_time_per_leaf_over_rollout_without_embedder"):
                if key in r:
                    v = r[key]
                    print(f"    {key} {v['median']:.3f} [{v['min']:.3f}, {v['max']:.3f}] over {v['n']} pairs"
                          + (f" (geometric mean {v['geomean']:.3f}, 95% CI [{v['ci95'][0]:.3f}, {v['ci95'][1]:.3f}])"
                             if "ci95" in v else "") + f"  target <= 1: {'met' if v['median'] <= 1 else 'NOT met'}")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
