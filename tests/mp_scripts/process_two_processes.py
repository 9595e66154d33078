"""The process credit (``CreditConfig(credit="process", modifiers=["cue"])``) with deterministic generations, in 1 or
2 processes (launched by tests/test_process_trainer.py). One prompt per step, one group of 8 rows: in 2 processes
the group spans both (rows 0-3 on rank 0, rows 4-7 on rank 1), so its step-reward statistics need every process's
rows. A generated text depends only on the row's global position and the call's number, the same in both runs; each
rank writes the per-token advantages of its rows (by global row) and the process/ and cue/ metrics."""

import os
import sys

from tests.mp_scripts.scripted_rows import boxed_four_reward, generate_scripted_rows, write_result
from trl_credit import CreditConfig
from trl_credit.core.trainer import CreditTrainer
from trl_credit.cue_grpo.parts import RarityWeights
from trl_credit.process.parts import ProcessCredit
from trl_credit.tasks.data import make_arithmetic_dataset

def format_reward(completions, **kwargs):
    return [1.0] * len(completions)


def by_first_cue(completions, prompt):
    return ["substitution" if "substitution" in text else "other" for text in completions]


def step_checker(prompt, completion, steps, **row):
    # 1 up to the first step saying "wrong" or "not sure", 0 from it on; a question ("?") is not scored.
    rewards, wrong = [], False
    for step in steps:
        wrong = wrong or "wrong" in step or "not sure" in step
        rewards.append(None if "?" in step else float(not wrong))
    return rewards


def main(model_dir, out_dir):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = CreditConfig(
        output_dir=out_dir, credit="process", modifiers=["cue"], cue_partition="callable",
        per_device_train_batch_size=8 // world, num_generations=8, max_completion_length=64, max_steps=2,
        report_to="none", use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
    )
    dataset = make_arithmetic_dataset(num_train=8, num_test=2)["train"]
    trainer = CreditTrainer(model_dir, [boxed_four_reward, format_reward], args=args, train_dataset=dataset,
                            credit=ProcessCredit(step_reward=step_checker),
                            modifiers=[RarityWeights(partition_fn=by_first_cue)])
    records = generate_scripted_rows(trainer)
    trainer.train()
    write_result(trainer, out_dir, records, ("cue/", "process/"), "process/steps_per_completion")


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, sys.argv[1], sys.argv[2])
