"""Multi-turn credit in 1 or 2 processes (launched by tests/test_multiturn_credit.py): a user's rollout_func returns
2-turn completions with an environment result in the middle (``env_mask`` 0 on it), by the row's global position,
the same in both runs. One prompt per step, one group of 4 rows: in 2 processes the group spans both (rows 0-1 on
rank 0, rows 2-3 on rank 1), so OPPO's token moments and the process credit's step rewards need every process's rows.
Each rank writes the per-token advantages of its rows (by global row) and the method's metrics."""

import sys

from tests.mp_scripts.scripted_rows import write_result
from trl_credit import CreditConfig, CreditTrainer
from trl_credit.process.parts import ProcessCredit
from trl_credit.tasks.data import make_arithmetic_dataset
from trl_credit.tasks.rewards import completion_text

TURN_1, ENVIRONMENT = "Step 1: compute 12 * 3 = 36.", " The result is 36."
ANSWERS = ["36", "7", "36", "4"]


def accuracy(completions, **kwargs):
    return [float("\\boxed{36}" in completion_text(c)) for c in completions]


def formatted(completions, **kwargs):
    return [1.0] * len(completions)


def turn_rewards(prompt, completion, steps, **row):
    return [float("36" in step) for step in steps]


def main(model_dir, out_dir, credit):
    world = int(__import__("os").environ.get("WORLD_SIZE", "1"))
    args = CreditConfig(
        output_dir=out_dir, credit=credit, per_device_train_batch_size=4 // world, num_generations=4,
        max_completion_length=64, max_steps=2, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
        logging_steps=1, disable_tqdm=True,
    )
    dataset = make_arithmetic_dataset(num_train=8, num_test=2)["train"]

    def rollout(prompts, trainer):
        tokenizer = trainer.processing_class
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": None, "env_mask": []}
        for j, prompt in enumerate(prompts):
            row = trainer.accelerator.process_index * len(prompts) + j  # the row's global position in its group
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            first = tokenizer.encode(TURN_1, add_special_tokens=False)
            env = tokenizer.encode(ENVIRONMENT, add_special_tokens=False)
            second = tokenizer.encode(f" So \\boxed{{{ANSWERS[row % 4]}}}.", add_special_tokens=False)
            out["prompt_ids"].append(list(ids))
            out["completion_ids"].append(first + env + second + [tokenizer.eos_token_id])
            out["env_mask"].append([1] * len(first) + [0] * len(env) + [1] * (len(second) + 1))
        out["logprobs"] = [[0.0] * len(ids) for ids in out["completion_ids"]]
        return out

    parts = {"credit": ProcessCredit(step_reward=turn_rewards)} if credit == "process" else {}
    trainer = CreditTrainer(model_dir, [accuracy, formatted], args=args, train_dataset=dataset, rollout_func=rollout,
                            **parts)
    records, rank = [], trainer.accelerator.process_index

    def record(step):
        output = step.output
        for i in range(output["completion_ids"].size(0)):
            length = int(output["completion_mask"][i].sum())
            records.append([trainer.state.global_step, rank * output["completion_ids"].size(0) + i,
                            output["tool_mask"][i, :length].tolist(), output["advantages"][i, :length].tolist()])

    trainer.add_credit_callback(record)
    trainer.train()
    write_result(trainer, out_dir, records, (f"{credit}/",), f"{credit}/nonfinite_reward_rate")


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, *sys.argv[1:4])
