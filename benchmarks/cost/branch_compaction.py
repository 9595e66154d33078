"""Question: Does row compaction make DATPO's branch calls cheaper per kept token?

DATPO-like branch calls with and without row compaction (``hf_generate_hooks(compact_rows=...)``), side by side.

HF ``generate`` computes every row of a batch at every step until the call's longest row ends; with
``compact_rows=True`` the call continues with the running rows alone once fewer than half are running. This script
builds branch calls as DATPO's long-answer benchmark does (SmolLM2-135M-Instruct, the step-by-step instruction of
``overhead.py``, 192 tokens): one sampled rollout per prompt, forks at 1/4, 1/2 and 3/4 of it, B̂ = 4 branches per
fork with the remaining budget (192 − prefix), 4 forks per call, calls sorted by budget. Then, for each of
``--pairs`` pairs (the order alternates, both modes start from the same seed), it times every call in both modes
and counts the rows the model computed at each decode step ("row-steps") against the tokens kept.

    python benchmarks/cost/branch_compaction.py --prompts 4 --pairs 3

Sampling draws differ between the modes once a call is compacted (a smaller batch draws fewer random numbers), so
the two modes keep different (equally distributed) branches: compare seconds and row-steps *per kept token*.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

import harness  # noqa: E402  (offline environment variables before torch/transformers)
import torch  # noqa: E402
from overhead import LONG_ANSWER_INSTRUCTION, spread  # noqa: E402
from transformers import set_seed  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from trl_credit.core.generation import generate_from_prefixes, sampling_overrides  # noqa: E402
from trl_credit.generation.hooks import hf_generate_hooks  # noqa: E402
from trl_credit.models import default_model_path  # noqa: E402
from trl_credit.tasks.data import make_arithmetic_dataset  # noqa: E402
from trl_credit.tasks.rewards import final_number_reward  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=192)
    parser.add_argument("--branches", type=int, default=4, help="B̂: branches per fork")
    parser.add_argument("--forks-per-call", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=None, help="JSON of the per-pair numbers")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dataset = make_arithmetic_dataset(num_train=64, num_test=4, seed=0, digits=2, num_operands=3, operators="+-",
                                      instruction=LONG_ANSWER_INSTRUCTION)["train"]
    config = GRPOConfig(output_dir="/tmp/branch_compaction", per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=args.tokens, temperature=1.0, top_p=0.95, report_to="none",
                        use_cpu=not torch.cuda.is_available(), seed=0)
    trainer = GRPOTrainer(model=default_model_path(), reward_funcs=final_number_reward, args=config,
                          train_dataset=dataset)
    tokenizer = trainer.processing_class
    prompt_ids = [tokenizer.apply_chat_template(dataset[i]["prompt"], add_generation_prompt=True, tokenize=True,
                                                return_dict=False) for i in range(args.prompts)]
    set_seed(0)
    rollouts, _ = generate_from_prefixes(trainer, prompt_ids, max_new_tokens=args.tokens)
    forks = []  # (prefix ids, budget)
    for prompt, rollout in zip(prompt_ids, rollouts):
        for share in (0.25, 0.5, 0.75):
            cut = max(1, int(share * len(rollout)))
            forks.append((list(prompt) + rollout[:cut], args.tokens - cut))
    forks.sort(key=lambda fork: -fork[1])
    calls = [forks[i : i + args.forks_per_call] for i in range(0, len(forks), args.forks_per_call)]
    print(f"{len(rollouts)} rollouts of {statistics.mean(map(len, rollouts)):.0f} tokens on average; {len(forks)} forks "
          f"x {args.branches} branches in {len(calls)} calls", flush=True)

    model = trainer.accelerator.unwrap_model(trainer.model)
    row_steps = []
    handle = model.register_forward_hook(
        lambda module, a, kw, out: row_steps.append(kw["input_ids"].size(0)) if kw["input_ids"].size(1) == 1 else None,
        with_kwargs=True)
    pairs = []
    for pair in range(args.pairs):
        record = {}
        for compact in ((False, True) if pair % 2 == 0 else (True, False)):
            set_seed(1000 + pair)
            row_steps.clear()
            kept, start = 0, time.perf_counter()
            for call in calls:
                rows = [prefix for prefix, _ in call for _ in range(args.branches)]
                budgets = [budget for _, budget in call for _ in range(args.branches)]
                with sampling_overrides(trainer, max_new_tokens=max(budgets)), \
                        hf_generate_hooks(trainer, budgets, compact_rows=compact):
                    completions, _ = trainer._generate_single_turn(rows, None, {}, args.branches)
                kept += sum(min(len(ids), budget) for ids, budget in zip(completions, budgets))
            seconds = time.perf_counter() - start
            record["compact" if compact else "plain"] = dict(seconds=seconds, kept_tokens=kept,
                                                             row_steps=sum(row_steps))
            print(f"pair {pair} {'compact' if compact else 'plain  '}: {seconds:7.2f} s, {kept} tokens kept, "
                  f"{sum(row_steps)} row-steps", flush=True)
        for cost in ("seconds", "row_steps"):  # per kept token: the modes keep different (equally likely) branches
            per_token = {mode: record[mode][cost] / record[mode]["kept_tokens"] for mode in ("plain", "compact")}
            record[f"{cost}_per_token_ratio"] = per_token["compact"] / per_token["plain"]
        pairs.append(record)
    handle.remove()
    for key in ("seconds_per_token_ratio", "row_steps_per_token_ratio"):
        ratios = spread([p[key] for p in pairs])
        print(f"compact / plain, {key}: median {ratios['median']:.3f} [{ratios['min']:.3f}, {ratios['max']:.3f}]"
              f" over {ratios['n']} pairs")
    for mode in ("plain", "compact"):
        share = statistics.median(p[mode]["kept_tokens"] / p[mode]["row_steps"] for p in pairs)
        print(f"{mode}: kept tokens / row-steps computed {share:.3f}")
    if args.output:
        with open(args.output, "w") as f:
            json.dump(dict(settings=vars(args), pairs=pairs), f, indent=1)


if __name__ == "__main__":
    main()
