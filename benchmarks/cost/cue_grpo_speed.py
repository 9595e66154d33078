"""Question: What does Cue-GRPO's cue pipeline cost, alone and inside a training step?

Cost of Cue-GRPO over GRPO, measured side by side in one run.

1. Pipeline: cue extraction + partition + weights for one group of 64 synthetic reasoning completions of about
   1,000 SmolLM2 tokens each (templated competition-math prose with LaTeX; all 64 treated as positive, the worst
   case: only positive completions are processed), with the trainer's fast extractor and with the reference
   per-step matcher.
2. A GRPOTrainer step and a CueGRPOTrainer step on the same config (offline SmolLM2-135M-Instruct by default, or the
   tiny random model with --model tiny), CPU unless a GPU is present; the Cue-GRPO hook's own time per step is read
   from ``trainer.cue_overhead_seconds``.

Prints the pipeline time as a share of the measured GRPO step, and the in-trainer overhead share.

    python benchmarks/cost/cue_grpo_speed.py                 # SmolLM2, 8 generations x 128 tokens per step
    python benchmarks/cost/cue_grpo_speed.py --model tiny    # seconds, for a smoke run
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

SENTENCES = [
    "Let $x$ be the number of apples in the first basket, and let $y$ be the number in the second basket.",
    "We set up the equation $3x + 5 = 2y - 1$ from the first condition of the problem.",
    "Then we substitute $y = x + 4$ into the first equation to get $3x + 5 = 2(x + 4) - 1$, so $x = 2$.",
    "Using the quadratic formula, $x = \\frac{-b \\pm \\sqrt{b^2 - 4ac}}{2a} = \\frac{7 \\pm \\sqrt{49 - 24}}{2}$.",
    "First, we compute $\\binom{10}{3} = \\frac{10 \\cdot 9 \\cdot 8}{6} = 120$ ways to choose the committee.",
    "Since $n \\equiv 3 \\pmod{7}$ and $n \\equiv 2 \\pmod{5}$, the Chinese remainder theorem gives $n \\equiv 17 \\pmod{35}$.",
    "Now we simplify the expression: $\\frac{x^2 - 9}{x - 3} = x + 3$ for $x \\neq 3$.",
    "Consider two cases depending on the sign of $a$. Case 1: $a \\geq 0$, then $|a| = a$.",
    "By the Pythagorean theorem, the hypotenuse is $\\sqrt{3^2 + 4^2} = 5$.",
    "We need to find the smallest positive integer $k$ such that $k^2 + k$ is divisible by $12$.",
    "The sum telescopes: $\\sum_{k=1}^{n} \\left(\\frac{1}{k} - \\frac{1}{k+1}\\right) = 1 - \\frac{1}{n+1}$.",
    "Taking logarithms, $\\log_2 (8x) = 3 + \\log_2 x$, so the equation becomes linear in $\\log_2 x$.",
    "This means that the total area is the sum of the two rectangles, namely $6 \\cdot 4 + 3 \\cdot 2 = 30$ square units.",
    "Let me check this: $3 \\cdot 2 + 5 = 11$ and $2 \\cdot 6 - 1 = 11$, which matches.",
    "We count the number of lattice points inside the circle of radius $5$ centered at the origin.",
    "Hence the remainder when $2^{100}$ is divided by $7$ is $2$, because $2^3 \\equiv 1 \\pmod 7$.",
    "Next, we calculate the derivative $\\frac{d}{dx}(x^3 - 3x) = 3x^2 - 3$, which vanishes at $x = \\pm 1$.",
    "So the two values of $t$ are $t = 1$ and $t = -\\frac{5}{2}$, and only the positive one makes sense here.",
    "We factor the numerator as $(x - 2)(x + 5)$ and cancel the common factor with the denominator.",
    "Plugging in $x = 4$ gives $f(4) = 16 - 8 + 1 = 9$, and so $\\sqrt{f(4)} = 3$.",
    "The greatest common divisor is $\\gcd(84, 126) = 42$, so the fraction reduces to $\\frac{2}{3}$.",
    "If $x > 0$ the expression is positive; otherwise it is negative, so we only need $x > 0$.",
    "Rearranging terms, $2x - 7 = 3 - x$ gives $3x = 10$ and $x = \\frac{10}{3}$.",
    "Multiplying both sides by the common denominator clears the fractions and leaves a linear relation.",
    "The two conditions together pin down the value uniquely, as the graph of the line shows.",
]
FINAL = "Therefore, the answer is $\\boxed{42}$."


def synthetic_trace(rng: random.Random, target_chars: int) -> str:
    """Paragraphs of 2-4 templated sentences (LaTeX and prose), some numbered, ending with a boxed answer."""
    parts, size, item = [], 0, 1
    while size < target_chars:
        sentences = " ".join(rng.choice(SENTENCES) for _ in range(rng.randint(2, 4)))
        if rng.random() < 0.3:
            sentences, item = f"{item}. {sentences}", item + 1
        parts.append(sentences)
        size += len(sentences) + 2
    parts.append(FINAL)
    return "\n\n".join(parts)


def time_pipeline(texts, extractor, repeats):
    from trl_credit.cue_grpo import compute_rarity_weights, partition_skeletons

    times, cpu_times = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        skeletons = extractor(texts)
        cluster_ids, lengths = partition_skeletons(skeletons)
        compute_rarity_weights(cluster_ids, lengths)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return statistics.median(times), statistics.median(cpu_times), len(set(cluster_ids))


def grpo_step_times(model_path, generations, completion_tokens, steps):
    import torch
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_credit import CueGRPOConfig, CueGRPOTrainer
    from trl_credit.tasks.data import make_arithmetic_dataset

    dataset = make_arithmetic_dataset(num_train=max(8, steps * 2), num_test=2, seed=0)["train"]

    def length_parity_reward(completions, **kwargs):  # about half the completions positive
        return [float(len(c[0]["content"]) % 2) for c in completions]

    results = {}
    for name, trainer_cls, config_cls in (("grpo", GRPOTrainer, GRPOConfig), ("cue", CueGRPOTrainer, CueGRPOConfig)):
        with tempfile.TemporaryDirectory() as out:
            args = config_cls(
                output_dir=out, per_device_train_batch_size=generations, num_generations=generations,
                max_completion_length=completion_tokens, max_steps=steps, report_to="none", logging_steps=1,
                save_strategy="no", disable_tqdm=True, seed=0, use_cpu=not torch.cuda.is_available(),
            )
            trainer = trainer_cls(model=model_path, reward_funcs=length_parity_reward, args=args, train_dataset=dataset)
            trainer.remove_callback(PrinterCallback)  # keep the output to our summary
            trainer.train()
            step_times = [log["step_time"] for log in trainer.state.log_history if "step_time" in log]
            results[name] = (step_times, list(getattr(trainer, "cue_overhead_seconds", [])))
            print(f"  [{name}] step times: {', '.join(f'{t:.2f}' for t in step_times)} s", flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--generations", type=int, default=8, help="completions per GRPO step (one group)")
    parser.add_argument("--completion-tokens", type=int, default=128, help="max_completion_length of the GRPO step")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per trainer (the first is warm-up)")
    parser.add_argument("--group", type=int, default=64, help="completions in the pipeline benchmark group")
    parser.add_argument("--trace-chars", type=int, default=2600, help="characters per synthetic completion")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from trl_credit.cue_grpo import extract_cues_batch, label_step, merge_and_filter, split_steps
    from trl_credit.models import default_model_path

    rng = random.Random(0)
    texts = [synthetic_trace(rng, args.trace_chars) for _ in range(args.group)]
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    tokens = statistics.mean(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)

    def reference(batch):
        return [merge_and_filter([label_step(s) for s in split_steps(t)]) for t in batch]

    fast, fast_cpu, clusters = time_pipeline(texts, extract_cues_batch, args.repeats)
    slow, slow_cpu, _ = time_pipeline(texts, reference, max(3, args.repeats // 4))
    print(f"pipeline: {args.group} completions x {tokens:.0f} SmolLM2 tokens ({args.trace_chars} chars), "
          f"all positive, {clusters} clusters")
    print(f"  fast extractor (trainer): {fast * 1e3:8.2f} ms per group (process CPU time {fast_cpu * 1e3:.2f} ms)")
    print(f"  reference per-step regex: {slow * 1e3:8.2f} ms per group (process CPU time {slow_cpu * 1e3:.2f} ms), "
          f"{slow / fast:.1f}x slower")

    if args.model == "tiny":
        from tests.tiny import build_tiny_model

        model_path = build_tiny_model(tempfile.mkdtemp())
        model_name = "tiny random Llama (tests/tiny.py)"
    else:
        model_path, model_name = default_model_path(), "SmolLM2-135M-Instruct (offline)"
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = grpo_step_times(model_path, args.generations, args.completion_tokens, args.steps)
    grpo_steps, _ = results["grpo"]
    cue_steps, cue_hook = results["cue"]
    grpo_step = statistics.mean(grpo_steps[1:] or grpo_steps)
    cue_step = statistics.mean(cue_steps[1:] or cue_steps)
    hook = statistics.mean(cue_hook[1:] or cue_hook)
    print(f"GRPO step: {model_name} on {device}, {args.generations} generations x {args.completion_tokens} tokens, "
          f"mean of steps 2..{args.steps}")
    print(f"  GRPOTrainer step:    {grpo_step:8.3f} s   (steps: {', '.join(f'{t:.2f}' for t in grpo_steps)})")
    print(f"  CueGRPOTrainer step: {cue_step:8.3f} s   (steps: {', '.join(f'{t:.2f}' for t in cue_steps)})")
    print(f"  Cue-GRPO hook inside the step: {hook * 1e3:.2f} ms = {100 * hook / grpo_step:.2g}% of the GRPO step")
    print(f"share: 64x~{tokens:.0f}-token pipeline / measured GRPO step = {100 * fast / grpo_step:.2g}% "
          f"(the step above is smaller than a 64 x 1,000-token step, so this overstates the share)")


if __name__ == "__main__":
    main()
