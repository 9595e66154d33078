"""SRPO's resets x Cue-GRPO's rarity weights (``CreditTrainer``, ``CreditConfig(rollout="resets", modifiers=["cue"])``)
with deterministic generations, in 1 or 2 processes (launched by tests/test_compose_srpo_cue.py).

A generated text depends only on its prefix (prompt, or prompt + reset prefix), its occurrence among the rows of
that prefix in the generation call and the call's number, all the same in a 1-process run (both prompts on one
process) and a 2-process run (one prompt per process); oracle resets (the last thought is wrong) use no random
draw. So both runs see the same global rows, and each rank writes the final advantages of its rows (by global row)
and the cue/ and srpo/ metrics, for the callable and the cue partitions."""

import json
import os
import sys

from trl_credit import CreditConfig
from trl_credit.core.trainer import CreditTrainer
from trl_credit.cue_grpo.parts import RarityWeights
from trl_credit.srpo.parts import Resets
from trl_credit.tasks.data import make_arithmetic_dataset

A = "We substitute x = 2 into the equation.\nWe compute the value of the sum now.\nTherefore \\boxed{4}."
B = "The root is \\sqrt{16} which is exact.\nTaking \\log_2 of both sides gives 2.\nTherefore \\boxed{4}."
D = "I am not sure about this one.\nThe answer is \\boxed{5}."
TEXTS = [A, D, B, A, D]


def boxed_four_reward(completions, **kwargs):
    return [1.0 if "\\boxed{4}" in c[0]["content"] else 0.0 for c in completions]


def format_reward(completions, **kwargs):
    return [1.0] * len(completions)


def by_first_cue(completions, prompt):
    return ["substitute" if "substitute" in text else "other" for text in completions]


def last_thought_is_wrong(question, thoughts):
    return len(thoughts)


def run(model_dir, out_dir, partition):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args = CreditConfig(
        output_dir=out_dir,
        rollout="resets",
        modifiers=["cue"],
        cue_partition=partition,
        per_device_train_batch_size=16 // world,  # two prompts of 8 rows per step (4 base + 1 reset group of 4)
        num_generations=8,
        reset="oracle",
        reset_groups=1,
        suffixes_per_reset=4,
        seed_candidates_per_round=2,
        max_seed_rounds=3,
        max_completion_length=96,
        max_steps=2,
        thought_delimiter="\n",
        rollout_template="{question}",
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    dataset = make_arithmetic_dataset(num_train=8, num_test=2)["train"]
    modifier = RarityWeights(partition_fn=by_first_cue if partition == "callable" else None)
    trainer = CreditTrainer(model_dir, [boxed_four_reward, format_reward], args=args, train_dataset=dataset,
                            rollout=Resets(step_checker=last_thought_is_wrong), modifiers=[modifier])
    tokenizer = trainer.processing_class
    rank = trainer.accelerator.process_index
    calls = [0]

    def deterministic_generation(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        calls[0] += 1
        seen, out = {}, []
        for ids in prompt_ids:
            key = tuple(ids)
            occurrence = seen[key] = seen.get(key, -1) + 1
            text = TEXTS[(occurrence + calls[0] + sum(ids)) % len(TEXTS)]
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        return out, None

    trainer._generate_single_turn = deterministic_generation
    records = []

    def record(credit_step):
        output = credit_step.output
        texts = tokenizer.batch_decode(output["completion_ids"], skip_special_tokens=True)
        step = trainer.state.global_step
        for i, (text, adv) in enumerate(zip(texts, output["advantages"].tolist(), strict=True)):
            records.append([step, rank * len(texts) + i, text, adv])

    trainer.add_credit_callback(record)
    trainer.train()
    logs = [{k: v for k, v in log.items() if k.startswith(("cue/", "srpo/"))}
            for log in trainer.state.log_history if "cue/frac_groups_redistributed" in log]
    return {"partition": partition, "rank": rank, "world": trainer.accelerator.num_processes,
            "steps": trainer.state.global_step, "records": records, "logs": logs}


def main(model_dir, out_dir):
    for partition in ("callable", "cue"):
        result = run(model_dir, out_dir, partition)
        # one file per rank and partition: the ranks' stdout streams interleave
        with open(os.path.join(out_dir, f"result_{partition}_{result['rank']}.json"), "w") as handle:
            json.dump(result, handle)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, sys.argv[1], sys.argv[2])
