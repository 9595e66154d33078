"""Question: How much longer is an OPPO step than a GRPO step?

Step time of OPPOTrainer over GRPOTrainer, measured side by side in one run (docs/oppo.md#cost; paper App. H.2: +35%).

Both trainers get the same model (the offline SmolLM2-135M-Instruct), data, reward and settings. Steps are
interleaved (GRPO, OPPO, GRPO, OPPO, ...) so machine load affects both alike; each step is one generation batch:
generation, rewards, TRL's log-prob passes, OPPO's oracle pass, forward/backward and the optimizer step. After
warm-up steps, the median step time of each is reported and the ratio printed.

    python benchmarks/cost/oppo_speed.py                       # 4 prompts x 4 generations x 32 tokens, 5 timed steps
    python benchmarks/cost/oppo_speed.py --teacher             # also Teacher-OPPO (teacher = a second copy of SmolLM2)
    python benchmarks/cost/oppo_speed.py --two-pass            # also Self-OPPO scoring the plain rows too (2B rows)

Self-OPPO's extra pass scores only the B oracle rows (``plain_logps="auto"``: s_t recorded during generation);
``--two-pass`` adds the old path (``plain_logps="recompute"``) for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

import torch  # noqa: E402
from harness import prepare_manual_stepping, run_step  # noqa: E402  (one full step as Trainer runs it)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from trl_credit import OPPOConfig, OPPOTrainer  # noqa: E402
from trl_credit.models import default_model_path  # noqa: E402
from trl_credit.tasks.data import make_arithmetic_dataset  # noqa: E402
from trl_credit.tasks.rewards import final_number_reward  # noqa: E402


def length_parity_reward(completions, **kwargs):
    # A second reward with variance: a 135M model rarely solves the task, and all-zero groups would make OPPO's
    # advantages 0 (work is the same either way, but this keeps the run representative).
    return [float(len(c[0]["content"]) % 2) for c in completions]


def build(trainer_class, config_class, model_path, dataset, out_dir, args, **extra):
    on_gpu = torch.cuda.is_available()
    config = config_class(
        output_dir=out_dir,
        per_device_train_batch_size=args.prompts * args.generations,
        num_generations=args.generations,
        max_completion_length=args.tokens,
        max_steps=args.warmup + args.steps,
        learning_rate=1e-6,
        report_to="none",
        save_strategy="no",
        use_cpu=not on_gpu,
        bf16=on_gpu,
        seed=0,
        **extra,
    )
    trainer = trainer_class(
        model=model_path, reward_funcs=[final_number_reward, length_parity_reward], args=config, train_dataset=dataset
    )
    batches = prepare_manual_stepping(trainer)
    if isinstance(trainer, OPPOTrainer):  # time OPPO's own work (oracle pass + recursion) inside its step
        trainer.oppo_seconds = []
        compute = trainer.credit.token_advantages  # the ValueRecursion part's oracle pass + recursion

        def timed_oppo_advantages(*args):
            start = time.perf_counter()
            result = compute(*args)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            trainer.oppo_seconds.append(time.perf_counter() - start)
            return result

        trainer.credit.token_advantages = timed_oppo_advantages
    return trainer, batches


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--teacher", action="store_true", help="also time Teacher-OPPO (teacher = SmolLM2 again)")
    parser.add_argument("--two-pass", action="store_true", help="also time Self-OPPO with plain_logps='recompute'")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 gives steadier timings on a busy machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model_path = default_model_path()
    dataset = make_arithmetic_dataset(num_train=64, num_test=4, seed=0)["train"]
    out = tempfile.mkdtemp(prefix="oppo_speed_")
    runs = {
        "GRPO": build(GRPOTrainer, GRPOConfig, model_path, dataset, out, args, loss_type="grpo"),
        "Self-OPPO": build(OPPOTrainer, OPPOConfig, model_path, dataset, out, args, loss_type="grpo"),
    }
    if args.two_pass:
        runs["Self-OPPO-2B"] = build(
            OPPOTrainer, OPPOConfig, model_path, dataset, out, args, loss_type="grpo", plain_logps="recompute"
        )
    if args.teacher:
        runs["Teacher-OPPO"] = build(
            OPPOTrainer, OPPOConfig, model_path, dataset, out, args, loss_type="grpo",
            oracle="teacher", teacher_model_name_or_path=model_path,
        )
    times = {name: [] for name in runs}
    for step in range(args.warmup + args.steps):
        for name, (trainer, batches) in runs.items():  # interleaved: same load on every trainer
            seconds = run_step(trainer, batches)
            if step >= args.warmup:
                times[name].append(seconds)
            print(f"step {step} {name:<13} {seconds:6.2f} s" + ("  (warm-up)" if step < args.warmup else ""), flush=True)

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({torch.get_num_threads()} threads)"
    print(f"\nSmolLM2-135M-Instruct, {args.prompts} prompts x {args.generations} generations x {args.tokens} tokens, {device}")
    base = statistics.median(times["GRPO"])
    for name, values in times.items():
        median = statistics.median(values)
        # Steps i of all trainers ran back to back, so the median of the per-step ratios is robust to load changes
        # on a shared machine; the ratio of the medians is printed next to it.
        paired = statistics.median(v / g for v, g in zip(values, times["GRPO"]))
        line = (f"{name:<13} median {median:6.2f} s/step over {len(values)} steps   median paired ratio to GRPO "
                f"{paired:5.3f} ({(paired - 1) * 100:+.0f}%), ratio of medians {median / base:5.3f}")
        trainer = runs[name][0]
        if isinstance(trainer, OPPOTrainer):
            oppo = statistics.median(trainer.oppo_seconds[args.warmup :])
            line += f"   of which OPPO oracle pass + recursion {oppo:6.2f} s ({oppo / base * 100:.0f}% of a GRPO step)"
        print(line)


if __name__ == "__main__":
    main()
