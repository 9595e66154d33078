"""Repeated-sampling evaluation: pass@k, AUC@K, avg@k and maj@k of a model on a dataset (docs/design.md#answer-checking).

Run ``python -m trl_credit.evaluation.evaluate --help`` (console script ``trl-credit-eval``). The pipeline has three parts,
usable on their own:

1. :func:`sample_completions` — n sampled completions per prompt with batched HF ``generate`` (needs a model;
   :mod:`trl_credit.evaluation.sampling`, re-exported here).
2. :func:`score_completions` — rewards and voting keys per completion (pure; no model).
3. :func:`build_report` — metrics from per-problem correctness (pure), then :func:`write_report` writes the JSON
   report and :func:`plot_pass_at_k` the PNG curve.

Protocol as in Cue-GRPO Appendix C: n i.i.d. samples per problem, unbiased pass@k from the per-problem count of
correct samples, AUC@K over the budgets {1,4,8,16,32,64,128,256} ∩ [1, K]. avg@k and maj@k are unbiased over all
n samples too (the expectation over random k-subsets): avg@k = c/n for every k, maj@k exact with random tie-breaking.

Sampling defaults (temperature 0.7, top-p 1.0, 64 new tokens) are the setting of the README's base-accuracy table
(``benchmarks/learning/base_accuracy.py``, :mod:`trl_credit.tasks.data`), so a default evaluation of a model trained on the
built-in task is comparable with that table. Long-form tasks need a larger ``max_new_tokens``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from trl_credit.evaluation.metrics import AUC_BUDGETS, MAJ_MAX_SAMPLES, auc_at_k, maj_at_ks, majority_answer, mean_pass_at_k
from trl_credit.tasks.data import BUILTIN_DATASET, CHAIN_DATASET
from trl_credit.tasks.rewards import (
    accuracy_reward,
    completion_text,
    extract_final_answer,
    extract_final_number,
    final_number_reward,
    math_verify_reward,
    normalize_answer,
)
from trl_credit.evaluation.sampling import EVAL_MAX_NEW_TOKENS, EVAL_TEMPERATURE, load_model_and_tokenizer, sample_completions

__all__ = [
    "EVAL_MAX_NEW_TOKENS",
    "EVAL_TEMPERATURE",
    "REWARDS",
    "report_budgets",
    "answer_key",
    "score_completions",
    "build_report",
    "write_report",
    "plot_pass_at_k",
    "load_model_and_tokenizer",
    "load_problems",
    "sample_completions",
    "evaluate",
    "format_summary",
    "main",
]


#: Answer checkers selectable with ``--reward`` (TRL reward-function signature, binary 0/1 rewards).
REWARDS: dict[str, Callable[..., list[float]]] = {
    "accuracy": accuracy_reward,
    "final_number": final_number_reward,
    "math_verify": math_verify_reward,
}


def report_budgets(num_samples: int) -> list[int]:
    """The k at which the report gives pass@k/avg@k/maj@k: the AUC budgets up to n, plus n itself."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    budgets = [k for k in AUC_BUDGETS if k <= num_samples]
    if budgets[-1] != num_samples:
        budgets.append(num_samples)
    return budgets


def answer_key(text: str, reward: str) -> str | None:
    """The answer a completion votes for in maj@k: what ``reward`` compares with the reference.

    ``final_number``: the canonical final number; ``accuracy``/``math_verify``: the normalized extracted answer
    (so for ``math_verify``, equivalent spellings like ``0.5`` and ``\\frac{1}{2}`` vote separately).
    None when there is no answer.
    """
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {sorted(REWARDS)}, got {reward!r}")
    if reward == "final_number":
        return extract_final_number(text)
    return normalize_answer(extract_final_answer(text)) or None


