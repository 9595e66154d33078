"""CueGRPOTrainer with deterministic generations, in 1 or 2 processes (launched by tests/test_cue_grpo_multiprocess.py).

Completions are a deterministic function of the prompt ids and the global row index, so a 1-process run and a
2-process run (a group of 4 split 2 + 2 across processes) see the same generations; each rank prints the final
advantages of its rows (by global row) for the cue, random and callable partitions."""

import json
import os
import sys

from trl_credit import CueGRPOConfig, CueGRPOTrainer
from trl_credit.core.logs import warned_keys
from trl_credit.tasks.data import make_arithmetic_dataset

A = "We substitute x = 2 into the equation.\n\nWe compute the value of the sum now.\n\nTherefore the answer is \\boxed{4}."
B = "The root is \\sqrt{16} which is exact.\n\nTaking \\log_2 of both sides gives 2.\n\nTherefore the answer is \\boxed{4}."
D = "I am not sure about this one at all.\n\nThe answer is \\boxed{5}."
TEXTS = [A, A, B, D]


def boxed_four_reward(completions, **kwargs):
    return [1.0 if "\\boxed{4}" in c[0]["content"] else 0.0 for c in completions]


def format_reward(completions, **kwargs):
    # The user scenario: a format reward true for every row next to the verifier. Totals shift by 1, TRL's
    # advantages do not change, and P (correct and A_i > 0) follows the first reward.
    return [1.0] * len(completions)


def by_first_cue(completions, prompt):
    return ["substitute" if "substitute" in text else "other" for text in completions]


def run(model_dir, out_dir, partition):
    world_batch = 4  # one group of 4 per step, split across WORLD_SIZE processes
    args = CueGRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=world_batch // int(os.environ.get("WORLD_SIZE", "1")),
        num_generations=4,
        max_completion_length=64,
        max_steps=2,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        cue_partition=partition,
    )
    dataset = make_arithmetic_dataset(num_train=8, num_test=2)["train"]
    kwargs = {"partition_fn": by_first_cue} if partition == "callable" else {}
    trainer = CueGRPOTrainer(
        model=model_dir, reward_funcs=[boxed_four_reward, format_reward], args=args, train_dataset=dataset, **kwargs
    )
    tokenizer = trainer.processing_class
    rank = trainer.accelerator.process_index

    def deterministic_generation(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for i, ids in enumerate(prompt_ids):
            global_row = rank * len(prompt_ids) + i
            text = TEXTS[(global_row + sum(ids)) % len(TEXTS)]
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        return out, None

    trainer._generate_single_turn = deterministic_generation
    records, trl_rows = [], []

    def record(credit):  # the rows TRL trains on, once per generation batch (core.CreditStep)
        # TRL's advantages of every row as the core handed them to the credit, and TRL's own of this process's rows
        trl_rows.append([credit.context.capture.trl_global_advantages.tolist(), credit.trl_advantages.tolist()])
        output = credit.output
        texts = tokenizer.batch_decode(output["completion_ids"], skip_special_tokens=True)
        step = trainer.state.global_step
        for i, (text, adv) in enumerate(zip(texts, output["advantages"].tolist(), strict=True)):
            records.append([step, rank * len(texts) + i, TEXTS.index(text), adv])

    trainer.add_credit_callback(record)
    trainer.train()
    return {"partition": partition, "rank": rank, "world": trainer.accelerator.num_processes,
            "steps": trainer.state.global_step, "records": records, "trl_rows": trl_rows,
            "restated_as_trl": "trl_advantages_restated" not in warned_keys(trainer)}


def main(model_dir, out_dir):
    for partition in ("cue", "random", "callable"):
        result = run(model_dir, out_dir, partition)
        # one file per rank and partition: the ranks' stdout streams interleave
        with open(os.path.join(out_dir, f"result_{partition}_{result['rank']}.json"), "w") as handle:
            json.dump(result, handle)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, sys.argv[1], sys.argv[2])
