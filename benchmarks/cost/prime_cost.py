"""Question: What does PRIME (``credit="implicit_prm"``) cost over GRPO?

PRIME's cost over GRPO, side by side in one run: step time and the extra weights it
holds (the PRM, its AdamW states, its reference), with and without LoRA, on tests/tiny.py's model (or SmolLM2 with
``--model smollm2``). Each round runs every variant for ``--steps`` steps after one warm-up step, in a rotated order;
the ratios are per round (PRIME's mean step time over GRPO's in the same round, same LoRA setting), reported as their
median and range over rounds. Results: docs/process.md ("Cost over GRPO").

    python benchmarks/cost/prime_cost.py --rounds 3 --steps 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _model_path(name: str) -> str:
    if name == "tiny":
        from tests.tiny import build_tiny_model

        return build_tiny_model(tempfile.mkdtemp(prefix="prime_cost_"))
    from trl_credit.models import default_model_path

    return default_model_path()


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def run_variant(model_path: str, credit: str, lora: bool, steps: int, seed: int, completion_length: int) -> dict:
    from transformers import TrainerCallback

    from trl_credit import CreditConfig
    from trl_credit.core.trainer import CreditTrainer
    from trl_credit.tasks.chain import chain_format_reward, make_chain_dataset
    from trl_credit.tasks.rewards import accuracy_reward

    args = CreditConfig(output_dir=tempfile.mkdtemp(prefix="prime_cost_run_"), credit=credit,
                        per_device_train_batch_size=8, num_generations=4, max_completion_length=completion_length,
                        max_steps=steps + 1, learning_rate=1e-5, report_to="none", use_cpu=True, bf16=False,
                        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=seed)
    kwargs = {}
    if lora:
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    trainer = CreditTrainer(model_path, [accuracy_reward, chain_format_reward], args=args,
                            train_dataset=make_chain_dataset(num_train=64, num_test=2, seed=seed)["train"], **kwargs)
    stamps = []

    class Stamp(TrainerCallback):
        def on_step_end(self, *unused, **kwargs):
            stamps.append(time.perf_counter())

    trainer.add_callback(Stamp())
    start = time.perf_counter()
    trainer.train()
    times = [b - a for a, b in zip([start, *stamps], stamps)][1:]  # the first step warms up
    extra = 0
    if credit == "implicit_prm":
        prm = trainer.credit.prm
        state = [v for s in prm.optimizer.state.values() for v in s.values() if hasattr(v, "numel") and v.dim()]
        extra = _bytes(prm.parameters) + _bytes(state)
        if prm.reference is not None and prm.reference is not getattr(trainer, "ref_model", None):
            extra += _bytes(prm.reference.parameters())
    policy = _bytes(p for p in trainer.model.parameters())
    return {"step": statistics.mean(times), "extra_bytes": extra, "policy_bytes": policy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--max-completion-length", type=int, default=48)
    options = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    path = _model_path(options.model)
    variants = [("outcome", False), ("implicit_prm", False), ("outcome", True), ("implicit_prm", True)]
    ratios = {False: [], True: []}
    extra = {}
    for round_index in range(options.rounds):
        order = variants[round_index % 4:] + variants[:round_index % 4]
        results = {v: run_variant(path, *v, options.steps, round_index, options.max_completion_length) for v in order}
        for lora in (False, True):
            ratios[lora].append(results[("implicit_prm", lora)]["step"] / results[("outcome", lora)]["step"])
            prime = results[("implicit_prm", lora)]
            extra[lora] = prime["extra_bytes"] / prime["policy_bytes"]
        print(f"round {round_index}: " + ", ".join(f"{c}{' LoRA' if l else ''} {r['step']:.3f} s/step"
                                                   for (c, l), r in results.items()), flush=True)
    for lora in (False, True):
        values = ratios[lora]
        print(f"{'LoRA' if lora else 'full'}: PRIME / GRPO step time median {statistics.median(values):.2f} "
              f"(range {min(values):.2f}-{max(values):.2f}, {len(values)} rounds); extra weights and optimizer "
              f"state {extra[lora]:.3f} x the policy's parameters")


if __name__ == "__main__":
    main()
