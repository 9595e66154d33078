"""Question: Does any method beat GRPO, with the seeds to tell (the tiny testbed)?

The tiny-testbed grid: every method against GRPO, its learning rate tuned on seeds and problems kept apart, then
16+ paired seeds (docs/testbed.md#the-tiny-testbed, BENCHMARKS.md section 4).

One command runs it all and resumes (a run whose JSON exists with the same settings is skipped)::

    python benchmarks/tiny/tiny_grid.py                 # build the model if needed, sweep, grid, report
    python benchmarks/tiny/tiny_grid.py --phase report  # tables and figures from the JSONs only

1. **Sweep** (``sweep/``): each method at each of ``--learning-rates`` on the sweep seeds (``--sweep-seeds``,
   100 and 101: never reported) and on *validation* problems (256, disjoint from the training and the held-out
   ones). A method's learning rate is the one with the best mean area under its validation learning curve
   (accuracy at steps 0, 10, ..., ``--steps``, trapezoids, divided by the steps): the fastest learner at this budget,
   not the last point alone.
2. **Grid**: each method at its learning rate on ``--seeds`` (default 0-15), the same seed for every method: the
   same initial model, the same prompts at every step (TRL's sampler draws them from ``seed``), evaluated on the
   same 256 held-out problems x 8 samples with the same evaluation seed, with the training prompt.
3. **Report** (``benchmarks/tiny/tiny_report.py``): tables, paired differences to GRPO, figures, the claims table.

Runs are spread over ``--workers`` processes of one thread each. Every run records its training and evaluation CPU
seconds. Methods: trl_credit.testbed.runner.METHODS (``process`` only where ``credit="process"`` exists) and
:data:`VARIANTS` (not in the default list: name them with ``--methods``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
import time

RESULTS_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
RESULTS = os.path.join(RESULTS_ROOT, "tiny")
RUN_KEYS = ("steps", "eval_every", "eval_samples", "model_digest", "passk_samples", "passk_problems")
#: the validation problems of the sweep: drawn apart from the train and test splits of sums.make_dataset
VALIDATION_SEED, VALIDATION_SIZE = 7, 256


#: Grid methods that are a testbed method with other fields, named so that the difference shows in their file names:
#: name -> (the testbed method, its fields replaced). "prime_filter": PRIME at the current defaults, the paper's prompt
#: filter (Algorithm 1: 0.2 < group accuracy < 0.8, no truncated row) and the recipe's PRM clip of 10.0, where the
#: testbed's "prime" pins the settings of its committed rows (no filter, clip 1.0) (issue 62).
VARIANTS = {"prime_filter": ("prime", dict(prime_prompt_filter=True, prime_grad_clip=10.0))}


def method_spec(name: str) -> dict:
    """The testbed's ``runner.method_spec`` of ``name``, or of a :data:`VARIANTS` entry."""
    from trl_credit.testbed import runner

    if name in VARIANTS:
        base, fields = VARIANTS[name]
        spec = runner.method_spec(base)
        return dict(spec, fields=dict(spec["fields"], **fields))
    return runner.method_spec(name)


def _setup_worker():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    from transformers.utils import logging

    logging.set_verbosity_error()


def validation_split():
    import random

    from datasets import Dataset

    from trl_credit.tasks import sums

    data = sums.make_dataset()
    taken = {sums.question_digits(q) for split in ("train", "test") for q in data[split]["question"]}
    problems = sums.make_problems(VALIDATION_SIZE, random.Random(VALIDATION_SEED), exclude=taken)
    return Dataset.from_dict({"prompt": [p.question for p in problems], "question": [p.question for p in problems],
                              "answer": [str(p.answer) for p in problems]})


def committed_model(results_dir: str, regime: str = "tiny") -> str | None:
    """The model the committed results were measured on (``<results_dir>/model``), when it is the regime's recipe's:
    a rebuild on a CPU with other kernels may differ in the last bits, and every run records the weights' digest,
    so the committed weights keep a grid resumable on any machine."""
    from trl_credit.testbed.regimes import regime_recipe

    path = os.path.join(results_dir, "model")
    if not os.path.exists(os.path.join(path, "build.json")):
        return None
    with open(os.path.join(path, "build.json")) as f:
        return path if json.load(f)["digest"] == regime_recipe(regime).digest() else None


def area_under_curve(curve: list[dict], key: str = "accuracy") -> float:
    """Mean ``key`` (accuracy at the training temperature, or greedy accuracy) over the run: trapezoids over the
    evaluated steps, divided by the last step."""
    points = sorted((c["step"], c[key]) for c in curve)
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(points, points[1:]))
    return area / (points[-1][0] - points[0][0])


