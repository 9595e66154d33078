"""Warm-start SmolLM2-135M-Instruct on the ``chain`` task so that RL has material (docs/testbed.md).

The base model almost never boxes its answer (~0% ``accuracy_reward`` on the arithmetic task) and was never taught
the one-step-per-line format, so it gives the RL methods nothing to work with on the chain task. A short supervised fine-tune (TRL's ``SFTTrainer``, LoRA merged into the weights) on programmatically
written solutions of the train split, both solution structures, teaches the format; deliberately short, so that
the model stays far from perfect (held-out pass@1 in the RL-useful band) and makes its errors inside the chain.

    python -m trl_credit.testbed.warm_start [--results benchmarks/results/warm_start_chain.json]

builds :data:`trl_credit.models.CHAIN_MODEL` in the cache (deterministic in ``--seed`` on a CPU), evaluates it on
held-out problems and prints pass@1, mean steps per answer and the distribution of the first wrong step.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass

from trl_credit.models import DEFAULT_MODEL, chain_loc_model_path, chain_model_path, resolve_model_path
from trl_credit.tasks.chain import check_steps, make_chain_dataset, parse_question, solution_text
from trl_credit.tasks.rewards import accuracy_reward

__all__ = ["WarmStartConfig", "sft_dataset", "build_chain_model", "evaluate_chain_model", "main"]


@dataclass
class WarmStartConfig:
    """Settings of the warm start; the defaults build :data:`~trl_credit.models.CHAIN_MODEL`."""

    seed: int = 0
    data_seed: int = 0
    num_examples: int = 160
    epochs: float = 2.0
    learning_rate: float = 1e-3
    batch_size: int = 8
    lora_r: int = 32
    #: Localization examples added to the mix (trl_credit.testbed.warm_start_localization); > 0 builds CHAIN_LOC_MODEL.
    localization_examples: int = 0
    #: The model fine-tuned (a name of trl_credit.models or a path); CHAIN_MODEL makes a second, shorter stage.
    init_model: str = DEFAULT_MODEL

    def __post_init__(self):
        if self.num_examples < 1 or self.epochs <= 0 or self.learning_rate <= 0 or self.batch_size < 1:
            raise ValueError(f"num_examples, epochs, learning_rate and batch_size must be positive, got {self}")
        if self.localization_examples < 0:
            raise ValueError(f"localization_examples must be >= 0, got {self.localization_examples}")


def sft_dataset(num_examples: int, data_seed: int = 0, localization_examples: int = 0):
    """Prompt-completion chat rows of the first ``num_examples`` train problems; a distributive problem is solved
    term by term or factored with equal probability (seeded), so the model learns both structures. Then
    ``localization_examples`` SRPO localization requests answered ``\\boxed{k}``, on the train problems after those
    (:func:`~trl_credit.testbed.warm_start_localization.localization_examples`)."""
    from datasets import Dataset

    extra = 4 * localization_examples  # a few injections fail the checker's test and move on to the next problem
    rows = make_chain_dataset(num_train=num_examples + extra, seed=data_seed)["train"]
    rng = random.Random(data_seed)
    prompts, completions = [], []
    for prompt, question in zip(rows["prompt"][:num_examples], rows["question"][:num_examples]):
        structure = rng.choice(["term", "factored"])
        prompts.append(prompt)
        completions.append([{"role": "assistant", "content": solution_text(parse_question(question), structure)}])
    if localization_examples:
        from trl_credit.testbed.warm_start_localization import localization_examples as make_examples

        for example in make_examples(rows[num_examples:], localization_examples, seed=data_seed):
            prompts.append(example["prompt"])
            completions.append(example["completion"])
    return Dataset.from_dict({"prompt": prompts, "completion": completions})


def _weights_digest(model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def build_chain_model(
    config: WarmStartConfig | None = None, output_dir: str | None = None, trainer_dir: str | None = None, **sft_overrides
) -> dict:
    """Fine-tune the offline SmolLM2 on :func:`sft_dataset` with LoRA, merge, save to ``output_dir`` (default: the
    cache folder of :data:`~trl_credit.models.CHAIN_MODEL`, or of ``CHAIN_LOC_MODEL`` with localization examples).
    ``sft_overrides`` replace ``SFTConfig`` arguments;
    ``trainer_dir`` keeps the trainer's own folder (checkpoints, if ``save_strategy`` asks for them), which is
    removed otherwise.
    Returns ``{"path", "train_seconds", "train_loss", "weights_sha256", "config"}``."""
    import torch
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    config = config or WarmStartConfig()
    output_dir = output_dir or (chain_loc_model_path if config.localization_examples else chain_model_path)(False)
    base = resolve_model_path(config.init_model)
    tmp = output_dir.rstrip("/") + ".tmp"
    keep_trainer_dir = trainer_dir is not None
    # A batch of 8 localization prompts (~430 tokens) peaked at ~12 GB and was OOM-killed on a 23 GB machine: with
    # localization examples, two accumulated half batches (same effective batch, same gradient up to rounding).
    split = 2 if config.localization_examples and config.batch_size % 2 == 0 else 1
    trainer_dir = trainer_dir or tmp + "-trainer"
    settings = dict(
        output_dir=trainer_dir,
        num_train_epochs=config.epochs,
        learning_rate=config.learning_rate,
        per_device_train_batch_size=config.batch_size // split,
        gradient_accumulation_steps=split,
        lr_scheduler_type="linear",
        warmup_steps=0,
        seed=config.seed,
        data_seed=config.seed,
        logging_steps=5,
        save_strategy="no",
        report_to="none",
        max_length=640 if config.localization_examples else 256,  # a localization prompt is ~400 tokens
        # with localization examples (~430 tokens vs ~135), batches of like lengths save most of the padding
        train_sampling_strategy="group_by_length" if config.localization_examples else "random",
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        activation_checkpointing=False,  # short sequences, tiny model: memory is not the limit, time is
        model_init_kwargs={"dtype": "float32"},
    )
    args = SFTConfig(**{**settings, **sft_overrides})
    peft_config = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_r,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        task_type="CAUSAL_LM",
    )
    tokenizer = AutoTokenizer.from_pretrained(base)
    trainer = SFTTrainer(
        model=base,
        args=args,
        train_dataset=sft_dataset(config.num_examples, config.data_seed, config.localization_examples),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    model = trainer.model.merge_and_unload()
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {"train_seconds": round(seconds, 1), "train_loss": result.training_loss,
            "weights_sha256": _weights_digest(model), "config": asdict(config)}
    with open(os.path.join(tmp, "warm_start.json"), "w") as handle:
        json.dump(info, handle, indent=2)
    if os.path.exists(output_dir):
        shutil.rmtree(output_dir)
    os.replace(tmp, output_dir)
    if not keep_trainer_dir:
        shutil.rmtree(trainer_dir, ignore_errors=True)
    return {"path": output_dir, **info}


def evaluate_chain_model(
    model_name_or_path: str,
    num_problems: int = 64,
    num_samples: int = 4,
    temperature: float = 0.7,
    top_p: float = 0.95,
    max_new_tokens: int = 160,
    data_seed: int = 0,
    seed: int = 0,
) -> dict:
    """Sample held-out test problems and check every step: pass@1 (boxed answer, ``accuracy_reward``), strict
    pass@1 (no wrong step), mean steps per answer, the first-wrong-step distribution and its reasons, and which
    structure the distributive problems are solved with."""
    from trl_credit.evaluation.evaluate import load_model_and_tokenizer, sample_completions

    test = make_chain_dataset(num_train=0, num_test=num_problems, seed=data_seed)["test"]
    model, tokenizer = load_model_and_tokenizer(resolve_model_path(model_name_or_path))
    start = time.perf_counter()
    samples = sample_completions(
        model, tokenizer, test["prompt"], num_samples, temperature=temperature, top_p=top_p,
        max_new_tokens=max_new_tokens, seed=seed, progress=False,
    )
    seconds = time.perf_counter() - start
    rewards, steps, first_wrong, reasons, structures, relative = [], [], Counter(), Counter(), Counter(), []
    examples = []
    for question, answer, group in zip(test["question"], test["answer"], samples):
        problem = parse_question(question)
        for sample in group:
            text = sample["text"]
            reward = accuracy_reward([text], [answer])[0]
            verdict = check_steps(question, text)
            rewards.append(reward)
            steps.append(verdict.num_steps)
            if verdict.step is not None:
                first_wrong[verdict.step] += 1
                reasons[verdict.reason] += 1
                relative.append(verdict.step / max(verdict.num_steps + 1, 1))
                if len(examples) < 3 and verdict.reason in ("arithmetic", "off path", "unknown number"):
                    examples.append({"question": question, "completion": text, "first_wrong_step": verdict.step,
                                     "reason": verdict.reason})
            if problem.distributive and verdict.num_steps:
                first_line = text.strip().splitlines()[0].replace(" ", "")
                _, op, b, c = problem.core
                structures["factored" if first_line.startswith((f"{b}{op}{c}=", f"{c}{op}{b}=")) else "term"] += 1
    total = len(rewards)
    wrong = sum(first_wrong.values())
    return {
        "model": model_name_or_path,
        "num_problems": num_problems,
        "num_samples": num_samples,
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "pass@1": sum(rewards) / total,
        "pass@1_all_steps_right": (total - wrong) / total,
        "mean_steps_per_answer": sum(steps) / total,
        "first_wrong_step": {str(k): first_wrong[k] for k in sorted(first_wrong)},
        "first_wrong_reason": dict(reasons.most_common()),
        "first_wrong_step_relative_mean": sum(relative) / len(relative) if relative else None,
        "wrong_on_first_step": first_wrong[1] / wrong if wrong else None,
        "distributive_structure": dict(structures),
        "sampling_seconds": round(seconds, 1),
        "examples": examples,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = WarmStartConfig()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name}", type=type(value), default=value)
    parser.add_argument("--output_dir", default=None, help="Default: the cache folder of 'smollm2-135m-chain' "
                        "('smollm2-135m-chain-loc' with --localization_examples).")
    parser.add_argument("--results", default=None, help="Write build + evaluation numbers as JSON here.")
    parser.add_argument("--num_problems", type=int, default=64)
    parser.add_argument("--num_samples", type=int, default=4)
    parser.add_argument("--evaluate_base", action="store_true", help="Also evaluate the base model on the task.")
    parser.add_argument("--skip_build", action="store_true", help="Only evaluate an already built model.")
    args = parser.parse_args(argv)
    config = WarmStartConfig(**{name: getattr(args, name) for name in asdict(defaults)})
    if args.skip_build:
        path = args.output_dir or (chain_loc_model_path if config.localization_examples else chain_model_path)()
        with open(os.path.join(path, "warm_start.json")) as handle:
            build = {"path": path, **json.load(handle)}
    else:
        build = build_chain_model(config, args.output_dir)
    print(f"built {build['path']} in {build['train_seconds']} s (train loss {build['train_loss']:.3f})")
    report = {"build": build, "warm_start": evaluate_chain_model(
        build["path"], args.num_problems, args.num_samples, data_seed=config.data_seed)}
    if args.evaluate_base:
        report["base"] = evaluate_chain_model(DEFAULT_MODEL, args.num_problems, args.num_samples,
                                              data_seed=config.data_seed)
    for name in ("warm_start", "base"):
        if name in report:
            r = report[name]
            print(f"{name}: pass@1 {r['pass@1']:.3f} (all steps right {r['pass@1_all_steps_right']:.3f}), "
                  f"{r['mean_steps_per_answer']:.2f} steps/answer, first wrong step {r['first_wrong_step']}, "
                  f"reasons {r['first_wrong_reason']}, structures {r['distributive_structure']}")
    write_report(args.results, report)
    return report


def write_report(path: str | None, report: dict) -> None:
    """Write a results JSON (``--results``), creating its folder; nothing when ``path`` is None."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
