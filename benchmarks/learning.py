"""Learning on a real model with seeds: GRPO and the methods, same rollout budget per prompt, one JSON per run.

SmolLM2-135M-Instruct (offline) + LoRA (r=64, all linear layers) on the built-in arithmetic task (default: 1-digit,
2 operands, ``+-``: 140 train / 60 held-out problems, base accuracy ~40%), reward ``final_number``. Every method
trains ``--steps`` optimizer steps of ``--prompts`` prompts with the same shared settings (``--generations``
rollouts per prompt, temperature, loss type, learning rate, completion length) and the same seeds; each method adds
only its own settings (harness.METHODS "own", e.g. SRPO's thought template). Rollout budget per prompt:
``--generations`` rows for GRPO, Cue-GRPO, OPPO and SRPO/RRPO (SRPO: ``generations/2`` base + 1 reset x
``generations/2`` suffixes, plus its seed candidates and localization); DATPO grows its tree from
``generations/2`` base rollouts (K_max 3, B_max 4: up to ~``generations`` leaves on an unsolved prompt, fewer on
easy ones), so its leaves per prompt are comparable to the others' rollouts.

Each (method, seed) run writes ``<results-dir>/<method>_seed<seed>.json`` (settings, reward curve from TRL's logs,
held-out report from ``trl_credit.evaluate``: accuracy, pass@k for k = 1..samples, per-problem counts) and is
skipped when that file exists with the same settings, so a grid can be spread over time and resumed. The base
model is evaluated once into ``<results-dir>/base.json`` with the same sampling seed. Plots and tables:
``python benchmarks/plots.py --learning-dir <results-dir>``.

    python benchmarks/learning.py --methods grpo --seeds 0                     # one GRPO run + base eval
    python benchmarks/learning.py --methods grpo,cue_grpo,oppo,datpo,srpo,rrpo --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import harness  # noqa: E402  (sets offline environment variables before torch/transformers)
import torch  # noqa: E402

from trl_credit.data import make_arithmetic_dataset  # noqa: E402
from trl_credit.evaluate import build_report, sample_completions, score_completions  # noqa: E402
from trl_credit.models import default_model_path  # noqa: E402
from trl_credit.rewards import final_number_reward  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "learning")
# Methods of the comparison: the harness's trainers, plus RRPO = SRPO with uniformly random resets.
METHODS = ("grpo", "cue_grpo", "oppo", "datpo", "srpo", "rrpo")
RUN_KEYS = ("steps", "prompts", "generations", "tokens", "temperature", "learning_rate", "digits", "operands",
            "operators", "num_train", "num_test")
EVAL_KEYS = ("digits", "operands", "operators", "num_train", "num_test", "samples", "tokens", "eval_temperature",
             "eval_top_p", "eval_seed")


def dataset_of(args):
    return make_arithmetic_dataset(num_train=args.num_train, num_test=args.num_test, digits=args.digits,
                                   num_operands=args.operands, operators=args.operators, seed=0)


def evaluate_model(model, tokenizer, test, args) -> dict:
    model.eval()
    start = time.perf_counter()
    # A trained LoRA model is evaluated with its adapter merged into the base weights: the same function (to fp32
    # rounding) at the base model's cost; unmerged, the 7 x 30 adapter matmuls made evaluation ~1.7x slower.
    merged = hasattr(model, "merge_adapter")
    if merged:
        model.merge_adapter()
    try:
        samples = sample_completions(
            model, tokenizer, list(test["prompt"]), args.samples, batch_size=args.eval_batch_size,
            temperature=args.eval_temperature, top_p=args.eval_top_p, max_new_tokens=args.tokens,
            seed=args.eval_seed, progress=False,
        )
    finally:
        if merged:
            model.unmerge_adapter()
    texts = [[s["text"] for s in per_problem] for per_problem in samples]
    scored = score_completions(texts, list(test["answer"]), reward="final_number")
    for entry, question, answer in zip(scored, test["question"], test["answer"]):
        entry.update(question=question, answer=answer)
    report = build_report(scored, settings={k: getattr(args, k) for k in EVAL_KEYS})
    report["eval_seconds"] = time.perf_counter() - start
    return report


def method_settings(method: str, args) -> tuple[str, dict]:
    """(harness method, settings overriding harness.METHODS) of one method under the shared budget."""
    shared = dict(num_generations=args.generations, temperature=args.temperature, top_p=1.0, loss_type="dapo",
                  weight_decay=0.0)
    if method == "datpo":
        shared["num_generations"] = max(2, args.generations // 2)
    if method in ("srpo", "rrpo"):
        half = args.generations // 2
        shared.update(reset_groups=1, suffixes_per_reset=half, reset="self" if method == "srpo" else "random")
    return ("srpo" if method == "rrpo" else method), shared


def load_if_same(path: str, keys, args) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        previous = json.load(f)
    wanted = {k: getattr(args, k) for k in keys}
    had = {k: previous.get("settings", {}).get(k) for k in keys}
    if had != wanted:
        if args.force:
            return None
        raise SystemExit(f"{path} exists with other settings {had} (now {wanted}): use another --results-dir or "
                         f"--force to overwrite.")
    return previous


def run_one(method: str, seed: int, args, dataset, model_path: str) -> dict:
    harness_method, overrides = method_settings(method, args)
    settings = harness.common_settings(args.prompts, args.tokens, args.steps, seed, args.learning_rate)
    settings.update(overrides)
    config = harness.method_config(harness_method, tempfile.mkdtemp(prefix=f"learning_{method}_"), settings)
    trainer = harness.build_trainer(harness_method, config, model_path, dataset["train"], [final_number_reward],
                                    peft_config=harness.lora_config())
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start
    prefix = harness_method.split("_")[0] + "/"
    curve = [dict(step=log.get("step"), reward=log["reward"], reward_std=log.get("reward_std"),
                  completion_length=log.get("completions/mean_length"),
                  **{k: v for k, v in log.items() if k.startswith(prefix)})
             for log in trainer.state.log_history if "reward" in log]
    report = evaluate_model(trainer.model, trainer.processing_class, dataset["test"], args)
    return dict(method=method, seed=seed, train_seconds=train_seconds, seconds_per_step=train_seconds / args.steps,
                reward_curve=curve, eval=report,
                trainer_settings={k: getattr(config, k) for k in ("num_generations", "temperature", "top_p",
                                                                   "loss_type", "per_device_train_batch_size")})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds (same for every method)")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per optimizer step")
    parser.add_argument("--generations", type=int, default=8, help="rollout budget per prompt (see the docstring)")
    parser.add_argument("--tokens", type=int, default=48, help="max completion tokens (training and evaluation)")
    parser.add_argument("--temperature", type=float, default=0.7, help="training sampling temperature")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--digits", type=int, default=1)
    parser.add_argument("--operands", type=int, default=2)
    parser.add_argument("--operators", default="+-")
    parser.add_argument("--num-train", type=int, default=140)
    parser.add_argument("--num-test", type=int, default=60, help="held-out problems")
    parser.add_argument("--samples", type=int, default=16, help="samples per held-out problem (pass@k up to this k)")
    parser.add_argument("--eval-temperature", type=float, default=0.7)
    parser.add_argument("--eval-top-p", type=float, default=1.0)
    parser.add_argument("--eval-seed", type=int, default=1234)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is steadier on a busy machine)")
    parser.add_argument("--results-dir", default=RESULTS)
    parser.add_argument("--force", action="store_true", help="overwrite runs whose JSON has other settings")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for method in methods:
        if method not in METHODS:
            raise SystemExit(f"--methods: unknown method {method!r}; choose from {list(METHODS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    os.makedirs(args.results_dir, exist_ok=True)
    dataset = dataset_of(args)
    model_path = default_model_path()
    info = dict(model="SmolLM2-135M-Instruct (LoRA r=64, all linear layers)",
                task=f"built-in arithmetic ({args.digits}-digit, {args.operands} operands, {args.operators!r}), "
                     f"reward final_number", device="cuda" if torch.cuda.is_available() else "cpu",
                threads=torch.get_num_threads())

    base_path = os.path.join(args.results_dir, "base.json")
    if load_if_same(base_path, EVAL_KEYS, args) is None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        report = evaluate_model(model, tokenizer, dataset["test"], args)
        with open(base_path, "w") as f:
            json.dump(dict(settings={k: getattr(args, k) for k in EVAL_KEYS}, info=info, eval=report), f, indent=1)
        print(f"base: accuracy {report['accuracy']:.3f} pass@{args.samples} "
              f"{report['pass_at_k'][str(args.samples)]:.3f} ({report['eval_seconds']:.0f} s) -> {base_path}",
              flush=True)
        del model

    for seed in seeds:
        for method in methods:
            path = os.path.join(args.results_dir, f"{method}_seed{seed}.json")
            if load_if_same(path, RUN_KEYS + EVAL_KEYS, args) is not None:
                print(f"{method} seed {seed}: {path} exists, skipped", flush=True)
                continue
            result = run_one(method, seed, args, dataset, model_path)
            result.update(settings={k: getattr(args, k) for k in RUN_KEYS + EVAL_KEYS}, info=info)
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
            rewards = [c["reward"] for c in result["reward_curve"]]
            print(f"{method} seed {seed}: {result['seconds_per_step']:.1f} s/step, train reward first/last "
                  f"{rewards[0]:.2f}/{rewards[-1]:.2f}, held-out accuracy {result['eval']['accuracy']:.3f} "
                  f"({result['eval']['eval_seconds']:.0f} s eval) -> {path}", flush=True)


if __name__ == "__main__":
    main()