def one_run(job: dict) -> dict:
    """A worker's job: train one (method, learning rate, seed), evaluate it, write its JSON."""
    _setup_worker()
    from trl_credit.testbed import runner

    spec = method_spec(job["method"])
    test = validation_split() if job["split"] == "validation" else None
    base = job["base"]
    # pass@k up to passk_samples at the last evaluation of the reported runs (the sweep picks by its curves only)
    passk = job["passk_samples"] if job["split"] == "test" else 0
    result = runner.run(spec["trainer"], spec["config"], seed=job["seed"], learning_rate=job["learning_rate"],
                        steps=job["steps"], eval_every=job["eval_every"], eval_samples=job["eval_samples"],
                        test=test, trainer_kwargs=spec["kwargs"], model_path=job["model_path"],
                        final_passk_samples=passk, passk_problems=job["passk_problems"],
                        **runner.method_fields(spec, job["learning_rate"]))
    result["curve"].insert(0, dict(base, step=0, generated_tokens=0, generate_calls=0))
    result.update(method=job["method"], seed=job["seed"], learning_rate=job["learning_rate"], split=job["split"],
                  settings={k: job[k] for k in RUN_KEYS}, auc=area_under_curve(result["curve"]),
                  greedy_auc=area_under_curve(result["curve"], "greedy_accuracy"))
    with open(job["path"], "w") as f:
        json.dump(result, f)
    return dict(path=job["path"], auc=result["auc"], final=result["curve"][-1]["accuracy"],
                cpu=result["train_cpu_seconds"] + result["eval_cpu_seconds"])


def base_report(split: str, args, model_path: str, path: str) -> dict:
    """The starting model's evaluation (step 0 of every curve: the same model and evaluation seed for all)."""
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if saved["settings"] == _settings(args):
            return saved["eval"]
    _setup_worker()
    from transformers import LlamaForCausalLM

    from trl_credit.tasks import sums
    from trl_credit.testbed import runner
    from trl_credit.testbed.model import make_tokenizer
    from trl_credit.testbed.profile import base_profile

    data = sums.make_dataset()
    test = validation_split() if split == "validation" else data["test"]
    model = LlamaForCausalLM.from_pretrained(model_path)
    start = time.process_time()
    report = runner.evaluate(model, make_tokenizer(), test, samples=args.eval_samples, greedy=True)
    report["eval_cpu_seconds"] = time.process_time() - start
    saved = dict(settings=_settings(args), eval=report)
    if split == "test":  # the base at each temperature, the sharpening baseline, pass@k up to 64, all-fail groups
        saved["profile"] = base_profile(model, make_tokenizer(), test, data["train"], samples=args.eval_samples,
                                        passk_samples=args.passk_samples, passk_problems=args.passk_problems)
        report["pass_at_k_large"] = saved["profile"]["pass_at_k_large"]
    with open(path, "w") as f:
        json.dump(saved, f)
    return report


def _settings(args) -> dict:
    return {k: getattr(args, k) for k in RUN_KEYS}


def _done(job: dict, args) -> bool:
    """The job's JSON exists with the same settings and learning rate (a grid run at another rate is redone)."""
    if not os.path.exists(job["path"]):
        return False
    with open(job["path"]) as f:
        saved = json.load(f)
    return saved.get("settings") == _settings(args) and saved.get("learning_rate") == job["learning_rate"]


def describe_run(done: dict) -> str:
    return (f"AUC {done['auc']:.3f}, final {done['final']:.3f}, {done['cpu']:.0f} CPU s -> "
            f"{os.path.relpath(done['path'])}")


def run_jobs(jobs: list[dict], workers: int, run=None, describe=describe_run) -> None:
    """Every job (``method``, ``learning_rate``, ``seed``, ...) through ``run`` (default :func:`one_run`) in
    ``workers`` spawned processes, a line per finished run (``describe(result)``); a failed run is reported and the
    grid goes on. benchmarks/tools/tool_grid.py runs its own jobs through it."""
    if not jobs:
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(run or one_run, job): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):
            job = futures[future]
            try:
                done = future.result()
            except Exception as error:  # one failed run is reported and the grid goes on
                print(f"FAILED {job['method']} lr {job['learning_rate']} seed {job['seed']}: {error!r}", flush=True)
                continue
            print(f"{job['method']} lr {job['learning_rate']:g} seed {job['seed']}: {describe(done)}", flush=True)


