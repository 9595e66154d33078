"""The implicit PRM credit (``CreditConfig(credit="implicit_prm")``) with deterministic generations, in 1 or 2
processes (launched by tests/test_prime_trainer.py). One prompt per step, one group of 8 rows: in 2 processes the group
spans both (rows 0-3 on rank 0, rows 4-7 on rank 1), so its baselines, the batch's largest return, the whitening
moments and the PRM's gradients need every process's rows. A generated text depends only on the row's global position
and the call's number, the same in both runs; each rank writes the per-token advantages of its rows (by global row)
and the prime/ metrics. float32 (TRL turns bf16 on by default, on the CPU too): bf16 rounds the PRM's gradients
differently for 4 and 8 rows, and Adam's first step amplifies that. The policy's learning rate is 0, so the second
step's rows differ between the runs only if the PRM's update did."""

import json
import os
import sys

from trl_credit import CreditConfig
from trl_credit.core.trainer import CreditTrainer
from trl_credit.tasks.data import make_arithmetic_dataset

TEXTS = [
    "We add 2 and 2.\nThat gives 4.\nTherefore \\boxed{4}.",
    "We add 2 and 2.\nThat gives 5, wrong.\nTherefore \\boxed{5}.",
    "Maybe 2 times 2?\nIt is 4.\nSo \\boxed{4}.",
    "I am not sure.\n\\boxed{3}",
    "Try substitution x = 2.\nThe value is 4.\n\\boxed{4}",
]


def boxed_four_reward(completions, **kwargs):
    return [1.0 if "\\boxed{4}" in c[0]["content"] else 0.0 for c in completions]


def format_reward(completions, **kwargs):
    return [1.0 if "\n" in c[0]["content"] else 0.0 for c in completions]


def main(model_dir, out_dir, weights="full"):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    kwargs = {}
    if weights == "lora":  # the PRM is a second adapter on the DDP-wrapped policy
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    args = CreditConfig(
        output_dir=out_dir, credit="implicit_prm", prime_learning_rate=1e-2,
        per_device_train_batch_size=8 // world, num_generations=8, max_completion_length=64, max_steps=2,
        learning_rate=0.0, bf16=False, report_to="none", use_cpu=True, save_strategy="no", logging_steps=1,
        disable_tqdm=True,
    )
    dataset = make_arithmetic_dataset(num_train=8, num_test=2)["train"]
    trainer = CreditTrainer(model_dir, [boxed_four_reward, format_reward], args=args, train_dataset=dataset, **kwargs)
    tokenizer = trainer.processing_class
    rank = trainer.accelerator.process_index
    calls = [0]

    def deterministic_generation(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        calls[0] += 1
        out = []
        for position in range(len(prompt_ids)):
            row = rank * len(prompt_ids) + position  # the row's global position in its group of 8
            text = TEXTS[(row + calls[0]) % len(TEXTS)]
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        return out, None

    trainer._generate_single_turn = deterministic_generation
    records = []

    def record(credit):  # the rows TRL trains on, once per generation batch (core.CreditStep)
        output = credit.output
        texts = tokenizer.batch_decode(output["completion_ids"], skip_special_tokens=True)
        step = trainer.state.global_step
        for i, text in enumerate(texts):
            length = int(output["completion_mask"][i].sum())
            records.append([step, rank * len(texts) + i, text, output["advantages"][i, :length].tolist()])

    trainer.add_credit_callback(record)
    trainer.train()
    logs = [{k: v for k, v in log.items() if k.startswith("prime/")}
            for log in trainer.state.log_history if "prime/prm_loss" in log]
    result = {"rank": rank, "world": trainer.accelerator.num_processes, "steps": trainer.state.global_step,
              "records": records, "logs": logs}
    with open(os.path.join(out_dir, f"result_{rank}.json"), "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, *sys.argv[1:])
