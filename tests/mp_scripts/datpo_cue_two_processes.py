"""The composed trainer DATPO trees x Cue-GRPO rarity weights under torchrun (launched by
tests/test_compose_datpo_cue.py), with deterministic generation (as tests/mp_scripts/datpo_two_processes.py:
completions are a function of the prompt tokens and of the row's global position), so a 1-process and a 2-process
run see the same trees. Two runs, one step each:

- ``spanning``: 1 prompt, ``4 / world`` base rows per process: with 2 processes its tree spans both (leaves and
  their texts on both processes, P partitioned by one of them).
- ``two_trees``: 2 prompts, ``8 / world`` rows per process: each process holds one tree, and the callable partitions
  are dealt one per process.

Writes ``rank<N>.json`` with every training row (prompt, loss tokens, advantages) and the cue/ metrics.
"""

import json
import os
import sys

import torch
from datasets import Dataset

from trl_credit.config import CreditConfig
from trl_credit.core.trainer import CreditTrainer
from trl_credit.cue_grpo.parts import RarityWeights
from trl_credit.datpo.forest import TreeBatch
from trl_credit.datpo.parts import BlockCredit, Trees
from trl_credit.tasks.data import make_arithmetic_dataset


def parity_verifier(completions, completion_ids, **kwargs):
    return [float(sum(ids) % 2) for ids in completion_ids]


def thirds_format(completions, completion_ids, **kwargs):
    return [0.5 * float(sum(ids) % 3 == 0) for ids in completion_ids]


def length_partition(completions, prompt):
    return [len(text) % 3 for text in completions]


class RecordingBlocks(BlockCredit):
    """BlockCredit that keeps the trees of each batch."""

    def __init__(self):
        super().__init__()
        self.trees = []

    def advantages(self, ctx, batch, inputs, output):
        self.trees.append(batch.payload(TreeBatch))
        return super().advantages(ctx, batch, inputs, output)


class DeterministicTrees(CreditTrainer):
    """The composed trainer with a generation that depends only on the prompt and the row's global position."""

    def __init__(self, *args, **kwargs):
        self.rows = []
        super().__init__(*args, **kwargs)

    def _fake_completion(self, seed: int) -> list[int]:
        vocab = len(self._tokenizer)
        return [3 + (seed * 31 + k * 17) % (vocab - 3) for k in range(6 + seed % 5)] + [self._tokenizer.eos_token_id]

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        ctx = self._batch_context  # the trees' state of this batch: ctx.scratch(rollout)
        if not (ctx is not None and ctx.scratch(self.rollout).get("branching")):  # base rollouts, seeded by row index
            first = self.accelerator.process_index * len(prompt_ids)
            return [self._fake_completion(hash((tuple(p), first + r)) % 100003) for r, p in enumerate(prompt_ids)], None
        seen, completions = {}, []  # branches, seeded by the prefix and its occurrence (B̂ identical prefixes a fork)
        for prompt in prompt_ids:
            key = tuple(prompt)
            seen[key] = seen.get(key, 0) + 1
            completions.append(self._fake_completion(hash((key, seen[key])) % 100003))
        return completions, None

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        step_rows = []
        for r in range(output["completion_ids"].size(0)):
            mask = output["completion_mask"][r].bool()
            if mask.any():  # not an empty filler row
                step_rows.append([
                    output["prompt_ids"][r][output["prompt_mask"][r].bool()].tolist(),
                    output["completion_ids"][r][mask].tolist(),
                    output["datpo_base_advantages"][r][mask].tolist(),
                ])
        self.rows.append(step_rows)
        return output


def run(name, model_dir, out_dir, per_device, prompts, world, return_trainer=False):
    data = make_arithmetic_dataset(num_train=16, num_test=2, seed=0)["train"]
    dataset = Dataset.from_list([data[0], data[1]] if prompts == 2 else [data[0]])
    args = CreditConfig(
        output_dir=f"{out_dir}/{name}", rollout="trees", credit="blocks", modifiers=["cue"],
        per_device_train_batch_size=per_device, num_generations=4, max_completion_length=12, max_steps=1,
        learning_rate=1e-3, report_to="none", use_cpu=True, save_strategy="no", logging_steps=1, disable_tqdm=True,
        seed=0, fork_method="fixed_seg", difficulty_adaptive=False, max_forks=2, max_branches=2, use_diversity=False,
        cue_partition="callable", cue_weighting="cr", cue_alpha=1.0, cue_tau=1.2,
    )
    credit = RecordingBlocks()
    trainer = DeterministicTrees(
        model_dir, [parity_verifier, thirds_format], args=args, train_dataset=dataset, rollout=Trees(), credit=credit,
        modifiers=[RarityWeights(partition_fn=length_partition)],
    )
    trainer.train()
    if return_trainer:
        return trainer, credit
    metrics = {k: v for entry in trainer.state.log_history for k, v in entry.items() if k.startswith("cue/")}
    return {"steps": trainer.state.global_step, "rows": trainer.rows, "cue": metrics}


def main(model_dir: str, out_dir: str):
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    result = {
        "rank": rank,
        "spanning": run("spanning", model_dir, out_dir, 4 // world, 1, world),
        "two_trees": run("two_trees", model_dir, out_dir, 8 // world, 2, world),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as report:
        json.dump(result, report)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, sys.argv[1], sys.argv[2])