def score_completions(
    completions: Sequence[Sequence[Any]], answers: Sequence[Any], reward: str = "accuracy"
) -> list[dict]:
    """Check every completion against its problem's reference answer.

    ``completions[p]`` holds problem p's samples (strings or chat message lists), ``answers[p]`` its reference.
    Returns one dict per problem: ``correct`` (list of bool; reward > 0.5 counts as correct) and ``answers``
    (the voting key of each sample, see :func:`answer_key`). maj@k needs one verdict per voting key; should the
    reward judge two samples with the same key differently (``math_verify`` parses the raw answer, the key is its
    normalized form), the key gets the suffix " (correct)" / " (wrong)" so that they vote as different answers.
    """
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {sorted(REWARDS)}, got {reward!r}")
    if len(completions) != len(answers):
        raise ValueError(f"got completions for {len(completions)} problems but {len(answers)} reference answers")
    reward_fn = REWARDS[reward]
    scored = []
    for samples, reference in zip(completions, answers):
        samples = list(samples)
        rewards = reward_fn(samples, answer=[reference] * len(samples)) if samples else []
        correct = [reward_value > 0.5 for reward_value in rewards]
        keys = [answer_key(completion_text(sample), reward) for sample in samples]
        mixed = {key for key in keys if key is not None and len({c for k, c in zip(keys, correct) if k == key}) > 1}
        keys = [f"{key} ({'correct' if c else 'wrong'})" if key in mixed else key for key, c in zip(keys, correct)]
        scored.append({"correct": correct, "answers": keys})
    return scored


def build_report(problems: Sequence[dict], settings: dict | None = None) -> dict:
    """Metrics of a repeated-sampling evaluation from per-problem results (pure function).

    Each problem dict needs ``correct`` (list of bool, one per sample; every problem the same number n of
    samples) and may have ``answers`` (voting keys, for maj@k) and any metadata (``question``, ``answer``...),
    which is copied into the per-problem list. Returns a JSON-ready dict:

    - ``pass_at_k``: unbiased pass@k averaged over problems (Cue-GRPO Eq. 10) for k in :func:`report_budgets`;
    - ``auc_at_k``: AUC@K (Eq. 9) for every budget K in {4,...,256} with K <= n;
    - ``avg_at_k``: the expected accuracy of k samples drawn from the n, which is c/n for every k (the sampled
      accuracy, = pass@1; :func:`~trl_credit.evaluation.metrics.avg_at_k`); ``maj_at_k`` (when ``answers`` are given): the
      probability that the majority vote of k samples drawn from the n is correct, ties broken uniformly at random
      (:func:`~trl_credit.evaluation.metrics.maj_at_k`; up to 1000 samples per problem, else left out with a warning);
      ``accuracy``: mean over all samples;
    - ``problems``: per-problem ``num_correct``/``num_samples`` (+ metadata); ``settings`` as given.
    Keys of the per-k dicts are strings (JSON object keys).
    """
    if not problems:
        raise ValueError("build_report needs at least one problem")
    sample_counts = {len(p["correct"]) for p in problems}
    if len(sample_counts) != 1:
        raise ValueError(f"every problem must have the same number of samples, got counts {sorted(sample_counts)}")
    num_samples = sample_counts.pop()
    if num_samples < 1:
        raise ValueError("every problem needs at least one sample")
    has_answers = all("answers" in p for p in problems)
    budgets = report_budgets(num_samples)
    num_correct = [sum(bool(x) for x in p["correct"]) for p in problems]

    pass_by_k = {k: mean_pass_at_k(num_samples, num_correct, k) for k in budgets}
    auc = {K: auc_at_k(pass_by_k, K) for K in AUC_BUDGETS if 4 <= K <= num_samples}
    accuracy = sum(num_correct) / (num_samples * len(problems))
    avg = {k: accuracy for k in budgets}  # unbiased avg@k: c/n of each problem for every k, averaged
    report: dict[str, Any] = {
        "settings": dict(settings or {}),
        "num_problems": len(problems),
        "num_samples": num_samples,
        "accuracy": accuracy,
        "pass_at_k": {str(k): v for k, v in pass_by_k.items()},
        "auc_at_k": {str(k): v for k, v in auc.items()},
        "avg_at_k": {str(k): v for k, v in avg.items()},
    }
    if has_answers and num_samples > MAJ_MAX_SAMPLES:
        warnings.warn(f"maj@k is left out of the report: it is computed for up to {MAJ_MAX_SAMPLES} samples per "
                      f"problem, got {num_samples}", stacklevel=2)
    elif has_answers:
        curves = [maj_at_ks(p["answers"], p["correct"]) for p in problems]
        report["maj_at_k"] = {str(k): sum(curve[k - 1] for curve in curves) / len(curves) for k in budgets}
    per_problem = []
    for index, (problem, count) in enumerate(zip(problems, num_correct)):
        entry = {"index": index, "num_correct": count, "num_samples": num_samples}
        entry.update({key: value for key, value in problem.items() if key not in ("correct", "answers")})
        if has_answers:
            winner = majority_answer(problem["answers"])
            entry["majority_answer"] = None if winner is None else problem["answers"][winner]
        per_problem.append(entry)
    report["problems"] = per_problem
    return report


