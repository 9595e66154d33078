"""The implicit PRM credit (``CreditConfig(credit="implicit_prm")``) with deterministic generations, in 1 or 2
processes (launched by tests/test_prime_trainer.py). One prompt per step, one group of 8 rows: in 2 processes the group
spans both (rows 0-3 on rank 0, rows 4-7 on rank 1), so its baselines, the batch's largest return, the whitening
moments and the PRM's gradients need every process's rows. A generated text depends only on the row's global position
and the call's number, the same in both runs; each rank writes the per-token advantages of its rows (by global row)
and the prime/ metrics. float32 (TRL turns bf16 on by default, on the CPU too): bf16 rounds the PRM's gradients
differently for 4 and 8 rows, and Adam's first step amplifies that. The policy's learning rate is 0, so the second
step's rows differ between the runs only if the PRM's update did."""

import os
import sys

from tests.mp_scripts.scripted_rows import boxed_four_reward, generate_scripted_rows, write_result
from trl_credit import CreditConfig
from trl_credit.core.trainer import CreditTrainer
from trl_credit.tasks.data import make_arithmetic_dataset


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
    records = generate_scripted_rows(trainer)
    trainer.train()
    write_result(trainer, out_dir, records, ("prime/",), "prime/prm_loss")


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, *sys.argv[1:])
