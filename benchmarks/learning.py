"""Learning on a real model: GRPO and the four methods, same budget of steps, side by side (CPU-sized).

SmolLM2-135M-Instruct (offline) with LoRA (r=64, all linear layers) on the built-in arithmetic task; every method
runs ``--steps`` optimizer steps of ``--prompts`` prompts (its own offline settings from examples/train_<method>.py:
rollouts per prompt, temperature, loss type; see harness.METHODS), the same seed, data order and learning rate.
Held-out accuracy and pass@k (k up to ``--samples``) on ``--test-problems`` test problems come from
``trl_credit.evaluate`` (sample_completions / score_completions / build_report); the base model is evaluated once,
every trained adapter with the same sampling seed. Reward per step comes from TRL's logs.

    python benchmarks/learning.py --seed 0                 # writes benchmarks/results/learning_seed0.json
    python benchmarks/learning.py --methods grpo,oppo --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (sets offline environment variables before torch/transformers)
import torch  # noqa: E402

from trl_credit.data import make_arithmetic_dataset  # noqa: E402
from trl_credit.evaluate import build_report, sample_completions, score_completions  # noqa: E402
from trl_credit.models import default_model_path  # noqa: E402
from trl_credit.rewards import final_number_reward  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def evaluate_model(model, tokenizer, test, args) -> dict:
    model.eval()
    start = time.perf_counter()
    samples = sample_completions(
        model, tokenizer, list(test["prompt"]), args.samples, batch_size=args.eval_batch_size,
        temperature=args.eval_temperature, top_p=args.eval_top_p, max_new_tokens=args.tokens,
        seed=args.eval_seed, progress=False,
    )
    texts = [[s["text"] for s in per_problem] for per_problem in samples]
    scored = score_completions(texts, list(test["answer"]), reward="final_number")
    for entry, question, answer in zip(scored, test["question"], test["answer"]):
        entry.update(question=question, answer=answer)
    report = build_report(scored, settings=dict(
        samples=args.samples, max_new_tokens=args.tokens, temperature=args.eval_temperature,
        top_p=args.eval_top_p, seed=args.eval_seed))
    report["eval_seconds"] = time.perf_counter() - start
    return report


def summary(report: dict) -> dict:
    return {k: report[k] for k in ("accuracy", "pass_at_k", "auc_at_k", "maj_at_k", "num_problems", "num_samples")
            if k in report}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="grpo,cue_grpo,oppo,datpo,srpo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per optimizer step")
    parser.add_argument("--tokens", type=int, default=32, help="max completion tokens (training and evaluation)")
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--test-problems", type=int, default=10)
    parser.add_argument("--samples", type=int, default=16, help="samples per test problem (pass@k up to this k)")
    parser.add_argument("--eval-temperature", type=float, default=1.0)
    parser.add_argument("--eval-top-p", type=float, default=1.0)
    parser.add_argument("--eval-seed", type=int, default=1234)
    parser.add_argument("--eval-batch-size", type=int, default=80)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is steadier on a busy machine)")
    parser.add_argument("--output", default=None, help="default: benchmarks/results/learning_seed<N>.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for method in methods:
        if method not in harness.METHODS:
            raise SystemExit(f"--methods: unknown method {method!r}; choose from {sorted(harness.METHODS)}")
    output = args.output or os.path.join(RESULTS, f"learning_seed{args.seed}.json")
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)

    model_path = default_model_path()
    dataset = make_arithmetic_dataset(num_train=80, num_test=args.test_problems, seed=0)
    results = dict(
        settings=dict(vars(args), model="SmolLM2-135M-Instruct (LoRA r=64, all linear layers)",
                      task="built-in arithmetic (1-digit, 2 operands, +), reward final_number",
                      threads=torch.get_num_threads(), device="cuda" if torch.cuda.is_available() else "cpu",
                      method_settings={m: {**harness.METHODS[m]["shared"], **harness.METHODS[m]["own"]}
                                       for m in methods}),
        methods={},
    )
    if os.path.exists(output):  # resume: keep methods already finished with the same settings
        with open(output) as f:
            previous = json.load(f)
        if previous.get("settings", {}).get("steps") == args.steps and previous.get("base"):
            results["base"] = previous["base"]
            results["methods"] = {m: r for m, r in previous.get("methods", {}).items() if m in methods}

    def save():
        with open(output, "w") as f:
            json.dump(results, f, indent=1)

    if "base" not in results:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        report = evaluate_model(model, tokenizer, dataset["test"], args)
        results["base"] = report
        print(f"base: accuracy {report['accuracy']:.3f} pass@1 {report['pass_at_k']['1']:.3f} "
              f"pass@{args.samples} {report['pass_at_k'][str(args.samples)]:.3f} ({report['eval_seconds']:.0f} s)",
              flush=True)
        del model
        save()

    out_dir = tempfile.mkdtemp(prefix="learning_")
    for method in methods:
        if method in results["methods"]:
            print(f"{method}: already in {output}, skipped", flush=True)
            continue
        settings = harness.common_settings(args.prompts, args.tokens, args.steps, args.seed, args.learning_rate)
        config = harness.method_config(method, os.path.join(out_dir, method), settings)
        trainer = harness.build_trainer(method, config, model_path, dataset["train"], [final_number_reward],
                                        peft_config=harness.lora_config())
        start = time.perf_counter()
        trainer.train()
        train_seconds = time.perf_counter() - start
        logs = [log for log in trainer.state.log_history if "reward" in log]
        curve = [dict(step=log.get("step"), reward=log["reward"], reward_std=log.get("reward_std"),
                      **{k: v for k, v in log.items() if k.startswith(method.split("_")[0] + "/")}) for log in logs]
        report = evaluate_model(trainer.model, trainer.processing_class, dataset["test"], args)
        results["methods"][method] = dict(
            train_seconds=train_seconds, seconds_per_step=train_seconds / args.steps, reward_curve=curve,
            eval=report, settings={**harness.METHODS[method]["shared"], **harness.METHODS[method]["own"]},
        )
        print(f"{method}: {train_seconds / args.steps:.1f} s/step, mean reward {sum(c['reward'] for c in curve) / max(len(curve), 1):.3f}, "
              f"accuracy {results['base']['accuracy']:.3f} -> {report['accuracy']:.3f}, pass@1 "
              f"{results['base']['pass_at_k']['1']:.3f} -> {report['pass_at_k']['1']:.3f}, pass@{args.samples} "
              f"{results['base']['pass_at_k'][str(args.samples)]:.3f} -> {report['pass_at_k'][str(args.samples)]:.3f}",
              flush=True)
        save()
        del trainer
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
