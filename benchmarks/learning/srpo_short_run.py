"""Question: Does SRPO (or RRPO) train end to end on SmolLM2, and what does it generate against GRPO?

Short real run: SRPO (or RRPO) vs GRPO side by side on offline SmolLM2-135M-Instruct, built-in arithmetic task,
LoRA r=64 alpha=64 (paper §5), reward ``final_number_reward``.

Both trainers see the same prompts (same seed) for the same number of steps. Every generation call of both goes
through ``_generate_single_turn``; the script counts the tokens it returns (SRPO: base, seed candidates,
localization and suffixes), so the printed token ratio is measured, not estimated. Also prints SRPO's own
metrics (fallback rate, correction rate, localization parse rate and sources, the scored localization's forward
tokens, mean reset position) and one seed/reset example.

    python benchmarks/learning/srpo_short_run.py --steps 4 --reset self
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Run from a checkout without installing: this repository's trl_credit first.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def counting(trainer_class):
    class Counting(trainer_class):
        generated_tokens = 0
        example = None

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if self.example is None and "tool_mask" in output:
                # One shared-prefix row of the first step: the reset prefix (masked) and the trained suffix.
                row = int(self.num_generations - 1)
                ids = output["completion_ids"][row][output["completion_mask"][row].bool()]
                mask = output["tool_mask"][row][: len(ids)].bool()
                self.example = {
                    "question": inputs[row]["prompt"][-1]["content"],
                    "answer": inputs[row]["answer"],
                    "prefix (masked)": self.processing_class.decode(ids[~mask]),
                    "suffix (trained)": self.processing_class.decode(ids[mask]),
                }
            return output

        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
            if self.model.training:
                self.generated_tokens += sum(len(ids) for ids in completion_ids)
            return completion_ids, logprobs

    Counting.__name__ = f"Counting{trainer_class.__name__}"
    return Counting


def run(method: str, cli) -> dict:
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from trl_credit import SRPOConfig, SRPOTrainer
    from trl_credit.models import default_model_path
    from trl_credit.srpo.prompts import LINES_ROLLOUT_TEMPLATE, wrap_prompt
    from trl_credit.tasks.data import make_arithmetic_dataset
    from trl_credit.tasks.rewards import final_number_reward

    dataset = make_arithmetic_dataset(num_train=64, num_test=8, digits=cli.digits, num_operands=cli.operands, seed=0)["train"]
    common = dict(
        output_dir=os.path.join(cli.output_dir, method),
        per_device_train_batch_size=8 * cli.prompts_per_step,
        num_generations=8,
        max_completion_length=cli.max_completion_length,
        max_steps=cli.steps,
        learning_rate=5e-5,
        temperature=0.7,
        top_p=0.95,
        beta=0.0,
        loss_type="grpo",
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        seed=0,
    )
    peft_config = LoraConfig(r=64, lora_alpha=64, task_type="CAUSAL_LM")
    if method == "grpo":  # (any other method name is SRPO/RRPO)
        # GRPO sees the same step-by-step instruction as SRPO's rollouts, so lengths are comparable.
        dataset = dataset.map(lambda row: {"prompt": wrap_prompt(row["prompt"], LINES_ROLLOUT_TEMPLATE)})
        trainer_class, args = counting(GRPOTrainer), GRPOConfig(**common)
    else:
        trainer_class = counting(SRPOTrainer)
        args = SRPOConfig(
            **common,
            reset=cli.reset,
            thought_delimiter="\n",
            rollout_template="lines",
            localization_max_tokens=cli.localization_max_tokens,
            seed_candidates_per_round=cli.seed_candidates,
            max_seed_rounds=cli.seed_rounds,
            seed_source=cli.seed_source,
            localization=cli.localization,
            localization_scoring=cli.localization_scoring,
            weight_decay=0.01,  # the paper's (Table 5), as measured when it was SRPOConfig's default
        )
    trainer = trainer_class(
        model=default_model_path(), reward_funcs=final_number_reward, args=args, train_dataset=dataset, peft_config=peft_config
    )
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    logs = [log for log in trainer.state.log_history if "reward" in log]

    def mean(key):
        values = [log[key] for log in logs if key in log]
        return sum(values) / len(values) if values else None

    keys = ["reward", "srpo/fallback_rate", "srpo/correction_rate", "srpo/base_pass_rate", "srpo/localization_parse_rate",
            "srpo/reset_position", "srpo/reset_at_question_rate", "srpo/single_thought_rate", "srpo/thoughts_per_seed",
            "srpo/seed_rounds", "srpo/tokens_vs_base", "srpo/tokens_vs_grpo", "srpo/paper_tokens_vs_grpo",
            "srpo/localization_forward_tokens_vs_grpo", "srpo/localization_source/generated",
            "srpo/localization_source/scored", "srpo/localization_source/random"]
    return {"method": method, "seconds": seconds, "generated_tokens": trainer.generated_tokens,
            **{key: mean(key) for key in keys if mean(key) is not None}, "example": trainer.example}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts_per_step", type=int, default=2)
    parser.add_argument("--reset", choices=["self", "random"], default="self")
    parser.add_argument("--digits", type=int, default=1)
    parser.add_argument("--operands", type=int, default=2)
    parser.add_argument("--max_completion_length", type=int, default=80)
    parser.add_argument("--localization_max_tokens", type=int, default=32)
    parser.add_argument("--localization", choices=["scored", "generate"], default="scored",
                        help="SRPOConfig.localization: the scored choice (default) or the decoded answer")
    parser.add_argument("--localization_scoring", choices=["plain", "calibrated"], default="calibrated",
                        help="SRPOConfig.localization_scoring: raw answer scores or divided by a content-free chain's")
    parser.add_argument("--seed_candidates", type=int, default=1)
    parser.add_argument("--seed_source", choices=["fresh", "base"], default="fresh")
    parser.add_argument("--seed_rounds", type=int, default=4)
    parser.add_argument("--skip_grpo", action="store_true")
    parser.add_argument("--output_dir", default="/tmp/srpo_short_run")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 avoids oversubscription on shared CPUs)")
    cli = parser.parse_args()
    import torch

    torch.set_num_threads(cli.threads)

    results = [run("rrpo" if cli.reset == "random" else "srpo", cli)]
    if not cli.skip_grpo:
        results.append(run("grpo", cli))
    for result in results:
        print("RESULT " + json.dumps(result))
    if len(results) == 2:
        srpo, grpo = results
        print(f"{'RRPO' if cli.reset == 'random' else 'SRPO'} vs GRPO over {cli.steps} steps: generated tokens x"
              f"{srpo['generated_tokens'] / grpo['generated_tokens']:.2f}, wall time x{srpo['seconds'] / grpo['seconds']:.2f}")


if __name__ == "__main__":
    main()
