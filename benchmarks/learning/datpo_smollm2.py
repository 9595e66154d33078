"""Question: Does DATPO train end to end on SmolLM2, and what do its trees cost against GRPO?

Short real DATPO run: SmolLM2-135M-Instruct (offline) on the built-in arithmetic task, CPU or GPU.

Runs DATPO and plain GRPO for the same number of steps on the same prompts, side by side, and prints DATPO's tree
metrics (leaves per prompt, K̂/B̂, PassRate vs base pass rate, sibling diversity, tokens per leaf) and the
wall-clock ratio DATPO/GRPO per optimizer step.

    python benchmarks/learning/datpo_smollm2.py --steps 3 --prompts-per-step 2 --max-completion-length 96

Tree cost (issue target: generated tokens per leaf <= 0.6 of a GRPO rollout on answers of >= 128 tokens): RESULT
reports DATPO's tokens per leaf, the mean length of its base rollouts and of GRPO's rollouts, and their ratios.
"""

from __future__ import annotations

import argparse
import json
import time

from trl import GRPOConfig, GRPOTrainer

from trl_credit import DATPOConfig, DATPOTrainer
from trl_credit.models import default_model_path
from trl_credit.tasks.data import make_arithmetic_dataset
from trl_credit.tasks.rewards import final_number_reward


def main():
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--max-completion-length", type=int, default=96)
    parser.add_argument("--digits", type=int, default=2)
    parser.add_argument("--fork-method", default="sent_entropy")
    parser.add_argument("--no-grpo", action="store_true", help="skip the GRPO side-by-side run")
    parser.add_argument("--use-cpu", action="store_true")
    parser.add_argument("--output-dir", default="/tmp/datpo_smollm2")
    cli = parser.parse_args()

    model = default_model_path()
    dataset = make_arithmetic_dataset(num_train=64, num_test=8, digits=cli.digits, seed=0)["train"]
    common = dict(
        per_device_train_batch_size=4 * cli.prompts_per_step, num_generations=4,
        max_completion_length=cli.max_completion_length, max_steps=cli.steps, learning_rate=5e-6,
        temperature=1.0, report_to="none", logging_steps=1, save_strategy="no", use_cpu=cli.use_cpu, seed=0,
    )
    results = {}
    start = time.perf_counter()
    datpo = DATPOTrainer(
        model=model, reward_funcs=final_number_reward, train_dataset=dataset,
        args=DATPOConfig(output_dir=cli.output_dir + "/datpo", fork_method=cli.fork_method, **common),
    )
    datpo.train()
    results["datpo_seconds_per_step"] = (time.perf_counter() - start) / cli.steps
    logs = [log for log in datpo.state.log_history if "datpo/leaves_per_prompt" in log]
    results["datpo_tokens_per_leaf"] = sum(log["datpo/tokens_per_leaf"] for log in logs) / len(logs)
    results["datpo_base_rollout_length"] = sum(log["completions/mean_length"] for log in logs) / len(logs)
    results["datpo_leaves_per_prompt"] = sum(log["datpo/leaves_per_prompt"] for log in logs) / len(logs)
    results["tokens_per_leaf_over_base_rollout"] = results["datpo_tokens_per_leaf"] / results["datpo_base_rollout_length"]
    keys = ["reward", "datpo/v_root", "datpo/k_hat", "datpo/b_hat", "datpo/leaves_per_prompt", "datpo/pass_rate",
            "datpo/base_pass_rate", "datpo/sibling_diversity", "datpo/tokens_per_leaf", "datpo/leaf_length",
            "datpo/blocks_per_prompt", "datpo/forks_per_rollout", "datpo/no_fork_rate", "datpo/fork_fallback_rate",
            "datpo/branch_reward", "datpo/alpha", "datpo/entropy_from_sampler", "datpo/branch_tokens_past_budget"]
    for step, log in enumerate(logs, 1):
        print(f"step {step}: " + ", ".join(f"{k}={log[k]:.3f}" for k in keys if k in log))
    if not cli.no_grpo:
        start = time.perf_counter()
        grpo = GRPOTrainer(
            model=model, reward_funcs=final_number_reward, train_dataset=dataset,
            args=GRPOConfig(output_dir=cli.output_dir + "/grpo", loss_type="dapo", **common),
        )
        grpo.train()
        results["grpo_seconds_per_step"] = (time.perf_counter() - start) / cli.steps
        results["time_ratio_datpo_over_grpo"] = results["datpo_seconds_per_step"] / results["grpo_seconds_per_step"]
        grpo_logs = [log for log in grpo.state.log_history if "completions/mean_length" in log]
        results["grpo_rollout_length"] = sum(log["completions/mean_length"] for log in grpo_logs) / len(grpo_logs)
        results["tokens_per_leaf_over_grpo_rollout"] = results["datpo_tokens_per_leaf"] / results["grpo_rollout_length"]
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
