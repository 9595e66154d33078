"""DATPO's trees in a multi-turn run with an environment_factory, in 1 or 2 processes (launched by
tests/test_multiturn_datpo.py): the scripted 2-turn rollout of that test (CALL, the tool result "2", LONG), one prompt
of 4 base rollouts per step, so in 2 processes the group is split across them (2 base rows each). Each fork's
branches may be generated on the other process (phase 2 shares the forks out) and come back to the fork's owner,
which resumes TRL's tool loop in its branches' environments (replayed to the fork) and scores them with those
environments. Each rank writes the text, tool_mask and advantages of its training rows, its batch environments'
counters and the datpo/ and tools/ metrics."""

import os
import sys
from unittest.mock import patch

from tests.mp_scripts.scripted_rows import write_result
from tests.test_multiturn_datpo import CALL, CONTINUATION, LONG, RewardedCounter
from tests.test_multiturn_trl import prompts_dataset
from tests.tiny_tools import ScriptedGeneration
from trl_credit import DATPOConfig, DATPOTrainer


def main(model_dir, out_dir):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    args = DATPOConfig(
        output_dir=out_dir, learning_rate=0.1, per_device_train_batch_size=4 // world, num_generations=4,
        max_completion_length=256, max_steps=1, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
        bf16=False, seed=0, disable_tqdm=True, max_forks=1, max_branches=2, difficulty_adaptive=False,
        fork_method="fixed_seg", use_diversity=False, value_estimate="subtree", branch_budget="remaining",
        shuffle_dataset=False)
    trainer = DATPOTrainer(model_dir, None, args=args, train_dataset=prompts_dataset(),
                           environment_factory=RewardedCounter)
    tokenizer, rank, records = trainer.processing_class, trainer.accelerator.process_index, []

    def record(step):
        output = step.output
        real = int(output["completion_mask"].sum(dim=1).gt(0).sum())  # filler rows (none expected) have no tokens
        for i in range(real):
            kept = output["completion_mask"][i] == 1
            records.append([rank, i, tokenizer.decode(output["completion_ids"][i][kept].tolist()),
                            output["tool_mask"][i][kept].tolist(),
                            [round(a, 6) for a in output["advantages"][i][kept].tolist()]])

    trainer.add_credit_callback(record)
    script = ScriptedGeneration(tokenizer, [CALL], after_tool=LONG, continuation=CONTINUATION)
    with patch.object(trainer.model, "generate", side_effect=script):
        trainer.train()
    records.append(["counters", [env._counter for env in trainer.environments]])
    write_result(trainer, out_dir, records, ("datpo/", "tools/", "reward"), "datpo/leaves_per_prompt")


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, *sys.argv[1:3])
