"""SRPO's resets in a multi-turn run with an environment_factory, in 1 or 2 processes (launched by
tests/test_multiturn_resets.py): the scripted 2-turn seed of that test (tool result in the middle), an oracle reset
after the tool result, 2 prompts per step (in 2 processes one prompt group on each: SRPO keeps a prompt's rows on one
process). The seed candidates' rewards (a collective reward call padded with a real row, with the candidates' messages
and environments), the generation calls and the metrics run over both processes. Each rank writes the text, loss mask
and model mask of its training rows, its environments' counters and the srpo/ and tools/ metrics."""

import os
import sys
from unittest.mock import patch

from tests.mp_scripts.scripted_rows import write_result
from tests.test_multiturn_resets import ANSWER, CONTINUATION, DONE, SEED, Counter, says_twelve
from tests.test_multiturn_trl import prompts_dataset
from tests.tiny_tools import ScriptedGeneration
from trl_credit import SRPOConfig, SRPOTrainer


def main(model_dir, out_dir):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    args = SRPOConfig(
        output_dir=out_dir, learning_rate=0.1, per_device_train_batch_size=8 // world, num_generations=4,
        max_completion_length=128, max_steps=1, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
        bf16=False, seed=0, disable_tqdm=True, reset="oracle", reset_groups=1, suffixes_per_reset=2,
        seed_source="fresh", seed_candidates_per_round=2, max_seed_rounds=1, rollout_template="none",
        thought_delimiter=".", reset_seed=0, shuffle_dataset=False)
    trainer = SRPOTrainer(model_dir, says_twelve, args=args, train_dataset=prompts_dataset(),
                          environment_factory=Counter, step_checker=lambda question, thoughts: 3)
    tokenizer, rank, records = trainer.processing_class, trainer.accelerator.process_index, []

    def record(step):
        output = step.output
        for i in range(output["completion_ids"].size(0)):
            kept = output["completion_mask"][i] == 1
            records.append([rank * output["completion_ids"].size(0) + i,
                            tokenizer.decode(output["completion_ids"][i][kept].tolist()),
                            output["tool_mask"][i][kept].tolist(),
                            step.record.model_mask[i][kept].tolist()])  # (this process's rows)

    trainer.add_credit_callback(record)
    script = ScriptedGeneration(tokenizer, [ANSWER, SEED, SEED, ANSWER], after_tool=DONE, continuation=CONTINUATION)
    with patch.object(trainer.model, "generate", side_effect=script):
        trainer.train()
    records.append(["counters", [env._counter for env in trainer.environments]])
    write_result(trainer, out_dir, records, ("srpo/", "tools/", "reward"), "srpo/fallback_rate")


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, *sys.argv[1:3])
