"""Question: How accurate is the base SmolLM2 on the built-in arithmetic task, per difficulty?

Base accuracy of SmolLM2-135M-Instruct (offline default) on the built-in arithmetic task, per difficulty.

For each difficulty setting, samples ``--samples`` completions for each of ``--problems`` test problems (one
sampling pass) and scores the same completions with the lenient ``final_number_reward`` and the strict docs/design.md#answer-checking
``accuracy_reward``. Prints a markdown table (accuracies in %, pass@k from the final_number counts).

    python benchmarks/learning/base_accuracy.py --num_threads 1      # 16 problems x 4 samples, T=0.7, 64 new tokens
    python benchmarks/learning/base_accuracy.py --problems 32 --samples 8 --settings 1,2,+

On 2 shared CPU cores one setting of 16 x 4 samples takes about 2 minutes (``--num_threads 1`` avoids thread
oversubscription when other jobs use the cores: it was 6x faster per step than 2 threads under load).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from trl_credit.tasks.data import make_arithmetic_dataset  # noqa: E402
from trl_credit.evaluation.evaluate import (  # noqa: E402
    EVAL_MAX_NEW_TOKENS,
    EVAL_TEMPERATURE,
    build_report,
    load_model_and_tokenizer,
    sample_completions,
    score_completions,
)

DEFAULT_SETTINGS = ["1,2,+", "1,2,+-", "1,3,+", "2,2,+"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    # trl-credit-eval's defaults are this table's setting (0.7, 64 new tokens): one constant for both
    parser.add_argument("--temperature", type=float, default=EVAL_TEMPERATURE)
    parser.add_argument("--max_new_tokens", type=int, default=EVAL_MAX_NEW_TOKENS)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS,
                        help="difficulty settings as digits,num_operands,operators (e.g. 1,2,+)")
    parser.add_argument("--model", default=None, help="default: the offline SmolLM2-135M-Instruct")
    parser.add_argument("--instruction", default=None,
                        help="prompt template with {question} (default: trl_credit.tasks.data.ARITHMETIC_INSTRUCTION)")
    parser.add_argument("--num_threads", type=int, default=None,
                        help="torch CPU threads (1 is much faster than 2 when other jobs share the cores)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.num_threads:
        import torch

        torch.set_num_threads(args.num_threads)

    model, tokenizer = load_model_and_tokenizer(args.model, device="cpu")
    rows = []
    for setting in args.settings:
        digits, num_operands, operators = setting.split(",")
        task = dict(digits=int(digits), num_operands=int(num_operands), operators=operators)
        if args.instruction:
            task["instruction"] = args.instruction
        test = make_arithmetic_dataset(num_train=0, num_test=args.problems, **task)["test"]
        prompts, answers = test["prompt"], test["answer"]
        start = time.perf_counter()
        samples = sample_completions(
            model, tokenizer, prompts, args.samples, batch_size=args.batch_size, temperature=args.temperature,
            max_new_tokens=args.max_new_tokens, seed=args.seed, progress=False,
        )
        seconds = time.perf_counter() - start
        texts = [[s["text"] for s in per] for per in samples]
        lenient = build_report(score_completions(texts, answers, "final_number"))
        strict = build_report(score_completions(texts, answers, "accuracy"))
        flat = [s for per in samples for s in per]
        rows.append(
            (
                f"{digits} | {num_operands} | `{operators}`",
                f"{test['question'][0]} = {answers[0]}",
                100 * lenient["accuracy"],
                100 * strict["accuracy"],
                100 * lenient["pass_at_k"][str(args.samples)],
                100 * lenient["maj_at_k"][str(args.samples)],
                100 * sum(not s["stopped"] for s in flat) / len(flat),
                seconds,
            )
        )
        print(f"done {setting}: {rows[-1]}\n  e.g. {samples[0][0]['text']!r}", file=sys.stderr, flush=True)

    n = args.samples
    print(
        f"\nSmolLM2-135M-Instruct base accuracy, built-in arithmetic task: {args.problems} test problems x {n} "
        f"samples, temperature {args.temperature}, max {args.max_new_tokens} new tokens, seed {args.seed}; "
        f"prompt: {prompts[0][-1]['content']!r}.\n"
    )
    print(
        f"| digits | operands | operators | example | final_number acc % | strict accuracy % | pass@{n} % "
        f"(final_number) | maj@{n} % (final_number) | truncated % | sampling s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for setting, example, lenient_acc, strict_acc, pass_n, maj_n, truncated, seconds in rows:
        print(
            f"| {setting} | {example} | {lenient_acc:.1f} | {strict_acc:.1f} | {pass_n:.1f} | {maj_n:.1f} | "
            f"{truncated:.0f} | {seconds:.0f} |"
        )


if __name__ == "__main__":
    main()