def chosen_learning_rates(sweep_dir: str, methods, rates, select_by: str = "auc") -> dict:
    """Per method, the learning rate of ``rates`` with the best mean sweep AUC (tiny_report.sweep_choices)."""
    import tiny_report

    return {m: c for m, c in tiny_report.sweep_choices(sweep_dir, rates, select_by).items() if m in methods}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--phase", choices=("all", "sweep", "grid", "report"), default="all")
    parser.add_argument("--regime", default="tiny",
                        help="the testbed model's regime (trl_credit.testbed.regimes: tiny, trap); results go to "
                             "benchmarks/results/<regime> unless --results-dir says otherwise")
    parser.add_argument("--methods", default=None, help="comma-separated (default: every method available)")
    parser.add_argument("--seeds", default="0-15", help="reported seeds, e.g. 0-15 or 0,1,2")
    parser.add_argument("--sweep-seeds", default="100,101", help="seeds of the learning-rate sweep (never reported)")
    parser.add_argument("--learning-rates", default="3e-4,1e-3,3e-3")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-samples", type=int, default=8)
    parser.add_argument("--passk-samples", type=int, default=64,
                        help="samples per problem for pass@k at the last evaluation of a reported run (0: none)")
    parser.add_argument("--passk-problems", type=int, default=128,
                        help="the first this many held-out problems get the pass@k samples")
    parser.add_argument("--select-by", choices=("auc", "greedy_auc"), default="auc",
                        help="the sweep picks each method's learning rate by its mean area under the validation "
                             "curve of accuracy at the training temperature (auc) or of greedy accuracy")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--results-dir", default=None, help="default: benchmarks/results/<regime>")
    parser.add_argument("--model", default=None,
                        help="a testbed model folder (default: the committed build in <results-dir>/model when its "
                             "recipe is the default one, else the default recipe's build)")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package
    _setup_worker()
    from trl_credit.testbed import runner
    from trl_credit.testbed.model import testbed_model_path

    from trl_credit.testbed.regimes import regime_recipe

    args.results_dir = args.results_dir or os.path.join(RESULTS_ROOT, args.regime)
    model_path = (args.model or committed_model(args.results_dir, args.regime)
                  or testbed_model_path(regime_recipe(args.regime), progress=True))
    with open(os.path.join(model_path, "build.json")) as f:
        args.model_digest = json.load(f)["weights_sha256"]
    methods = [m for m in (args.methods.split(",") if args.methods else runner.METHODS) if m]
    available = []
    for method in methods:
        try:
            method_spec(method)
            if method == "process":
                import trl_credit.process  # noqa: F401
            available.append(method)
        except (ImportError, AttributeError, ValueError) as error:
            print(f"{method}: not available here ({error}); skipped", flush=True)
    rates = [float(r) for r in args.learning_rates.split(",")]
    seeds = _seeds(args.seeds)
    sweep_dir = os.path.join(args.results_dir, "sweep")
    os.makedirs(sweep_dir, exist_ok=True)
    common = dict(steps=args.steps, eval_every=args.eval_every, eval_samples=args.eval_samples,
                  model_digest=args.model_digest, model_path=model_path, passk_samples=args.passk_samples,
                  passk_problems=args.passk_problems)
    if args.phase in ("all", "sweep"):
        base = base_report("validation", args, model_path, os.path.join(sweep_dir, "base.json"))
        jobs = [dict(common, method=m, learning_rate=r, seed=s, split="validation", base=base,
                     path=os.path.join(sweep_dir, f"{m}_lr{r:g}_seed{s}.json"))
                for s in _seeds(args.sweep_seeds) for r in rates for m in available]
        run_jobs([j for j in jobs if not _done(j, args)], args.workers)
    if args.phase in ("all", "grid"):
        chosen = chosen_learning_rates(sweep_dir, available, rates, args.select_by)
        base = base_report("test", args, model_path, os.path.join(args.results_dir, "base.json"))
        jobs = [dict(common, method=m, learning_rate=chosen[m]["learning_rate"], seed=s, split="test", base=base,
                     path=os.path.join(args.results_dir, f"{m}_seed{s}.json"))
                for s in seeds for m in available if m in chosen]
        run_jobs([j for j in jobs if not _done(j, args)], args.workers)
    if args.phase in ("all", "report"):
        import tiny_report

        tiny_report.main(["--results-dir", args.results_dir, "--select-by", args.select_by])


def _seeds(text: str) -> list[int]:
    if "-" in text and "," not in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",") if s.strip()]


if __name__ == "__main__":
    main()
