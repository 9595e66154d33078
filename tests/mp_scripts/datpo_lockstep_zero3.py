"""DATPO with an environment_factory under ZeRO-3 on 2 processes whose branches differ (launched by
tests/engines/test_deepspeed.py): process 0's prompt is unsolved (reward 0: its 2 base rollouts fork and grow 2
branches each, which call increment(5) in TRL's resumed tool loop: one more generation round), process 1's is solved
(reward 1: no branch, no resumed loop). Under ZeRO-3 every generation call gathers the policy's parameters (a
collective call), so process 1 must join process 0's resumed-loop call (core.tool_loop.lockstep_generation) or both
hang. The generation is scripted as in tests/test_multiturn_datpo.py (CALL, the tool result, LONG; a turn in progress
continued with CONTINUATION). Each rank writes its training rows' texts and tool masks."""

import json
import os
import sys
from unittest.mock import patch

from datasets import Dataset

from tests.test_multiturn_datpo import CALL, CONTINUATION, LONG
from tests.test_multiturn_trl import CounterEnvironment
from tests.tiny_tools import ScriptedGeneration
from trl_credit import DATPOConfig, DATPOTrainer

QUESTIONS = ["What is 3 times 4?", "Say done."]


def solved(prompts, **kwargs):
    """1 for the second question's rollouts (solved: no tree), 0 for the first's (a tree)."""
    return [float(prompt[-1]["content"] == QUESTIONS[1]) for prompt in prompts]


def main(model_dir, out_dir):
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in QUESTIONS] * 4})
    args = DATPOConfig(
        output_dir=out_dir, learning_rate=0.1, per_device_train_batch_size=2, num_generations=2,
        max_completion_length=256, max_steps=1, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
        bf16=False, seed=0, disable_tqdm=True, max_forks=1, max_branches=2, fork_method="fixed_seg",
        use_diversity=False, shuffle_dataset=False)
    trainer = DATPOTrainer(model_dir, solved, args=args, train_dataset=dataset, environment_factory=CounterEnvironment)
    tokenizer, rank, rows = trainer.processing_class, trainer.accelerator.process_index, []

    def record(step):
        output = step.output
        for i in range(output["completion_ids"].size(0)):
            kept = output["completion_mask"][i] == 1
            rows.append([tokenizer.decode(output["completion_ids"][i][kept].tolist()),
                         output["tool_mask"][i][kept].tolist()])

    trainer.add_credit_callback(record)
    script = ScriptedGeneration(tokenizer, [CALL], after_tool=LONG, continuation=CONTINUATION)
    with patch.object(trainer.accelerator.unwrap_model(trainer.model), "generate", side_effect=script):
        trainer.train()
    result = {"rank": rank, "world": trainer.accelerator.num_processes, "steps": trainer.state.global_step,
              "deepspeed": bool(trainer.is_deepspeed_enabled), "rows": rows,
              "calls": [[kind for kind, _ in call] for call in script.calls]}
    with open(os.path.join(out_dir, f"result_{rank}.json"), "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, *sys.argv[1:3])
