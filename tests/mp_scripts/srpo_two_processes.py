"""2-process SRPOTrainer run (launched by tests/test_srpo_multiprocess.py through torchrun).

Rank 0's reward calls every rollout correct, so its prompts never find an incorrect seed and need every seed
round; rank 1 finds its seeds in round 1 and must keep joining the collective generation and reward calls of
rounds 2..max_seed_rounds with zero rows. A mismatch in the number of collective calls would hang or crash.
With reset="self" the localization is the scored choice: rank 0 has no seed to score and must still join the
(padded) log-prob pass of rank 1. A step checker (the last thought is wrong) adds the quality metrics, whose counts
are summed over both processes.
"""

import json
import os
import sys

from trl_credit import SRPOConfig, SRPOTrainer
from trl_credit.tasks.data import make_arithmetic_dataset


def rank_dependent_reward(completions, **kwargs):
    parity = [len(c[0]["content"]) % 2 for c in completions]
    if int(os.environ.get("RANK", "0")) == 0:
        return [1.0 + 0.5 * p for p in parity]  # always >= success_threshold: never a seed
    return [0.0] * len(parity)  # always incorrect: the first candidate is the seed


def last_thought_is_wrong(question, thoughts):
    return len(thoughts)


def main(model_dir: str, out_dir: str, reset: str):
    args = SRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=8,
        num_generations=8,
        seed_candidates_per_round=2,
        max_seed_rounds=3,
        max_completion_length=8,
        max_steps=2,
        reset=reset,
        thought_delimiter=" ",
        rollout_template="{question}",
        localization_template="{question}\n{steps}\n1-{num_steps}?",
        localization_max_tokens=4,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
    )
    dataset = make_arithmetic_dataset(num_train=8, num_test=2)["train"]
    trainer = SRPOTrainer(model=model_dir, reward_funcs=rank_dependent_reward, args=args, train_dataset=dataset,
                          step_checker=last_thought_is_wrong)
    trainer.train()
    logs = [log for log in trainer.state.log_history if "srpo/fallback_rate" in log]
    # One file per rank: the two processes' stdout lines can interleave.
    rank = trainer.accelerator.process_index
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as report:
        json.dump(
            {
                "rank": rank,
                "world": trainer.accelerator.num_processes,
                "steps": trainer.state.global_step,
                "fallback_rate": [log["srpo/fallback_rate"] for log in logs],
                "seed_rounds": [log["srpo/seed_rounds"] for log in logs],
                "logs": [{k: v for k, v in log.items() if k.startswith("srpo/")} for log in logs],
            },
            report,
        )


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, sys.argv[1], sys.argv[2], sys.argv[3])
