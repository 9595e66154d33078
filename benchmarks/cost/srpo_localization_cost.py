"""Question: What does SRPO's scored localization cost in forward tokens and in step time against RRPO?

SRPO's scored localization, one prefix pass per chain: its forward tokens and SRPO's step time against RRPO's,
side by side in one run (issue 43).

SRPO (calibrated scored localization, the default) and RRPO (the same rollout, resets drawn uniformly: no
localization call) get the main job's settings (examples/train_srpo.py: SmolLM2-135M-Instruct + LoRA r=64 on all
linear layers, 2 prompts x 8 rollouts, 64 tokens, "lines" template, temperature 0.7 / top-p 0.95, loss grpo,
learning rate 5e-5, weight decay 0.01) and the same data and seed. Steps are interleaved, the order alternating,
and both steps of a pair start from the same sampling seed.

Every localization call of SRPO is also scored the way it was before (every candidate row whole, prompt included:
``srpo.localize._per_row_logps``) on the same rows, outside the timed step, so the run prints, from the same
calls: the forward tokens of both ways (``srpo/localization_forward_tokens_vs_grpo`` now and what the per-row pass
would log), their seconds, the largest score difference and whether every pick agrees.

    OMP_NUM_THREADS=1 python benchmarks/cost/srpo_localization_cost.py --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

import harness  # noqa: E402  (sets offline environment variables before torch/transformers)
import torch  # noqa: E402
from overhead import spread  # noqa: E402
from transformers import set_seed  # noqa: E402

import trl_credit.srpo.localize as localize  # noqa: E402
from trl_credit.models import default_model_path  # noqa: E402
from trl_credit.srpo.localization import pick_step  # noqa: E402
from trl_credit.srpo.step_metrics import StepStats  # noqa: E402
from trl_credit.tasks.data import make_arithmetic_dataset  # noqa: E402
from trl_credit.tasks.rewards import final_number_reward  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


class Comparison:
    """Wraps ``localize._shared_prefix_logps``: times it, then scores the same rows per row (untimed by the step)."""

    def __init__(self):
        self.shared = localize._shared_prefix_logps
        self.reset()

    def reset(self):
        self.shared_seconds = self.per_row_seconds = 0.0
        self.shared_tokens = self.per_row_tokens = 0
        self.max_diff, self.picks, self.same_picks = 0.0, 0, 0

    def __call__(self, ctx, prefixes, answers, stats):  # ctx: the generation batch's BatchContext
        start = time.perf_counter()
        before = stats.localization_forward_tokens
        scores = self.shared(ctx, prefixes, answers, stats)
        self.shared_seconds += time.perf_counter() - start
        self.shared_tokens += stats.localization_forward_tokens - before
        start = time.perf_counter()
        side = StepStats()
        rows = sum(len(a) for a in answers)
        per_row = localize._per_row_logps(ctx, prefixes, answers, side, rows, [0])
        self.per_row_seconds += time.perf_counter() - start
        self.per_row_tokens += side.localization_forward_tokens
        if scores is not None:
            for new, old in zip(scores, per_row):
                self.max_diff = max([self.max_diff] + [abs(a - b) for a, b in zip(new, old)])
                self.picks += 1
                self.same_picks += pick_step(new) == pick_step(old)
        return scores


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=4, help="timed (paired) steps")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=os.path.join(RESULTS, "srpo_localization_cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dataset = make_arithmetic_dataset(num_train=64, num_test=4, seed=0)["train"]
    settings = harness.common_settings(args.prompts, 64, args.warmup + args.steps, args.seed, 5e-5)
    out_dir = tempfile.mkdtemp(prefix="srpo_localization_cost_")
    runs = {}
    for method in ("srpo", "rrpo"):
        config = harness.method_config(method, os.path.join(out_dir, method), settings)
        trainer = harness.build_trainer(method, config, default_model_path(), dataset, [final_number_reward],
                                        peft_config=harness.lora_config())
        runs[method] = dict(trainer=trainer, batches=harness.prepare_manual_stepping(trainer), steps=[])
    comparison = Comparison()
    localize._shared_prefix_logps = comparison
    try:
        for step in range(args.warmup + args.steps):
            order = list(runs.items()) if step % 2 == 0 else list(runs.items())[::-1]
            for name, run in order:
                comparison.reset()
                set_seed(args.seed * 100_003 + step)
                seconds = harness.run_step(run["trainer"], run["batches"])
                metrics = harness.last_metrics(run["trainer"], prefix="srpo/")
                record = dict(seconds=seconds, metrics=metrics)
                if name == "srpo":
                    # the per-row comparison ran inside the step: not part of SRPO's step
                    record.update(seconds=seconds - comparison.per_row_seconds, seconds_with_comparison=seconds,
                                  shared_seconds=comparison.shared_seconds, per_row_seconds=comparison.per_row_seconds,
                                  shared_tokens=comparison.shared_tokens, per_row_tokens=comparison.per_row_tokens,
                                  max_score_diff=comparison.max_diff, picks=comparison.picks,
                                  same_picks=comparison.same_picks)
                    ratio = metrics.get("srpo/localization_forward_tokens_vs_grpo")
                    if ratio is not None and comparison.shared_tokens:
                        record["per_row_forward_tokens_vs_grpo"] = (
                            ratio * comparison.per_row_tokens / comparison.shared_tokens)
                if step >= args.warmup:
                    run["steps"].append(record)
                print(f"step {step} {name}: {record['seconds']:.1f} s"
                      + (f"  forward tokens {record['shared_tokens']} (per-row {record['per_row_tokens']}), "
                         f"vs_grpo {metrics.get('srpo/localization_forward_tokens_vs_grpo')}, scoring "
                         f"{record['shared_seconds']:.2f} s (per-row {record['per_row_seconds']:.2f} s), max diff "
                         f"{record['max_score_diff']:.2e}, picks {record['same_picks']}/{record['picks']}"
                         if name == "srpo" else "") + ("  (warm-up)" if step < args.warmup else ""), flush=True)
    finally:
        localize._shared_prefix_logps = comparison.shared
    srpo, rrpo = runs["srpo"]["steps"], runs["rrpo"]["steps"]
    vs_grpo = [s["metrics"]["srpo/localization_forward_tokens_vs_grpo"] for s in srpo
               if "srpo/localization_forward_tokens_vs_grpo" in s["metrics"]]
    result = dict(
        settings=dict(vars(args), model="SmolLM2-135M-Instruct + LoRA r=64", max_completion_length=64),
        srpo_seconds=[s["seconds"] for s in srpo], rrpo_seconds=[s["seconds"] for s in rrpo],
        step_time_ratios=spread([s["seconds"] / r["seconds"] for s, r in zip(srpo, rrpo)]),
        forward_tokens_vs_grpo=spread(vs_grpo),
        per_row_forward_tokens_vs_grpo=spread([s["per_row_forward_tokens_vs_grpo"] for s in srpo
                                               if "per_row_forward_tokens_vs_grpo" in s]),
        scoring_seconds=spread([s["shared_seconds"] for s in srpo]),
        per_row_scoring_seconds=spread([s["per_row_seconds"] for s in srpo]),
        max_score_diff=max((s["max_score_diff"] for s in srpo), default=float("nan")),
        picks=sum(s["picks"] for s in srpo), same_picks=sum(s["same_picks"] for s in srpo),
        steps=dict(srpo=srpo, rrpo=rrpo),
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)

    def show(s):
        return f"{s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}] (n={s['n']})"

    print(f"\nSRPO vs RRPO, {args.steps} paired steps (+{args.warmup} warm-up), {torch.get_num_threads()} thread(s); "
          "median [min, max] over steps")
    print(f"srpo/localization_forward_tokens_vs_grpo: {show(result['forward_tokens_vs_grpo'])}; "
          f"per-row pass on the same calls: {show(result['per_row_forward_tokens_vs_grpo'])}")
    print(f"scoring seconds per step: {show(result['scoring_seconds'])}; per-row: "
          f"{show(result['per_row_scoring_seconds'])}")
    print(f"max |score difference| {result['max_score_diff']:.2e}, same picks {result['same_picks']}/{result['picks']}")
    print(f"step time SRPO / RRPO: {show(result['step_time_ratios'])}"
          + (f", geometric mean {result['step_time_ratios']['geomean']:.3f} 95% CI "
             f"[{result['step_time_ratios']['ci95'][0]:.3f}, {result['step_time_ratios']['ci95'][1]:.3f}]"
             if "ci95" in result["step_time_ratios"] else ""))
    print(f"written {args.output}")


if __name__ == "__main__":
    main()
