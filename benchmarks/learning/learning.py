"""Question: Does a method learn more than GRPO on a real model, over seeds, at the same rollout budget?

Learning on a real model with seeds: GRPO and the methods, same rollout budget per prompt, one JSON per run.

Two tasks (``--task``), LoRA (r=64, all linear layers) on a model each:

- ``arithmetic`` (default): SmolLM2-135M-Instruct (offline) on the built-in arithmetic task (default: 1-digit,
  2 operands, ``+-``: 140 train / 60 held-out problems, base accuracy ~40%), reward ``final_number``;
- ``chain``: the warm-started ``smollm2-135m-chain`` (docs/testbed.md) on the multi-step chain task (1000 train /
  64 held-out problems, 96 completion tokens), rewards ``[accuracy, chain_format]`` as the example scripts default
  to (accuracy first: the methods' verifier), held-out reward ``accuracy``. Here SRPO/RRPO roll out on the dataset
  prompt itself (``rollout_template="none"``: it already asks for one step per line, ``thought_delimiter="\n"``),
  so every method trains and is evaluated on the same prompt; every SRPO-like run carries the chain step checker,
  which grades its resets (h* against the first wrong step, recorded per reset in its JSON:
  ``benchmarks/mechanisms/chain_resets.py``) and, in ``srpo_oracle`` (SRPO with ``reset="oracle"``; skipped, with a message,
  when the installed ``SRPOConfig`` does not accept it), places them; ``cue_grpo_structure`` (chain only, in the
  chain grid instead of ``cue_grpo``) is Cue-GRPO with its positives partitioned by solution structure
  (``cue_partition="callable"``): the default cue partition sees one cluster in every chain group (BENCHMARKS.md 2b);
  ``srpo_oppo`` is a composed method (docs/composition.md): SRPO's resets with OPPO's token credit, next to its
  two parts with the same seeds.

Every method trains ``--steps`` optimizer steps of ``--prompts`` prompts with the same shared settings
(``--generations`` rollouts per prompt, temperature, loss type, learning rate, completion length) and the same seeds;
each method adds only its own settings (harness.METHODS "own", e.g. SRPO's thought template). Held-out prompts are
the prompts each method trained on (SRPO's rollout template applied when it has one), so no method is evaluated on
a prompt it never saw. Rollout budget per prompt:
``--generations`` rows for GRPO, Cue-GRPO, OPPO and SRPO/RRPO (SRPO: ``generations/2`` base + 1 reset x
``generations/2`` suffixes, plus its seed candidates and localization); DATPO grows its tree from
``generations/2`` base rollouts (K_max 3, B_max 4: up to ~``generations`` leaves on an unsolved prompt, fewer on
easy ones), so its leaves per prompt are comparable to the others' rollouts.

Each (method, seed) run writes ``<results-dir>/<method>_seed<seed>.json`` (settings, reward curve from TRL's logs,
held-out report from ``trl_credit.evaluation.evaluate``: accuracy, pass@k for k = 1..samples, per-problem counts) and is
skipped when that file exists with the same settings, so a grid can be spread over time and resumed. The base
model is evaluated once into ``<results-dir>/base.json`` with the same sampling seed. Plots, 95% CIs and paired
differences vs GRPO (same seed): ``python benchmarks/harness/plots.py --learning-dir <results-dir>``.

    python benchmarks/learning/learning.py --methods grpo --seeds 0                     # one GRPO run + base eval
    python benchmarks/learning/learning.py --methods grpo,cue_grpo,oppo,datpo,srpo,rrpo --seeds 0,1,2
    python benchmarks/learning/learning.py --task chain --results-dir benchmarks/results/learning_chain --seeds 0,1,2,3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mechanisms"))  # mechanism_cue_grpo
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness  # noqa: E402  (sets offline environment variables before torch/transformers)
from harness import mechanisms as mechanism_common  # noqa: E402
import torch  # noqa: E402

from trl_credit.evaluation.evaluate import build_report, sample_completions, score_completions  # noqa: E402
from trl_credit.models import CHAIN_MODEL, default_model_path, resolve_model_path  # noqa: E402
from trl_credit.srpo.prompts import resolve_rollout_template, wrap_prompt  # noqa: E402
from trl_credit.tasks.chain import chain_format_reward, make_chain_dataset  # noqa: E402
from trl_credit.tasks.data import make_arithmetic_dataset  # noqa: E402
from trl_credit.tasks.rewards import accuracy_reward, final_number_reward  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "learning")
# Methods of the comparison: the harness's trainers, RRPO = SRPO with uniformly random resets, and SRPO with the
# reset just before the step checker's first wrong step (chain task only).
METHODS = ("grpo", "cue_grpo", "cue_grpo_structure", "oppo", "datpo", "srpo", "rrpo", "srpo_oracle", "srpo_oppo")
SRPO_LIKE = ("srpo", "rrpo", "srpo_oracle", "srpo_oppo")
# Methods that need the chain task (a step checker, solution structures), and the default list per task. On chain,
# Cue-GRPO runs with a partition by solution structure: its default cue partition finds one cluster in every group
# there (chain lines carry no strategy cue; BENCHMARKS.md section 2b), which makes it GRPO with positive advantages
# x 1.05, and its own warning says to partition otherwise.
CHAIN_ONLY = ("cue_grpo_structure", "srpo_oracle")
DEFAULT_METHODS = {"arithmetic": tuple(m for m in METHODS if m not in CHAIN_ONLY),
                   "chain": tuple(m for m in METHODS if m != "cue_grpo")}
RUN_KEYS = ("task", "steps", "prompts", "generations", "tokens", "temperature", "learning_rate", "digits", "operands",
            "operators", "num_train", "num_test", "beta", "lora_rank")
EVAL_KEYS = ("task", "digits", "operands", "operators", "num_train", "num_test", "samples", "tokens",
             "eval_temperature", "eval_top_p", "eval_seed", "model_sha256", "distributive_fraction", "factor_friendly",
             "greedy_eval")
# Settings of runs written before a key existed (their value then): the arithmetic runs predate --task; runs before
# --model recorded no warm-start digest, before --distributive-fraction none (chain pilots: 0.5, the task's), every
# run before --beta trained with TRL's default 0, none before --factor-friendly had it, every run before
# --lora-rank trained a rank-64 LoRA, and none before --greedy-eval was evaluated greedily.
LEGACY_SETTINGS = {"task": "arithmetic", "model_sha256": None, "distributive_fraction": None, "beta": 0.0,
                   "factor_friendly": False, "lora_rank": 64, "greedy_eval": False}
# Per task: model, training reward functions, held-out reward, and defaults of the task-dependent options.
TASKS = {
    "arithmetic": dict(model=None, rewards=[final_number_reward], eval_reward="final_number",
                       defaults=dict(num_train=140, num_test=60, tokens=48)),
    "chain": dict(model=CHAIN_MODEL, rewards=[accuracy_reward, chain_format_reward], eval_reward="accuracy",
                  defaults=dict(num_train=1000, num_test=64, tokens=96, distributive_fraction=0.5)),
}


def dataset_of(args):
    if args.task == "chain":
        return make_chain_dataset(num_train=args.num_train, num_test=args.num_test, seed=0,
                                  distributive_fraction=args.distributive_fraction,
                                  factor_friendly=args.factor_friendly)
    return make_arithmetic_dataset(num_train=args.num_train, num_test=args.num_test, digits=args.digits,
                                   num_operands=args.operands, operators=args.operators, seed=0)


def model_path_of(args) -> str:
    name = args.model or TASKS[args.task]["model"]
    return default_model_path() if name is None else resolve_model_path(name)


def warm_start_digest(model_path: str) -> str | None:
    """The weights digest a ``trl_credit.testbed.warm_start`` build records beside its weights (None for other models): part
    of the settings, so that a grid is never resumed on another build of the same name."""
    path = os.path.join(model_path, "warm_start.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["weights_sha256"]


def training_prompts(config, prompts) -> list:
    """The prompts a trainer with ``config`` generates from: SRPO/RRPO wrap each question in their rollout template
    (none on the chain task); the other trainers use the dataset prompts as they are."""
    template = resolve_rollout_template(getattr(config, "rollout_template", None))
    return [wrap_prompt(prompt, template) for prompt in prompts]


def evaluate_model(model, tokenizer, test, args, prompts=None) -> dict:
    model.eval()
    start, cpu_start = time.perf_counter(), time.process_time()
    # A trained LoRA model is evaluated with its adapter merged into the base weights: the same function (to fp32
    # rounding) at the base model's cost; unmerged, the 7 x 30 adapter matmuls made evaluation ~1.7x slower.
    merged = hasattr(model, "merge_adapter")
    if merged:
        model.merge_adapter()
    try:
        samples = sample_completions(
            model, tokenizer, list(test["prompt"]) if prompts is None else prompts, args.samples,
            batch_size=args.eval_batch_size,
            temperature=args.eval_temperature, top_p=args.eval_top_p, max_new_tokens=args.tokens,
            seed=args.eval_seed, progress=False,
        )
        # what the model does when it commits: a gain greedy decoding does not show is sharpening
        greedy = greedy_correct(model, tokenizer, test, args, prompts) if getattr(args, "greedy_eval", False) else None
    finally:
        if merged:
            model.unmerge_adapter()
    texts = [[s["text"] for s in per_problem] for per_problem in samples]
    scored = score_completions(texts, list(test["answer"]), reward=TASKS[args.task]["eval_reward"])
    for entry, question, answer in zip(scored, test["question"], test["answer"]):
        entry.update(question=question, answer=answer)
    report = build_report(scored, settings={k: getattr(args, k) for k in EVAL_KEYS})
    if greedy is not None:
        report.update(greedy_correct=greedy, greedy_accuracy=sum(greedy) / len(greedy))
    if args.task == "chain":
        report["structures"] = structure_counts(texts, list(test["question"]), scored)
    report["eval_seconds"] = time.perf_counter() - start
    # Core-seconds (process CPU time; = wall time on an idle machine with --threads 1): what a grid costs.
    report["eval_cpu_seconds"] = time.process_time() - cpu_start
    return report


def greedy_correct(model, tokenizer, test, args, prompts=None) -> list[int]:
    """Per held-out problem, 1 where the greedy completion (one, temperature 0) is correct."""
    greedy = sample_completions(model, tokenizer, list(test["prompt"]) if prompts is None else prompts, 1,
                                batch_size=args.eval_batch_size, temperature=0.0, max_new_tokens=args.tokens,
                                seed=args.eval_seed, progress=False)
    verdicts = score_completions([[s["text"] for s in per] for per in greedy], list(test["answer"]),
                                 reward=TASKS[args.task]["eval_reward"])
    return [int(any(v["correct"])) for v in verdicts]


def structure_counts(texts: list[list[str]], questions: list[str], scored: list[dict]) -> dict:
    """Chain task: held-out samples per solution structure (plain core; term by term / factored / other for the
    distributive ones), ``{structure: [correct, samples]}``, correct by the held-out reward. Does a method learn to
    prefer one structure (docs/testbed.md)?"""
    from mechanism_cue_grpo import solution_structure

    counts: dict[str, list[int]] = {}
    for per_problem, question, entry in zip(texts, questions, scored):
        for text, correct in zip(per_problem, entry["correct"], strict=True):
            tally = counts.setdefault(solution_structure(question, text), [0, 0])
            tally[0] += int(correct)
            tally[1] += 1
    return counts


def method_settings(method: str, args) -> tuple[str, dict]:
    """(harness method, settings overriding harness.METHODS) of one method under the shared budget."""
    shared = dict(num_generations=args.generations, temperature=args.temperature, top_p=1.0, loss_type="dapo",
                  weight_decay=0.0, beta=args.beta)
    if method == "datpo":
        shared["num_generations"] = max(2, args.generations // 2)
    if method == "cue_grpo_structure":
        shared["cue_partition"] = "callable"  # partition_fn: run_one passes mechanism_cue_grpo.structure_partition
    if method in SRPO_LIKE:
        half = args.generations // 2
        reset = {"srpo": "self", "rrpo": "random", "srpo_oracle": "oracle", "srpo_oppo": "self"}[method]
        shared.update(reset_groups=1, suffixes_per_reset=half, reset=reset)
        if args.task == "chain":  # the chain prompt already asks for one step per line: roll out on it as is
            # The step checker places the oracle's resets; for SRPO and RRPO it only grades theirs (h* vs the first
            # wrong step, logged as srpo/localization_* and recorded per reset), it never moves them.
            shared.update(rollout_template="none", thought_delimiter="\n", step_checker="chain")
    harness_method = ("srpo_oppo" if method == "srpo_oppo" else "srpo" if method in SRPO_LIKE
                      else "cue_grpo" if method == "cue_grpo_structure" else method)
    return harness_method, shared


def load_if_same(path: str, keys, args) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        previous = json.load(f)
    wanted = {k: getattr(args, k) for k in keys}
    had = {k: previous.get("settings", {}).get(k, LEGACY_SETTINGS.get(k)) for k in keys}
    if had != wanted:
        if args.force:
            return None
        raise SystemExit(f"{path} exists with other settings {had} (now {wanted}): use another --results-dir or "
                         f"--force to overwrite.")
    return previous


def base_eval_args(args) -> argparse.Namespace:
    """The settings the base model is evaluated with: the trained models' ones, with ``--base-samples`` samples per
    problem (a paired gain's noise has the base's sampling noise in it, paid once for the whole grid)."""
    return argparse.Namespace(**{**vars(args), "samples": args.base_samples or args.samples})


def sharpening_baseline(base: dict) -> dict | None:
    """The untrained model at its best decoding: the highest of its greedy accuracy and its accuracy at each sampled
    temperature (``base["by_temperature"]``), named. A trained model learned only where it beats this."""
    options = {f"temperature {t}": report["accuracy"] for t, report in base.get("by_temperature", {}).items()}
    if "greedy_accuracy" in base:
        options["greedy"] = base["greedy_accuracy"]
    if not options:
        return None
    best = max(options, key=options.get)
    return dict(decoding=best, accuracy=options[best], options=options)


def base_by_temperature(base_path: str, base_args, dataset, model_path: str) -> None:
    """Sample the base model at each of ``--base-temperatures`` not yet in base.json (same problems, samples and
    seed as every evaluation), greedy too when base.json has none, and store its sharpening baseline there."""
    with open(base_path) as f:
        saved = json.load(f)
    wanted = [t for t in (float(x) for x in base_args.base_temperatures.split(",") if x.strip())
              if f"{t:g}" not in saved.get("by_temperature", {})]
    needs_greedy = base_args.greedy_eval and "greedy_accuracy" not in saved["eval"]
    if wanted or needs_greedy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        for temperature in wanted:
            if temperature == base_args.eval_temperature:  # the base evaluation itself (same samples and seed)
                saved.setdefault("by_temperature", {})[f"{temperature:g}"] = dict(
                    accuracy=saved["eval"]["accuracy"], pass_at_k=saved["eval"]["pass_at_k"], samples=base_args.samples)
                continue
            at = argparse.Namespace(**{**vars(base_args), "eval_temperature": temperature, "greedy_eval": False})
            report = evaluate_model(model, tokenizer, dataset["test"], at)
            saved.setdefault("by_temperature", {})[f"{temperature:g}"] = dict(
                accuracy=report["accuracy"], pass_at_k=report["pass_at_k"], samples=at.samples)
            print(f"base at temperature {temperature:g}: accuracy {report['accuracy']:.3f}", flush=True)
        if needs_greedy:
            model.eval()
            correct = greedy_correct(model, tokenizer, dataset["test"], base_args)
            saved["eval"].update(greedy_correct=correct, greedy_accuracy=sum(correct) / len(correct))
            print(f"base greedy: accuracy {saved['eval']['greedy_accuracy']:.3f}", flush=True)
    # in temperature order, whatever order the temperatures were added in over resumed runs
    saved["by_temperature"] = dict(sorted(saved.get("by_temperature", {}).items(), key=lambda item: float(item[0])))
    saved["sharpening_baseline"] = sharpening_baseline(dict(saved["eval"], by_temperature=saved["by_temperature"]))
    with open(base_path, "w") as f:
        json.dump(saved, f, indent=1)


def build_run_trainer(method: str, seed: int, args, dataset, model_path: str):
    """(harness method, config, trainer) of one (method, seed) run: the shared settings, the method's own, LoRA."""
    harness_method, overrides = method_settings(method, args)
    settings = harness.common_settings(args.prompts, args.tokens, args.steps, seed, args.learning_rate)
    settings.update(overrides)
    config = harness.method_config(harness_method, tempfile.mkdtemp(prefix=f"learning_{method}_"), settings)
    own = {}
    if method == "cue_grpo_structure":
        from mechanism_cue_grpo import structure_partition

        own["partition_fn"] = structure_partition
    trainer = harness.build_trainer(harness_method, config, model_path, dataset["train"], TASKS[args.task]["rewards"],
                                    peft_config=harness.lora_config(args.lora_rank), **own)
    return harness_method, config, trainer


