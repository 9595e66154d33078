"""GPU check: every trainer in bf16 on CUDA, every trainer under DeepSpeed ZeRO-2/3 on one GPU, overhead ratios vs GRPO
at 256-512 tokens.

Made for one H200 with no network (torch, transformers, accelerate, peft installed; trl, datasets, deepspeed and
our other pure-Python dependencies travel as wheels) and a budget of under 8 minutes. The model is
SmolLM2-135M-Instruct's *shape* with random weights (config and tokenizer from the local copy; no weights travel),
LoRA r64 on all projections, two reward functions (``accuracy`` first: a deterministic coin flip per completion, so
groups have reward variance and every method's credit path runs; ``format`` second: always 1).

Parts (results in ``<out>/gpu_check.json``; ``<out>/zero{2,3}.log`` hold the DeepSpeed runs' output):

1. ``overhead``: for each method and completion length (default 256 and 512), a GRPOTrainer with the method's
   shared settings (``benchmarks/harness.py``: rollouts per prompt, temperature, loss type) and the method's
   trainer, stepped alternately (GRPO, method, GRPO, ...) in bf16 on CUDA; per step: seconds, loss (finite?),
   generated tokens. Reported: median step-time ratio with its range over the paired steps, token ratio. This
   part is also the "each trainer a few bf16 CUDA steps" check.
2. ``deepspeed``: ``python -m accelerate.commands.launch --config_file examples/accelerate_configs/zero{2,3}.yaml
   --num_processes 1 benchmarks/gpu_check.py --worker ...`` (``accelerate launch`` of the same interpreter): every
   trainer (``DEEPSPEED_TRAINERS``: the GRPO control, Cue-GRPO, OPPO with the self- and the teacher oracle, DATPO
   with a user-built embedder, SRPO with scored and generated localization, CreditTrainer resets x OPPO, the
   process credit) ``train()``s a few short steps under ZeRO-2 and ZeRO-3 and saves its adapter (checked
   non-empty: ZeRO-3 shards parameters); each result records the ZeRO stage the trainer ran under and is written as
   soon as the trainer is done (a timeout keeps the finished ones; ``not_run`` lists the others). One process per
   stage: two DeepSpeed ranks cannot share the one GPU (NCCL). The 2-process comparisons with DDP are the CPU
   tests' (tests/engines/test_deepspeed.py); ``--deepspeed-cpu`` runs this part on a CPU with the ``*_cpu.yaml`` configs
   (tests/test_gpu_check.py, marker ``deepspeed``).

vLLM is not part of it: vLLM's CUDA wheels (hundreds of MB with their torch) do not fit the 64 MiB that travel to
the device machine, which has no network; the vLLM tests run on vLLM's CPU build (docs/platforms.md).

Random weights generate until ``max_completion_length`` (no EOS), so every rollout has the full length: the ratios
are the cost at that length. What a method generates past the base rollouts depends on the text (SRPO's thought
boundaries, DATPO's fork entropies), which random text does not resemble; the ratios bound cost, not learning.
DATPO gets a stand-in embedder (hash-seeded unit vectors; the 88 MB MiniLM wheel does not fit the 64 MiB of
wheels), so its time excludes embedding, which is small next to generation. In the DeepSpeed part its embedder is
a 2-layer random encoder of the assets' vocabulary built by the user after the config (``model_embedder``), as a
sentence-transformers model is: under ZeRO-3 it is born partitioned, which DATPO must undo.

Here (any machine with the local SmolLM2 copy), once, in the repository root::

    echo /.whl/ >> .git/info/exclude; echo /.gpu_assets/ >> .git/info/exclude
    python benchmarks/gpu_check.py --prepare-assets .gpu_assets      # config + tokenizer, ~3.5 MB
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \\
        trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0 \\
        latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 pysbd==0.3.4 hjson pydantic==2.13.4 \\
        pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
    DS_BUILD_OPS=0 python3 -m pip wheel --no-deps --no-build-isolation -w .whl deepspeed==0.19.8  # pure Python

(``--only-binary`` cannot fetch DeepSpeed, which PyPI has as a source archive only; ``pip wheel`` with
``DS_BUILD_OPS=0`` builds it without compiling any op. Its other needs, einops, msgpack, ninja and py-cpuinfo,
are on the device image. Fetched this way on 2026-11-30: 14 wheels, 7.0 MB; with the assets 10.5 MB of 64 MiB.) Then, on the device machine, with ``carry`` =
``[".whl", ".gpu_assets"]``::

    bash benchmarks/gpu_check.sh        # writes $OUT/gpu_check.json, $OUT/zero2.log, $OUT/zero3.log

Checked here on the CPU: ``--dry-run`` (prints the plan) and ``--device cpu --tiny`` (a 2-layer model of the
same vocabulary, a few tokens) run in the fast tests (``tests/test_gpu_check.py``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

ALL_METHODS = ["cue_grpo", "oppo", "datpo", "srpo"]
# The DeepSpeed part's trainers: name -> (benchmarks/harness.py method whose settings it takes, config overrides).
DEEPSPEED_TRAINERS = {
    "grpo": ("grpo", {}),
    "cue_grpo": ("cue_grpo", {}),
    "oppo": ("oppo", {}),
    "oppo_teacher": ("oppo", {"oracle": "teacher"}),  # the teacher: the policy's random model, loaded again
    "datpo": ("datpo", {}),
    "srpo_scored": ("srpo", {"localization": "scored"}),
    "srpo_generate": ("srpo", {"localization": "generate"}),
    "resets_oppo": ("srpo_oppo", {}),
    "process": ("grpo", {"credit": "process"}),  # CreditTrainer with ProcessCredit(step_reward=step_coin_flips)
}
ASSET_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "chat_template.jinja", "special_tokens_map.json"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out", help="Results folder ($OUT).")
    parser.add_argument("--assets", default=os.path.join(ROOT, ".gpu_assets"),
                        help="Folder with SmolLM2-135M-Instruct's config.json and tokenizer (see --prepare-assets).")
    parser.add_argument("--prepare-assets", metavar="DIR", default=None,
                        help="Copy config + tokenizer of the local SmolLM2 copy to DIR and exit.")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="A 2-layer model of the assets' vocabulary (CPU test).")
    parser.add_argument("--methods", default=",".join(ALL_METHODS), help="Comma-separated, from " + ",".join(ALL_METHODS))
    parser.add_argument("--lengths", default="256,512", help="Completion lengths of the overhead part.")
    parser.add_argument("--prompts", type=int, default=2, help="Prompts per step (rows = prompts x rollouts).")
    parser.add_argument("--steps", type=int, default=2, help="Timed paired steps per method and length.")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed paired steps before them.")
    parser.add_argument("--budget-s", type=float, default=160.0,
                        help="Seconds for the overhead part; steps not started by then are skipped (and listed).")
    parser.add_argument("--skip-deepspeed", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true", help="Only the DeepSpeed part.")
    parser.add_argument("--deepspeed-cpu", action="store_true",
                        help="Run the DeepSpeed part on the CPU (zero{2,3}_cpu.yaml, one stage after the other).")
    parser.add_argument("--deepspeed-trainers", default=",".join(DEEPSPEED_TRAINERS),
                        help="Comma-separated, from " + ",".join(DEEPSPEED_TRAINERS))
    parser.add_argument("--deepspeed-length", type=int, default=64, help="Completion length of the DeepSpeed runs.")
    parser.add_argument("--deepspeed-steps", type=int, default=2)
    parser.add_argument("--deepspeed-timeout-s", type=int, default=210,
                        help="For the two ZeRO runs, which run side by side on the one GPU (after the timed part).")
    parser.add_argument("--dry-run", action="store_true", help="Print the plan as JSON and exit.")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # inside accelerate launch
    parser.add_argument("--zero", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.out = os.path.abspath(args.out)
    args.methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(args.methods) - set(ALL_METHODS))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {ALL_METHODS}")
    args.deepspeed_trainers = [m for m in args.deepspeed_trainers.split(",") if m]
    unknown = sorted(set(args.deepspeed_trainers) - set(DEEPSPEED_TRAINERS))
    if unknown:
        parser.error(f"--deepspeed-trainers: unknown {unknown}; choose from {list(DEEPSPEED_TRAINERS)}")
    args.lengths = [int(x) for x in args.lengths.split(",") if x]
    if any(n < 1 for n in args.lengths) or args.steps < 1 or args.warmup < 0 or args.prompts < 1:
        parser.error("--lengths, --steps and --prompts must be >= 1 and --warmup >= 0")
    return args


def deepspeed_command(args, stage: int) -> list[str]:
    config = f"zero{stage}_cpu.yaml" if args.device == "cpu" else f"zero{stage}.yaml"
    return [  # `accelerate launch` of this interpreter (the one whose site has DeepSpeed)
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        os.path.join(ROOT, "examples", "accelerate_configs", config),
        "--num_processes", "1", "--main_process_port", str(29500 + 10 * stage), os.path.abspath(__file__), "--worker", "--zero", str(stage),
        "--assets", args.assets, "--out", args.out, "--deepspeed-trainers", ",".join(args.deepspeed_trainers),
        "--lengths", str(args.deepspeed_length), "--steps", str(args.deepspeed_steps), "--device", args.device,
    ] + (["--tiny"] if args.tiny else [])


def runs_deepspeed(args) -> bool:
    return not args.skip_deepspeed and (args.device == "cuda" or args.deepspeed_cpu)


def plan(args) -> dict:
    return {
        "overhead": [] if args.skip_overhead else [
            {"method": m, "length": n, "paired_steps": args.warmup + args.steps} for n in args.lengths
            for m in args.methods],
        "overhead_budget_s": args.budget_s,
        "deepspeed": [" ".join(deepspeed_command(args, stage)) for stage in (2, 3)] if runs_deepspeed(args) else [],
        "deepspeed_trainers": args.deepspeed_trainers if runs_deepspeed(args) else [],
        "out": os.path.join(args.out, "gpu_check.json"),
    }


# --------------------------------------------------------------------------------------------------- set-up pieces


def prepare_assets(target: str) -> str:
    from trl_credit.models import default_model_path

    source = default_model_path()
    os.makedirs(target, exist_ok=True)
    for name in ASSET_FILES:
        if os.path.exists(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), os.path.join(target, name))
    return target


def build_random_model(assets: str, target: str, tiny: bool, dtype) -> str:
    """SmolLM2-135M's architecture (or a 2-layer miniature) with random weights, saved with the tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(assets)
    if tiny:
        config.update(dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(assets)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def accuracy(completions, **kwargs):
    """Stand-in verifier: a deterministic coin flip per completion text (random weights never solve anything)."""
    return [float(hashlib.sha256(_text(c).encode()).digest()[0] % 2) for c in completions]


def format_reward(completions, **kwargs):
    """Stand-in format check, true for every row (the user scenario's second reward function)."""
    return [1.0 for _ in completions]


def _text(completion) -> str:
    return completion[-1]["content"] if isinstance(completion, list) else str(completion)


class HashEmbedder:
    """Stand-in sentence embedder for DATPO: a unit vector seeded by the text's hash."""

    def encode(self, texts, convert_to_tensor=False, **kwargs):
        import torch

        rows = []
        for text in texts:
            generator = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little"))
            vector = torch.randn(64, generator=generator)
            rows.append(vector / vector.norm())
        out = torch.stack(rows) if rows else torch.zeros(0, 64)
        return out if convert_to_tensor else out.numpy()


def step_coin_flips(prompt, completion, steps, **row):
    """Stand-in step checker for the process credit: a deterministic coin flip per step text."""
    return [float(hashlib.sha256(step.encode()).digest()[0] % 2) for step in steps]


def model_embedder(assets: str):
    """Stand-in sentence embedder built from a transformers model, as a sentence-transformers model is (a
    ``torch.nn.Module`` holding one): a 2-layer random encoder of the assets' vocabulary, mean-pooled and normalized.
    Built by the user after the training config, so under ZeRO-3 transformers creates it partitioned, and DATPO must
    make it whole."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    class ModelEmbedder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            config = AutoConfig.from_pretrained(assets)
            config.update(dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=8))
            self.encoder = AutoModel.from_config(config)
            self.tokenizer = AutoTokenizer.from_pretrained(assets)
            if self.tokenizer.pad_token is None:
                self.tokenizer.pad_token = self.tokenizer.eos_token

        def encode(self, texts, convert_to_tensor=False, **kwargs):
            weight = self.encoder.get_input_embeddings().weight
            batch = self.tokenizer(list(texts), return_tensors="pt", padding=True, truncation=True, max_length=64)
            with torch.no_grad():
                hidden = self.encoder(**batch.to(weight.device)).last_hidden_state.float()
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1), dim=-1).cpu()
            return vectors if convert_to_tensor else vectors.numpy()

    return ModelEmbedder()


def make_trainer(method_name: str, like: str, model_path: str, out_dir: str, length: int, args, settings=None):
    """``method_name`` = "grpo" (a GRPOTrainer with the shared settings of method ``like``) or ``like`` itself."""
    import harness
    import torch

    from trl_credit.tasks.data import make_arithmetic_dataset

    on_gpu = args.device == "cuda"
    settings = dict(
        max_completion_length=length, max_steps=args.warmup + args.steps, learning_rate=1e-6, logging_steps=1,
        save_strategy="no", report_to="none", seed=0, use_cpu=not on_gpu, bf16=on_gpu,
        model_init_kwargs={"dtype": torch.bfloat16 if on_gpu else torch.float32},
    ) | (settings or {}) | dict(_prompts=args.prompts)
    if method_name == "grpo":
        config = harness.method_config("grpo", out_dir, settings, grpo_like=like)
    else:
        config = harness.method_config(like, out_dir, settings)
    dataset = make_arithmetic_dataset(num_train=64, num_test=4, seed=0)["train"]
    trainer_class, _ = harness.classes("grpo" if method_name == "grpo" else like)
    kwargs = dict(embedder=HashEmbedder()) if method_name == "datpo" and getattr(config, "use_diversity", False) else {}
    return trainer_class(model=model_path, reward_funcs=[accuracy, format_reward], args=config, train_dataset=dataset,
                         peft_config=harness.lora_config(), **kwargs)


class TokenCounter:
    """Counts tokens of every generation call (TRL's ``_generate_single_turn``, which all extra calls go through)."""

    def __init__(self, trainer):
        self.tokens = 0
        self.calls = 0
        original = trainer._generate_single_turn

        def counted(*a, **kw):
            result = original(*a, **kw)
            self.tokens += sum(len(ids) for ids in result[0])
            self.calls += 1
            return result

        trainer._generate_single_turn = counted


def timed_step(trainer, batches, device: str) -> tuple[float, float]:
    """One optimizer step as ``Trainer`` takes it (generation batch = step with these settings): seconds, loss."""
    import torch

    batch = next(batches)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    loss = trainer.training_step(trainer.model, batch, None)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.optimizer.zero_grad()
    trainer.state.global_step += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, float(loss.detach().float().cpu())


# --------------------------------------------------------------------------------------------------- the parts


def overhead_part(args, model_path: str, work: str, deadline: float) -> dict:
    import harness

    results, skipped = {}, []
    for length in args.lengths:
        for method in args.methods:
            key = f"{method}@{length}"
            if time.perf_counter() > deadline:
                skipped.append(key)
                continue
            runs = {}
            try:
                for name in ("grpo", method):
                    trainer = make_trainer(name, method, model_path, os.path.join(work, key, name), length, args)
                    runs[name] = dict(trainer=trainer, counter=TokenCounter(trainer),
                                      batches=harness.prepare_manual_stepping(trainer), seconds=[], losses=[], tokens=[])
                for step in range(args.warmup + args.steps):
                    if time.perf_counter() > deadline and step >= args.warmup + 1:
                        skipped.append(f"{key} step {step}+")
                        break
                    for run in runs.values():
                        before = run["counter"].tokens
                        seconds, loss = timed_step(run["trainer"], run["batches"], args.device)
                        if step >= args.warmup:
                            run["seconds"].append(seconds)
                            run["tokens"].append(run["counter"].tokens - before)
                        run["losses"].append(loss)
                results[key] = summarize_pair(runs["grpo"], runs[method], method)
            except Exception as error:  # record and go on: one broken method must not hide the others
                results[key] = {"error": f"{type(error).__name__}: {error}"}
            finally:
                for run in runs.values():
                    del run["trainer"]
                _free_memory(args.device)
    return {"results": results, "skipped": skipped}


def summarize_pair(grpo: dict, method: dict, name: str) -> dict:
    ratios = [m / g for m, g in zip(method["seconds"], grpo["seconds"])]
    token_ratios = [m / g for m, g in zip(method["tokens"], grpo["tokens"]) if g]
    trainer = method["trainer"]
    metrics = {k: float(v[-1]) for k, v in trainer._metrics.get("train", {}).items()
               if v and "/" in k and k.split("/")[0] not in {"completions", "rewards", "clip_ratio", "sampling"}}
    return {
        "grpo_step_s": grpo["seconds"], f"{name}_step_s": method["seconds"],
        "step_time_ratio_median": statistics.median(ratios) if ratios else None,
        "step_time_ratio_range": [min(ratios), max(ratios)] if ratios else None,
        "grpo_tokens": grpo["tokens"], f"{name}_tokens": method["tokens"],
        "token_ratio_median": statistics.median(token_ratios) if token_ratios else None,
        "losses_finite": all(math.isfinite(x) for x in grpo["losses"] + method["losses"]),
        "grpo_losses": grpo["losses"], f"{name}_losses": method["losses"],
        "method_metrics_last_step": metrics,
    }


def deepspeed_trainer(name: str, model_path: str, out_dir: str, args):
    """Trainer ``name`` of ``DEEPSPEED_TRAINERS`` with the worker's settings (rewards [accuracy, format], LoRA)."""
    import harness
    import torch

    from trl_credit import CreditConfig, CreditTrainer
    from trl_credit.process.parts import ProcessCredit
    from trl_credit.tasks.data import make_arithmetic_dataset

    like, overrides = DEEPSPEED_TRAINERS[name]
    on_gpu = args.device == "cuda"
    settings = dict(
        max_completion_length=args.lengths[0], max_steps=args.steps, learning_rate=1e-6, logging_steps=1,
        save_strategy="no", report_to="none", seed=0, use_cpu=not on_gpu, bf16=on_gpu,
        model_init_kwargs={"dtype": torch.bfloat16 if on_gpu else torch.float32}, _prompts=args.prompts,
    )
    if overrides.get("oracle") == "teacher":
        overrides = dict(overrides, teacher_model_name_or_path=model_path,
                         teacher_model_init_kwargs=settings["model_init_kwargs"])
    dataset = make_arithmetic_dataset(num_train=64, num_test=4, seed=0)["train"]
    rewards, kwargs = [accuracy, format_reward], dict(peft_config=harness.lora_config())
    if name == "process":  # GRPO's settings (8 rollouts per prompt) in a CreditConfig
        config = CreditConfig(output_dir=out_dir, num_generations=8, temperature=0.7, top_p=0.95,
                              per_device_train_batch_size=args.prompts * 8,
                              **{k: v for k, v in settings.items() if k != "_prompts"}, **overrides)
        return CreditTrainer(model_path, rewards, args=config, train_dataset=dataset,
                             credit=ProcessCredit(step_reward=step_coin_flips), **kwargs)
    config = harness.method_config(like, out_dir, settings | overrides)
    trainer_class, _ = harness.classes(like)
    if name == "datpo" and getattr(config, "use_diversity", False):
        kwargs["embedder"] = model_embedder(args.assets)  # after the config, as a user's script does
    return trainer_class(model=model_path, reward_funcs=rewards, args=config, train_dataset=dataset, **kwargs)


def deepspeed_worker(args) -> None:
    """Inside ``accelerate launch`` with a ZeRO config: each trainer trains a few steps and saves its adapter."""
    import torch
    from safetensors import safe_open

    work = tempfile.mkdtemp(prefix=f"gpu_check_zero{args.zero}_")
    model_path = build_random_model(args.assets, os.path.join(work, "model"), args.tiny,
                                    torch.bfloat16 if args.device == "cuda" else torch.float32)
    results = {}
    path = os.path.join(args.out, f"zero{args.zero}.json")
    os.makedirs(args.out, exist_ok=True)
    for method in args.deepspeed_trainers:
        out_dir = os.path.join(work, method)
        start = time.perf_counter()
        try:
            trainer = deepspeed_trainer(method, model_path, out_dir, args)
            trainer.train()
            trainer.save_model(out_dir)
            plugin = trainer.accelerator.state.deepspeed_plugin if trainer.is_deepspeed_enabled else None
            entry = {"seconds": time.perf_counter() - start, "steps": trainer.state.global_step,
                     "zero_stage": None if plugin is None else plugin.zero_stage,
                     "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e]}
            if trainer.accelerator.is_main_process:
                with safe_open(os.path.join(out_dir, "adapter_model.safetensors"), "pt") as f:
                    numels = [f.get_slice(k).get_shape() for k in f.keys()]
                entry["adapter_tensors"] = len(numels)
                entry["adapter_empty_tensors"] = sum(1 for shape in numels if math.prod(shape) == 0)
            results[method] = entry
            del trainer
        except Exception as error:
            results[method] = {"error": f"{type(error).__name__}: {error}",
                               "seconds": time.perf_counter() - start}
        _free_memory(args.device)
        with open(path, "w") as f:  # after each trainer: a timeout keeps what finished
            json.dump(results, f, indent=2)
    print(json.dumps({f"zero{args.zero}": results}, indent=2))


def deepspeed_part(args) -> dict:
    """ZeRO-2 and ZeRO-3 side by side on a GPU (a functional check, not timed against anything: the GPU has room for
    both), one after the other on a CPU (``--deepspeed-cpu``)."""
    procs, logs, codes, start = {}, {}, {}, time.perf_counter()
    side_by_side = args.device == "cuda"
    for stage in (2, 3):
        logs[stage] = open(os.path.join(args.out, f"zero{stage}.log"), "w")
        procs[stage] = subprocess.Popen(deepspeed_command(args, stage), stdout=logs[stage], stderr=subprocess.STDOUT,
                                        cwd=ROOT)
        if not side_by_side:
            codes[stage] = _wait(procs[stage], args.deepspeed_timeout_s - (time.perf_counter() - start))
    out = {}
    for stage, proc in procs.items():
        code = codes[stage] if stage in codes else _wait(proc, args.deepspeed_timeout_s - (time.perf_counter() - start))
        logs[stage].close()
        result_file = os.path.join(args.out, f"zero{stage}.json")
        results = json.load(open(result_file)) if os.path.exists(result_file) else None
        if results is not None:
            os.remove(result_file)  # merged into gpu_check.json (at most 8 files come back from $OUT)
        missing = [m for m in args.deepspeed_trainers if m not in (results or {})]
        out[f"zero{stage}"] = {"exit": code, "seconds": time.perf_counter() - start, "results": results,
                               "not_run": missing}
    return out


def _wait(proc, seconds: float):
    """``proc``'s exit status, or "timeout" (killed) when it runs past ``seconds``."""
    try:
        return proc.wait(timeout=max(1.0, seconds))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "timeout"


def _free_memory(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def environment(device: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if device == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    for name in ("transformers", "trl", "peft", "accelerate", "deepspeed", "datasets"):
        try:
            env[name] = version(name)
        except PackageNotFoundError:
            env[name] = None
    return env


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.prepare_assets:
        print(prepare_assets(args.prepare_assets))
        return 0
    if args.dry_run:
        print(json.dumps(plan(args), indent=2))
        return 0
    if args.worker:
        deepspeed_worker(args)
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda but no GPU is visible; use --device cpu --tiny for a CPU run", file=sys.stderr)
        return 2
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu_check_")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model_path = build_random_model(args.assets, os.path.join(work, "model"), args.tiny, dtype)
    report = {"environment": environment(args.device), "plan": plan(args)}
    if not args.skip_overhead:
        report["overhead"] = overhead_part(args, model_path, work, deadline=start + args.budget_s)
    if runs_deepspeed(args):
        report["deepspeed"] = deepspeed_part(args)
    report["elapsed_s"] = time.perf_counter() - start
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
