"""2-process GRPO smoke run (launched by tests/test_multiprocess_smoke.py through torchrun)."""

import json
import sys

from trl import GRPOConfig, GRPOTrainer

from trl_credit.tasks.data import make_arithmetic_dataset


def length_parity_reward(completions, **kwargs):
    return [float(len(c[0]["content"]) % 2) for c in completions]


def main(model_dir: str, out_dir: str):
    args = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
    )
    dataset = make_arithmetic_dataset(num_train=8, num_test=2)["train"]
    trainer = GRPOTrainer(model=model_dir, reward_funcs=length_parity_reward, args=args, train_dataset=dataset)
    trainer.train()
    # One file per rank: the two processes' stdout lines can interleave.
    rank = trainer.accelerator.process_index
    with open(f"{out_dir}/rank{rank}.json", "w") as report:
        json.dump({"rank": rank, "world": trainer.accelerator.num_processes, "steps": trainer.state.global_step}, report)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, sys.argv[1], sys.argv[2])
