"""DATPOTrainer under torchrun (launched by tests/test_datpo_multiprocess.py), with deterministic generation.

``_generate_single_turn`` is replaced by a function of the prompt tokens and of the row's global position, so a
1-process and a 2-process run see exactly the same rollouts; forks are ``fixed_seg`` (independent of the weights).
Two runs in one launch:

- ``one_sided``: 2 prompts per step, ``8 / world`` rows per process. The even-answer prompt is always solved (no
  branches), the odd one never fully: with 2 processes one process has branches and the other none. 2 steps.
- ``spanning``: 1 prompt per step, ``4 / world`` rows per process: with 2 processes its group spans both. 1 step.

- ``loss_types``: the ``one_sided`` setting for 1 step per TRL loss type, with ``per_device_train_batch_size / world``
  rows per process (the process with the tree trains ~7x more rows than its per-device size, the other pads with
  empty filler rows, and forwards hold at most ``rows_per_forward`` rows). Records the logged loss and gradient
  norm, which must equal the 1-process run's.
- ``truncated``: the ``spanning`` setting with ``mask_truncated_completions=True``, ``num_iterations=2`` and
  ``beta=0.1``; every other rollout (base or branch) ends without EOS, so truncated base rollouts keep the blocks
  valued by finished leaves (decided from the gathered tree) and get their old/reference log-probs rescored.

Writes one ``rank<N>.json`` file per process with every training row of every step.
"""

import json
import os
import sys

import torch
from datasets import Dataset

from trl_credit import DATPOConfig, DATPOTrainer
from trl_credit.models import load_default_embedder
from trl_credit.tasks.data import make_arithmetic_dataset


def prompt_keyed_reward(completions, answer, completion_ids, **kwargs):
    return [1.0 if int(a) % 2 == 0 else 0.5 * (sum(ids) % 2) for a, ids in zip(answer, completion_ids)]


class DeterministicDATPOTrainer(DATPOTrainer):
    def __init__(self, *args, **kwargs):
        self.rows = []
        self.branch_counts = []
        self.generated = []  # branch rows this process generated, per step
        super().__init__(*args, **kwargs)

    def _fake_completion(self, seed: int) -> list[int]:
        vocab = len(self._tokenizer)
        length = 6 + seed % 5
        ids = [3 + (seed * 31 + k * 17) % (vocab - 3) for k in range(length)]
        if self.args.mask_truncated_completions and seed % 2:
            return ids  # truncated: no EOS
        return ids + [self._tokenizer.eos_token_id]

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        completions = []
        if not self._datpo_branching:  # phase 1: base rollouts, seeded by the row's global index
            first = self.accelerator.process_index * len(prompt_ids)
            for r, prompt in enumerate(prompt_ids):
                completions.append(self._fake_completion(hash((tuple(prompt), first + r)) % 100003))
        else:  # phase 2: branches, seeded by the prefix and its occurrence (B̂ identical prefixes per fork)
            assert num_generations > 0 and len(prompt_ids) % num_generations == 0
            # the B̂ rows of a fork are consecutive: rows sharing a prefix come in runs of num_generations
            assert all(prompt_ids[k] == prompt_ids[k - k % num_generations] for k in range(len(prompt_ids)))
            self.generated[-1] += sum(1 for p in prompt_ids if len(p) > 1)  # filler forks are one token
            seen = {}
            for prompt in prompt_ids:
                key = tuple(prompt)
                seen[key] = seen.get(key, 0) + 1
                completions.append(self._fake_completion(hash((key, seen[key])) % 100003))
        return completions, None

    def _generate_and_score_completions(self, inputs):
        self.generated.append(0)
        output = super()._generate_and_score_completions(inputs)
        step_rows = []
        for r in range(output["completion_ids"].size(0)):
            mask = output["completion_mask"][r].bool()
            if not mask.any():  # an empty row that evens out the row counts across processes
                continue
            step_rows.append([
                output["prompt_ids"][r][output["prompt_mask"][r].bool()].tolist(),
                output["completion_ids"][r][mask].tolist(),
                output["advantages"][r][mask].tolist(),
                *[output[key][r][mask].tolist() for key in ("old_per_token_logps", "ref_per_token_logps")
                  if key in output],
            ])
        self.rows.append(step_rows)
        self.branch_counts.append(len(step_rows) - len(inputs))
        return output


LOSS_TYPES = ("grpo", "dr_grpo", "sapo", "luspo", "bnpo", "dapo", "cispo")
# (name, loss_type, rows_per_forward): each micro-batch in one forward (the filler rows share it with the real
# ones), and two loss types again with forwards of at most per_device_train_batch_size rows (DDP no_sync pieces)
LOSS_RUNS = [(t, t, 1000) for t in LOSS_TYPES] + [("grpo/pieces", "grpo", None), ("dapo/pieces", "dapo", None)]


def run_loss_types(model_dir, out_dir, world):
    results = {}
    for name, loss_type, rows_per_forward in LOSS_RUNS:
        trainer = run("loss_" + name.replace("/", "_"), model_dir, out_dir, 8 // world, 2, 1, world,
                      loss_type=loss_type, rows_per_forward=rows_per_forward, use_diversity=False, return_trainer=True)
        log = next(x for x in trainer.state.log_history if "loss" in x)
        results[name] = {"loss": log["loss"], "grad_norm": log["grad_norm"]}
    return results


def run_truncated(model_dir, out_dir, world):
    return run("truncated", model_dir, out_dir, 4 // world, 1, 1, world, use_diversity=False,
               mask_truncated_completions=True, num_iterations=2, beta=0.1)


def run(name, model_dir, out_dir, per_device, prompts, steps, world, return_trainer=False, use_diversity=True, **extra):
    data = make_arithmetic_dataset(num_train=16, num_test=2, seed=0)["train"]
    even = next(r for r in data if int(r["answer"]) % 2 == 0)
    odd = next(r for r in data if int(r["answer"]) % 2 == 1)
    dataset = Dataset.from_list([even, odd] if prompts == 2 else [odd])
    args = DATPOConfig(
        output_dir=f"{out_dir}/{name}", per_device_train_batch_size=per_device, num_generations=4,
        max_completion_length=12, max_steps=steps, learning_rate=1e-3, report_to="none", use_cpu=True,
        save_strategy="no", logging_steps=1, fork_method="fixed_seg", seed=0, use_diversity=use_diversity, **extra,
    )
    trainer = DeterministicDATPOTrainer(
        model=model_dir, reward_funcs=prompt_keyed_reward, args=args, train_dataset=dataset,
        embedder=load_default_embedder(device="cpu") if use_diversity else None,
    )
    trainer.train()
    if return_trainer:
        return trainer
    return {"steps": trainer.state.global_step, "rows": trainer.rows, "branch_counts": trainer.branch_counts,
            "generated": trainer.generated}


def main(model_dir: str, out_dir: str):
    torch.manual_seed(0)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    result = {
        "rank": rank,
        "world": world,
        "one_sided": run("one_sided", model_dir, out_dir, 8 // world, 2, 2, world),
        "spanning": run("spanning", model_dir, out_dir, 4 // world, 1, 1, world),
        "loss_types": run_loss_types(model_dir, out_dir, world),
        "truncated": run_truncated(model_dir, out_dir, world),
    }
    # One file per rank: the two processes' stdout lines can interleave.
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as report:
        json.dump(result, report)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, sys.argv[1], sys.argv[2])