def write_report(report: dict, path: str) -> str:
    """Write ``report`` as indented JSON to ``path`` (parent folders created); returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    return path


def plot_pass_at_k(report: dict, path: str, title: str | None = None, base: dict | None = None) -> str:
    """Save the pass@k curve of ``report`` (and avg@k/maj@k for reference) as a PNG; returns the path. ``base``: the
    base model's report on the same problems (``--compare_base``), whose pass@k and avg@k are drawn beside them.

    The k axis is log2-scaled for readability; AUC@K itself is computed on the linear k axis (Eq. 9).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display needed; must precede pyplot import
    import matplotlib.pyplot as plt

    ks = [int(k) for k in report["pass_at_k"]]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.plot(ks, [100 * report["pass_at_k"][str(k)] for k in ks], marker="o", label="pass@k")
    if "maj_at_k" in report:
        ax.plot(ks, [100 * report["maj_at_k"][str(k)] for k in ks], marker="s", linestyle="--", label="maj@k")
    ax.plot(ks, [100 * report["avg_at_k"][str(k)] for k in ks], marker="^", linestyle=":", label="avg@k")
    auc = dict(report.get("auc_at_k", {}))
    if base is not None:
        base_ks = [k for k in ks if str(k) in base["pass_at_k"]]  # the same n: the same budgets
        ax.plot(base_ks, [100 * base["pass_at_k"][str(k)] for k in base_ks], marker="o", color="grey",
                label="pass@k (base)")
        ax.plot(base_ks, [100 * base["avg_at_k"][str(k)] for k in base_ks], marker="^", linestyle=":",
                color="grey", label="avg@k (base)")
        auc = {**{f"{K}": v for K, v in auc.items()},
               **{f"{K} base": v for K, v in base.get("auc_at_k", {}).items()}}
    if len(ks) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_ylim(0, 100)
    ax.set_xlabel("k (samples)")
    ax.set_ylabel("%")
    auc_text = ", ".join(f"AUC@{K}={100 * v:.2f}" for K, v in auc.items())
    heading = title or f"{report['num_problems']} problems, n={report['num_samples']}"
    ax.set_title(heading + (f"\n{auc_text}" if auc_text else ""), fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------------------
# Problems and the whole run (sampling: trl_credit.evaluation.sampling)
# --------------------------------------------------------------------------------------------------------------


def load_problems(
    dataset: str | None = "arithmetic",
    dataset_config: str | None = None,
    split: str = "test",
    prompt_column: str = "prompt",
    answer_column: str = "answer",
    num_problems: int | None = None,
    rollout_template: str | None = None,
    **builtin_kwargs,
) -> tuple[list, list]:
    """``(prompts, answers)`` of the evaluation problems.

    ``"arithmetic"`` (default) is the built-in task's test split (``builtin_kwargs`` go to
    :func:`trl_credit.tasks.data.make_arithmetic_dataset`: ``digits``, ``num_operands``, ``operators``, ``seed``,
    ``instruction``...), by default its whole test split; ``"chain"`` the chain task's
    (:func:`trl_credit.tasks.chain.make_chain_dataset`, by default its 200 test problems, ``seed``...). Their first m
    problems are the first m of every larger test split with the same settings, whatever the train split. Any
    other name is loaded with ``datasets.load_dataset(dataset, dataset_config, split=split)``. Prompts are chat
    message lists or plain strings; ``num_problems`` keeps the first that many.

    ``rollout_template`` (SRPO's presets ``thought_mdp``, ``lines``, ``none`` or a template with ``{question}``)
    wraps each question as ``SRPOConfig.rollout_template`` does at training time: evaluate an SRPO/RRPO model on
    the prompt it was trained on. None (default) leaves the dataset prompts as they are, which is what GRPO,
    Cue-GRPO, OPPO and DATPO train on.
    """
    if num_problems is not None and num_problems < 1:
        raise ValueError(f"num_problems must be >= 1 (or None for all), got {num_problems}")
    if dataset in (None, "", BUILTIN_DATASET, CHAIN_DATASET):
        from trl_credit.tasks.data import load_task_dataset

        if num_problems is not None:
            builtin_kwargs["num_test"] = num_problems  # the first m of any test split with the same settings
        rows = load_task_dataset(dataset or BUILTIN_DATASET, num_train=0, **builtin_kwargs)["test"]
    else:
        if builtin_kwargs:
            raise ValueError(f"{sorted(builtin_kwargs)} only apply to the built-in datasets "
                             f"'{BUILTIN_DATASET}' and '{CHAIN_DATASET}'")
        from datasets import load_dataset

        rows = load_dataset(dataset, dataset_config, split=split)
    for name, column in (("prompt_column", prompt_column), ("answer_column", answer_column)):
        if column not in rows.column_names:
            raise ValueError(f"{name}={column!r} is not a column of the dataset; columns: {rows.column_names}")
    if num_problems is not None:
        rows = rows.select(range(min(num_problems, len(rows))))
    prompts = list(rows[prompt_column])
    if rollout_template is not None:
        from trl_credit.srpo.prompts import resolve_rollout_template, wrap_prompt

        template = resolve_rollout_template(rollout_template)  # raises naming the accepted values
        prompts = [wrap_prompt(prompt, template) for prompt in prompts]
    return prompts, [None if a is None else str(a) for a in rows[answer_column]]


def evaluate(
    model: str | None = None,
    adapter: str | None = None,
    dataset: str | None = "arithmetic",
    dataset_config: str | None = None,
    split: str = "test",
    prompt_column: str = "prompt",
    answer_column: str = "answer",
    num_problems: int | None = None,
    builtin_kwargs: dict | None = None,
    rollout_template: str | None = None,
    reward: str | None = None,
    num_samples: int = 16,
    batch_size: int = 64,
    temperature: float = EVAL_TEMPERATURE,
    top_p: float = 1.0,
    max_new_tokens: int = EVAL_MAX_NEW_TOKENS,
    seed: int = 0,
    dtype: str = "auto",
    device: str | None = None,
    output_dir: str | None = "eval_results",
    save_completions: bool = False,
    progress: bool = True,
) -> dict:
    """Sample, score and report (see the module docstring). Writes ``report.json`` and ``pass_at_k.png``
    (and ``completions.jsonl`` with ``save_completions``) into ``output_dir`` unless it is None; returns the report.

    ``reward`` None picks ``final_number`` for the built-in arithmetic task and ``accuracy`` otherwise (the chain
    task included). ``rollout_template``: see :func:`load_problems`.
    """
    builtin = dataset in (None, "", BUILTIN_DATASET, CHAIN_DATASET)
    reward = reward or ("final_number" if dataset in (None, "", BUILTIN_DATASET) else "accuracy")
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {sorted(REWARDS)}, got {reward!r}")
    prompts, answers = load_problems(
        dataset, dataset_config, split, prompt_column, answer_column, num_problems, rollout_template,
        **(builtin_kwargs or {}),
    )
    lm, tokenizer = load_model_and_tokenizer(model, adapter, dtype=dtype, device=device)
    samples = sample_completions(
        lm, tokenizer, prompts, num_samples, batch_size=batch_size, temperature=temperature, top_p=top_p,
        max_new_tokens=max_new_tokens, seed=seed, progress=progress,
    )
    scored = score_completions([[s["text"] for s in per] for per in samples], answers, reward)
    problems = []
    for prompt, reference, per, score in zip(prompts, answers, samples, scored):
        question = prompt if isinstance(prompt, str) else next(
            (m.get("content") for m in reversed(list(prompt)) if m.get("role") == "user"), None
        )
        problems.append(
            {
                **score,
                "prompt": question,
                "answer": reference,
                "mean_completion_tokens": sum(s["num_tokens"] for s in per) / len(per),
            }
        )
    all_samples = [s for per in samples for s in per]
    settings = {
        "model": model or "smollm2-135m-instruct-offline",
        "adapter": adapter,
        "dataset": dataset or "arithmetic",
        "dataset_config": dataset_config,
        "split": split if not builtin else "test",
        "builtin_kwargs": (builtin_kwargs or {}) if builtin else None,
        "rollout_template": rollout_template,
        "num_problems": len(prompts),
        "reward": reward,
        "num_samples": num_samples,
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": max_new_tokens,
        "batch_size": batch_size,
        "seed": seed,
        "dtype": dtype,
        "device": str(lm.device),
    }
    report = build_report(problems, settings)
    report["mean_completion_tokens"] = sum(s["num_tokens"] for s in all_samples) / len(all_samples)
    report["truncated_fraction"] = sum(not s["stopped"] for s in all_samples) / len(all_samples)
    if output_dir is not None:
        report["files"] = {
            "report": write_report(report, os.path.join(output_dir, "report.json")),
        }
        report["files"]["plot"] = plot_pass_at_k(report, os.path.join(output_dir, "pass_at_k.png"))
        if save_completions:
            path = os.path.join(output_dir, "completions.jsonl")
            with open(path, "w") as f:
                for index, (per, score) in enumerate(zip(samples, scored)):
                    for sample, correct in zip(per, score["correct"]):
                        f.write(json.dumps({"problem": index, "correct": correct, **sample}) + "\n")
            report["files"]["completions"] = path
        write_report(report, report["files"]["report"])  # again, now listing the files
    return report


def format_summary(report: dict) -> str:
    """A short markdown table of the report's per-k metrics (percentages)."""
    ks = list(report["pass_at_k"])
    lines = ["| metric | " + " | ".join(f"k={k}" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    for name in ("pass_at_k", "avg_at_k", "maj_at_k"):
        if name in report:
            lines.append(f"| {name.replace('_at_k', '@k')} | " + " | ".join(
                f"{100 * report[name][k]:.1f}" for k in ks) + " |")
    aucs = ", ".join(f"AUC@{K} = {100 * v:.2f}" for K, v in report["auc_at_k"].items())
    return "\n".join(lines) + (f"\n\n{aucs}" if aucs else "")


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="trl-credit-eval",
        description="Repeated-sampling evaluation (pass@k, AUC@K, avg@k, maj@k) of a causal LM; writes "
        "report.json and pass_at_k.png. The sampling defaults (temperature 0.7, top-p 1.0, 64 new tokens) are the "
        "setting of the README's base-accuracy table (benchmarks/learning/base_accuracy.py); raise --max_new_tokens for "
        "long-form tasks.",
    )
    parser.add_argument("--model", default=None,
                        help="Model path or Hub id (default: the offline SmolLM2-135M-Instruct).")
    parser.add_argument("--adapter", default=None, help="Path of a PEFT/LoRA adapter to merge into the model.")
    parser.add_argument("--dataset", "--dataset_name", dest="dataset", default="arithmetic",
                        help="'arithmetic' or 'chain' (built-in tasks, test split; chain: docs/testbed.md, its "
                        "answers need --max_new_tokens 96) or a HF dataset name/path.")
    parser.add_argument("--dataset_config", default=None, help="HF dataset config name.")
    parser.add_argument("--split", default="test", help="HF dataset split (default: test).")
    parser.add_argument("--prompt_column", default="prompt", help="Column with chat messages or plain-text prompts.")
    parser.add_argument("--answer_column", default="answer", help="Column with reference answers.")
    parser.add_argument("--num_problems", type=int, default=None,
                        help="Evaluate the first N problems (default: all; the built-in test split has 20).")
    parser.add_argument("--digits", type=int, default=None, help="Built-in task: operand digits.")
    parser.add_argument("--num_operands", type=int, default=None, help="Built-in task: operands per problem.")
    parser.add_argument("--operators", default=None, help="Built-in task: operators drawn from '+-*'.")
    parser.add_argument("--data_seed", type=int, default=None,
                        help="Built-in tasks: the dataset seed used in training (--arithmetic_seed/--chain_seed).")
    parser.add_argument("--rollout_template", default=None,
                        help="SRPO/RRPO models: the rollout_template they trained with (thought_mdp, lines, none or a "
                        "template with {question}), so that they are evaluated on their training prompt. Default: "
                        "the dataset prompt, what GRPO, Cue-GRPO, OPPO and DATPO train on.")
    parser.add_argument("--reward", choices=sorted(REWARDS), default=None,
                        help="Answer checker (default: final_number for the built-in task, accuracy otherwise).")
    parser.add_argument("-n", "--num_samples", type=int, default=16, help="Samples per problem (k ranges up to n).")
    parser.add_argument("--batch_size", type=int, default=64, help="Sequences per generate call.")
    parser.add_argument("--temperature", type=float, default=EVAL_TEMPERATURE,
                        help="Sampling temperature (0 = greedy; default %(default)s: the base-accuracy table's).")
    parser.add_argument("--top_p", type=float, default=1.0, help="Nucleus sampling threshold (default %(default)s).")
    parser.add_argument("--max_new_tokens", type=int, default=EVAL_MAX_NEW_TOKENS,
                        help="Maximum new tokens per completion (default %(default)s: the base-accuracy table's).")
    parser.add_argument("--seed", type=int, default=0, help="Sampling seed.")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="Model dtype (auto: bfloat16 on GPU, float32 on CPU).")
    parser.add_argument("--device", default=None, help="Device (default: cuda if available, else cpu).")
    parser.add_argument("--output_dir", default="eval_results", help="Folder for report.json and pass_at_k.png.")
    parser.add_argument("--save_completions", action="store_true", help="Also write completions.jsonl.")
    parser.add_argument("--compare_base", action="store_true",
                        help="With --adapter: also evaluate its base model with the same settings (into "
                        "<output_dir>-base), print the accuracy difference with its 95%% interval "
                        "(trl_credit.evaluation.compare) and draw the base's pass@k beside the adapter's in "
                        "<output_dir>/pass_at_k.png.")
    parser.add_argument("--no_progress", action="store_true", help="Hide the progress bar.")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (``python -m trl_credit.evaluation.evaluate`` / ``trl-credit-eval``); returns the exit code."""
    args = _parse_args(argv)
    arithmetic_only = [f"--{name}" for name in ("digits", "num_operands", "operators") if getattr(args, name) is not None]
    if args.dataset == CHAIN_DATASET and arithmetic_only:
        raise SystemExit(f"{', '.join(arithmetic_only)}: only for --dataset arithmetic; the chain task takes "
                         "--data_seed and --num_problems")
    builtin_kwargs = {
        key: value
        for key, value in (
            ("digits", args.digits), ("num_operands", args.num_operands), ("operators", args.operators),
            ("seed", args.data_seed),
        )
        if value is not None
    }
    if args.compare_base and not args.adapter:
        raise SystemExit("--compare_base compares an adapter with its base model: pass --adapter <dir>")
    settings = dict(
        model=args.model, adapter=args.adapter, dataset=args.dataset, dataset_config=args.dataset_config,
        split=args.split, prompt_column=args.prompt_column, answer_column=args.answer_column,
        num_problems=args.num_problems, builtin_kwargs=builtin_kwargs, rollout_template=args.rollout_template,
        reward=args.reward,
        num_samples=args.num_samples, batch_size=args.batch_size, temperature=args.temperature, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, seed=args.seed, dtype=args.dtype, device=args.device,
        output_dir=args.output_dir, save_completions=args.save_completions, progress=not args.no_progress,
    )
    report = evaluate(**settings)
    print(format_summary(report))
    print(f"\nreport: {report['files']['report']}\nplot: {report['files']['plot']}")
    if args.compare_base:
        from trl_credit.evaluation.compare import format_difference, paired_difference

        base_model = args.model or adapter_base_model(args.adapter)
        base = evaluate(**{**settings, "model": base_model, "adapter": None,
                           "output_dir": os.path.normpath(args.output_dir) + "-base"})
        print(f"\nbase model {base_model}: report {base['files']['report']}")
        print(format_difference(paired_difference(report, base)))
        if args.temperature > 0:  # greedy for both, pass@k and the sharpening baseline (compare.py's docstring)
            from trl_credit.evaluation.compare import format_beyond_sampling

            greedy = {"temperature": 0.0, "num_samples": 1}
            trained_greedy = evaluate(**{**settings, **greedy, "output_dir": os.path.normpath(args.output_dir)
                                         + "-greedy"})
            base_greedy = evaluate(**{**settings, **greedy, "model": base_model, "adapter": None,
                                      "output_dir": os.path.normpath(args.output_dir) + "-base-greedy"})
            print(format_beyond_sampling(report, base, trained_greedy, base_greedy))
        # the adapter's plot redrawn, last, with the base's curves beside its own
        plot_pass_at_k(report, report["files"]["plot"], base=base)
        print(f"both in plot {report['files']['plot']}")
    return 0


def adapter_base_model(adapter: str) -> str | None:
    """The base model an adapter records (``adapter_config.json``'s ``base_model_name_or_path``), or None."""
    path = os.path.join(adapter, "adapter_config.json")
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle).get("base_model_name_or_path")


if __name__ == "__main__":
    sys.exit(main())