def run_one(method: str, seed: int, args, dataset, model_path: str) -> dict:
    harness_method, config, trainer = build_run_trainer(method, seed, args, dataset, model_path)
    # Chain task: every reset of an SRPO-like run against the checker (paper Fig. 4 pooled over a grid's seeds,
    # benchmarks/mechanisms/chain_resets.py).
    resets = mechanism_common.record_resets(trainer) if method in SRPO_LIKE and args.task == "chain" else None
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.train()
    train_seconds = time.perf_counter() - start
    train_cpu_seconds = time.process_time() - cpu_start
    prefixes = tuple(f"{part}/" for part in harness_method.split("_"))  # srpo_oppo: srpo/ and oppo/ metrics
    curve = [dict(step=log.get("step"), reward=log["reward"], reward_std=log.get("reward_std"),
                  completion_length=log.get("completions/mean_length"),
                  **{k: v for k, v in log.items() if k.startswith(prefixes) or k.startswith("rewards/")})
             for log in trainer.state.log_history if "reward" in log]
    prompts = training_prompts(config, list(dataset["test"]["prompt"]))
    report = evaluate_model(trainer.model, trainer.processing_class, dataset["test"], args, prompts)
    return dict(method=method, seed=seed, train_seconds=train_seconds, seconds_per_step=train_seconds / args.steps,
                train_cpu_seconds=train_cpu_seconds, cpu_seconds_per_step=train_cpu_seconds / args.steps,
                reward_curve=curve, eval=report, eval_prompt_example=prompts[0],
                trainer_settings={k: getattr(config, k) for k in ("num_generations", "temperature", "top_p",
                                                                   "loss_type", "per_device_train_batch_size")},
                **({} if resets is None else {"resets": resets}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--task", choices=sorted(TASKS), default="arithmetic",
                        help="arithmetic (SmolLM2-135M-Instruct) or chain (smollm2-135m-chain, docs/testbed.md)")
    parser.add_argument("--methods", default=None,
                        help=f"comma-separated, from {list(METHODS)} (default: all; srpo_oracle on chain only)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds (same for every method)")
    parser.add_argument("--model", default=None,
                        help="model name or folder to train from (default: the task's model); e.g. a warm start built "
                             "with `python -m trl_credit.testbed.warm_start --output_dir DIR`")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per optimizer step")
    parser.add_argument("--generations", type=int, default=8, help="rollout budget per prompt (see the docstring)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="max completion tokens, training and evaluation (default: arithmetic 48, chain 96)")
    parser.add_argument("--temperature", type=float, default=0.7, help="training sampling temperature")
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--beta", type=float, default=0.0,
                        help="KL penalty to the starting model (TRL's beta; 0, TRL's default, in every run before it)")
    parser.add_argument("--lora-rank", type=int, default=64, help="LoRA rank (alpha = rank), the same for every method")
    parser.add_argument("--digits", type=int, default=1)
    parser.add_argument("--operands", type=int, default=2)
    parser.add_argument("--operators", default="+-")
    parser.add_argument("--num-train", type=int, default=None, help="default: arithmetic 140, chain 1000")
    parser.add_argument("--num-test", type=int, default=None, help="held-out problems (arithmetic 60, chain 64)")
    parser.add_argument("--distributive-fraction", type=float, default=None,
                        help="chain task: share of problems with two solution structures (default 0.5, the task's)")
    parser.add_argument("--factor-friendly", action="store_true",
                        help="chain task: distributive problems whose factored structure is the easy one (b + c = 10 "
                             "or b - c in 1..2), so that the structure choice changes the outcome")
    parser.add_argument("--samples", type=int, default=16, help="samples per held-out problem (pass@k up to this k)")
    parser.add_argument("--base-samples", type=int, default=None,
                        help="samples per held-out problem for the base model (default: --samples): evaluated once, "
                             "its sampling noise enters every paired gain, so more samples there buy power cheaply")
    parser.add_argument("--greedy-eval", action=argparse.BooleanOptionalAction, default=True,
                        help="also evaluate every model greedily (one sample a problem): a gain that greedy decoding "
                             "does not show is sharpening (off in runs made before it existed)")
    parser.add_argument("--base-temperatures", default="0.3,0.5,0.7,1.0",
                        help="temperatures the base model is also sampled at (once per grid, base.json): with its "
                             "greedy accuracy they give the sharpening baseline, the base at its best one")
    parser.add_argument("--eval-temperature", type=float, default=0.7)
    parser.add_argument("--eval-top-p", type=float, default=1.0)
    parser.add_argument("--eval-seed", type=int, default=1234)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is steadier on a busy machine)")
    parser.add_argument("--results-dir", default=RESULTS)
    parser.add_argument("--force", action="store_true", help="overwrite runs whose JSON has other settings")
    args = parser.parse_args(argv)
    if args.task != "chain" and args.distributive_fraction is not None:
        raise SystemExit("--distributive-fraction: only --task chain has solution structures")
    if args.lora_rank < 1:
        raise SystemExit(f"--lora-rank: a LoRA rank >= 1, got {args.lora_rank}")
    if args.base_samples is not None and args.base_samples < args.samples:
        raise SystemExit(f"--base-samples: at least --samples ({args.samples}), so that the base model has every "
                         f"pass@k the trained ones have; got {args.base_samples}")
    if args.task != "chain" and args.factor_friendly:
        raise SystemExit("--factor-friendly: only --task chain has solution structures")
    for key, value in TASKS[args.task]["defaults"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    torch.set_num_threads(args.threads)
    methods = [m.strip() for m in (args.methods or ",".join(DEFAULT_METHODS[args.task])).split(",") if m.strip()]
    for method in methods:
        if method not in METHODS:
            raise SystemExit(f"--methods: unknown method {method!r}; choose from {list(METHODS)}")
        if method in CHAIN_ONLY and args.task != "chain":
            raise SystemExit(f"--methods: {method} needs the chain task's step checker and solution structures "
                             "(--task chain)")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    os.makedirs(args.results_dir, exist_ok=True)
    dataset = dataset_of(args)
    model_path = model_path_of(args)
    args.model_sha256 = warm_start_digest(model_path)
    task = ("chain (docs/testbed.md), rewards [accuracy, chain_format], held-out reward accuracy"
            if args.task == "chain" else f"built-in arithmetic ({args.digits}-digit, {args.operands} operands, "
            f"{args.operators!r}), reward final_number")
    info = dict(model=f"{args.model or TASKS[args.task]['model'] or 'SmolLM2-135M-Instruct'} (LoRA r=64, all linear "
                      f"layers)",
                task=task, device="cuda" if torch.cuda.is_available() else "cpu", threads=torch.get_num_threads())

    base_path = os.path.join(args.results_dir, "base.json")
    base_args = base_eval_args(args)
    # greedy_eval is not checked here: base_by_temperature adds the base's greedy accuracy to an older base.json
    if load_if_same(base_path, tuple(k for k in EVAL_KEYS if k != "greedy_eval"), base_args) is None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        report = evaluate_model(model, tokenizer, dataset["test"], base_args)
        with open(base_path, "w") as f:
            json.dump(dict(settings={k: getattr(base_args, k) for k in EVAL_KEYS}, info=info, eval=report), f,
                      indent=1)
        print(f"base: accuracy {report['accuracy']:.3f} pass@{base_args.samples} "
              f"{report['pass_at_k'][str(base_args.samples)]:.3f} ({report['eval_seconds']:.0f} s) -> {base_path}",
              flush=True)
        del model
    base_by_temperature(base_path, base_args, dataset, model_path)

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
