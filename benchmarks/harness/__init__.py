"""Shared pieces of the side-by-side benchmarks (``overhead.py``, ``learning.py``).

- ``METHODS``: per method, the trainer/config classes and the offline settings of ``examples/train_<method>.py``
  (num_generations, temperature, loss_type, SRPO's "lines" template...). ``method_and_baseline_configs`` turns
  them into a method config and a GRPO config with exactly the same shared settings (every field GRPOConfig knows),
  so a ratio compares the method with GRPO on the same rollouts per prompt.
- ``Profiler``: wraps a trainer's ``_generate_single_turn`` (generated tokens, generation seconds), its no-grad
  log-prob passes, its reward calls, and method-specific functions (instance methods or module-level functions the
  trainers call), accumulating seconds/calls/tokens per component for the current step.
- ``build_trainer`` / ``run_step``: a trainer stepped by hand exactly as ``Trainer`` steps it (``training_step``,
  optimizer and scheduler steps), so steps of different trainers can be interleaved.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import time
from collections import defaultdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def fix_mmap_threshold(threshold: int = 65536) -> bool:
    """glibc only: serve every allocation of ``threshold`` bytes or more with its own mmap, returned to the system
    when freed (what the ``MALLOC_MMAP_THRESHOLD_`` environment variable does at start-up). glibc's default threshold
    grows with the largest freed block (up to 32 MB), after which the KV caches HF ``generate`` grows token by token
    come from the heap and fragment it: a DATPO step at 192 tokens reached 15 GB of resident memory on the CPU
    (killed for memory twice on a 24 GB machine) and stays near 5-10 GB with this.

    Not free: each KV-cache tensor a decode step re-allocates is then a fresh mmap, page-faulted and zeroed, which
    made a SmolLM2 decode step ~1.5x slower on this machine (8 rows x 300 cached tokens: 29 -> 48 ms per row-step;
    48 rows: 15 -> 23 ms). Every trl_credit trainer built to train on the CPU sets 128 KiB anyway
    (``trl_credit.core.mixins.return_freed_buffers``, docs/design.md#memory-on-the-cpu); the first setting in a process is
    kept, so ``overhead.py`` (``--mmap-threshold``, for its long DATPO trees) calls this before building trainers."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return True
    from trl_credit.core.mixins import return_freed_buffers

    return return_freed_buffers(threshold)


import torch  # noqa: E402

# Offline settings of examples/train_<method>.py (trl_credit.scripts.offline_defaults + per-method overrides).
# "shared" keys are GRPOConfig fields, given to the GRPO baseline as well; "own" keys only to the method; "tokens" is
# the example's max_completion_length (offline_defaults: 48; SRPO's example: 64), the baseline's too.
# OPPO's and SRPO's loss_type "grpo" (their papers' loss, set by their examples) is "own": the committed results
# were measured with it when it was those configs' default, next to GRPO baselines on TRL's default "dapo".
METHODS = {
    "grpo": dict(module="trl", trainer="GRPOTrainer", config="GRPOConfig", tokens=48,
                 shared=dict(num_generations=8, temperature=0.7, top_p=0.95), own={}),
    "cue_grpo": dict(module="trl_credit", trainer="CueGRPOTrainer", config="CueGRPOConfig", tokens=48,
                     shared=dict(num_generations=8, temperature=1.0, top_p=0.95), own={}),
    "oppo": dict(module="trl_credit", trainer="OPPOTrainer", config="OPPOConfig", tokens=48,
                 shared=dict(num_generations=4, temperature=0.7, top_p=0.95), own=dict(loss_type="grpo")),
    "datpo": dict(module="trl_credit", trainer="DATPOTrainer", config="DATPOConfig", tokens=48,
                  shared=dict(num_generations=4, temperature=1.0, top_p=0.95, loss_type="dapo"), own={}),
    # 8 = 4 base rollouts + 1 reset x 4 suffixes (the paper's 1x4 split); one thought per line (SmolLM2 does not
    # write </thought> reliably).
    "srpo": dict(module="trl_credit", trainer="SRPOTrainer", config="SRPOConfig", tokens=64,
                 shared=dict(num_generations=8, temperature=0.7, top_p=0.95, weight_decay=0.01),
                 own=dict(loss_type="grpo", rollout_template="lines", thought_delimiter="\n",
                          localization_max_tokens=32)),
}
# RRPO: SRPO's rollout with the reset drawn uniformly instead of localized by the policy (no localization call).
METHODS["rrpo"] = dict(METHODS["srpo"], trainer="SRPOTrainer", config="SRPOConfig",
                       own=dict(METHODS["srpo"]["own"], reset="random"))
# SRPO with its seeds drawn from the failed base rollouts (paper App. D) instead of fresh rollouts: the option's cost.
METHODS["srpo_base"] = dict(METHODS["srpo"], own=dict(METHODS["srpo"]["own"], seed_source="base"))
# A composed method (docs/composition.md): SRPO's resets with OPPO's token credit, in CreditTrainer + CreditConfig.
METHODS["srpo_oppo"] = dict(METHODS["srpo"], trainer="CreditTrainer", config="CreditConfig",
                            own=dict(METHODS["srpo"]["own"], rollout="resets", credit="oppo"))
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def classes(method: str):
    spec = METHODS[method]
    module = importlib.import_module(spec["module"])
    return getattr(module, spec["trainer"]), getattr(module, spec["config"])


def common_settings(prompts: int, tokens: int, steps: int, seed: int, learning_rate: float) -> dict:
    on_gpu = torch.cuda.is_available()
    return dict(
        max_completion_length=tokens, max_steps=steps, learning_rate=learning_rate, logging_steps=1,
        save_strategy="no", report_to="none", seed=seed, use_cpu=not on_gpu, bf16=on_gpu,
        model_init_kwargs={"dtype": torch.bfloat16 if on_gpu else torch.float32},
    ) | dict(_prompts=prompts)


def method_config(method: str, out_dir: str, settings: dict, grpo_like: str | None = None):
    """Config of ``method``; with ``grpo_like`` a GRPOConfig carrying the shared settings of method ``grpo_like``."""
    settings = dict(settings)
    prompts = settings.pop("_prompts")
    source = METHODS[grpo_like or method]
    if grpo_like is None:
        _, config_class = classes(method)
        kwargs = {**source["shared"], **source["own"]}
    else:
        from trl import GRPOConfig as config_class

        grpo_fields = {f.name for f in dataclasses.fields(config_class)}
        kwargs = {k: v for k, v in source["shared"].items() if k in grpo_fields}
    kwargs.update(settings)
    kwargs["per_device_train_batch_size"] = prompts * kwargs["num_generations"]
    return config_class(output_dir=out_dir, **kwargs)


def lora_config(rank: int = 64):
    """The benchmarks' LoRA: ``rank`` (64 in every run before learning.py's ``--lora-rank``), alpha = rank (scale 1)."""
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=rank, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")


class ModulePatches:
    """Functions replaced for the duration of a measurement (module-level ones the trainers look up at call time,
    or methods on an object), restored in reverse order by ``unpatch``."""

    def __init__(self):
        self._unpatch = []

    def replace(self, module, attr: str, replacement) -> None:
        self._unpatch.append((module, attr, getattr(module, attr)))
        setattr(module, attr, replacement)

    def unpatch(self):
        for module, attr, original in reversed(self._unpatch):
            setattr(module, attr, original)
        self._unpatch.clear()


class Profiler(ModulePatches):
    """Seconds, calls and generated tokens per component, for the step in progress (``reset`` between steps)."""

    def __init__(self):
        self.seconds = defaultdict(float)
        self.calls = defaultdict(int)
        self.tokens = defaultdict(int)
        self.rows = defaultdict(int)  # rows scored per no-grad pass component (OPPO's extra pass: B rows)
        self.events = []  # (component, rows, tokens per row) of every generation call of the step
        super().__init__()

    def reset(self):
        self.seconds.clear(), self.calls.clear(), self.tokens.clear(), self.rows.clear(), self.events.clear()

    def snapshot(self) -> dict:
        return dict(seconds=dict(self.seconds), calls=dict(self.calls), tokens=dict(self.tokens), rows=dict(self.rows))

    def timed(self, name: str, fn, count_tokens: bool = False, only_no_grad: bool = False, count_rows: bool = False):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if only_no_grad and torch.is_grad_enabled():
                return fn(*args, **kwargs)
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1
            if count_rows:  # _get_per_token_logps_and_entropies(model, input_ids, ...): rows scored
                self.rows[name] += int(args[1].size(0)) if len(args) > 1 else int(kwargs["input_ids"].size(0))
            if count_tokens:  # _generate_single_turn -> (completion_ids, logprobs); generate_from_prefixes alike
                lengths = [len(ids) for ids in result[0]]
                self.tokens[name] += sum(lengths)
                self.events.append((name, kwargs, lengths))
            return result

        return wrapper

    def wrap_method(self, obj, attr: str, name: str, **kw):
        # no silent skip: a timer whose method was renamed or moved fails here instead of reading as zero cost
        setattr(obj, attr, self.timed(name, getattr(obj, attr), **kw))

    def wrap_module_function(self, module, attr: str, name: str, **kw):
        self.replace(module, attr, self.timed(name, getattr(module, attr), **kw))


def instrument(trainer, method: str, profiler: Profiler) -> None:
    """Generic timers (generation + tokens, no-grad log-prob passes, rewards) and the method's own components."""
    profiler.wrap_method(trainer, "_generate_single_turn", "generation", count_tokens=True)
    profiler.wrap_method(trainer, "_get_per_token_logps_and_entropies", "logprob_passes (no grad)", only_no_grad=True,
                         count_rows=True)
    profiler.wrap_method(trainer, "_calculate_rewards", "rewards")
    if method == "cue_grpo":
        profiler.wrap_method(trainer.rarity_weights, "apply", "cue: cue extraction + partition + weights")
    elif method == "oppo":
        profiler.wrap_method(trainer.credit, "token_advantages", "oppo: oracle pass + recursion")
    elif method == "datpo":
        # the tree: forks + branches (the rollout's `grow`), block credit, training rows and their scoring
        for part, attr in ((trainer.rollout, "grow"), (trainer.credit, "advantages"),
                           (trainer.rollout, "training_batch")):
            profiler.wrap_method(part, attr, "datpo: tree (forks + branches + scoring)")
        import trl_credit.datpo.credit as datpo_credit
        import trl_credit.datpo.parts as datpo_module

        # module functions since the DATPO trainer was split (looked up at call time in the module that calls them)
        profiler.wrap_module_function(datpo_credit, "embedded_sibling_diversity", "datpo: sibling diversity (embedder)")
        profiler.wrap_module_function(datpo_module, "branch_rewards", "datpo: branch rewards")
        # branches go through `_generate_single_turn` (counted under "generation" too, tokens before the cut to
        # each fork's budget); this counter holds the branch calls alone (tokens after the cut)
        profiler.wrap_method(trainer.rollout, "generate_branches", "datpo: branch generation", count_tokens=True)
    elif method in ("srpo", "rrpo"):
        import trl_credit.srpo.localize as srpo_localize
        from trl_credit.core.context import BatchContext

        # Every SRPO generation call (seeds, suffixes, the decoded localization) is the batch context's public verb
        # `generate` (generate_from_prefixes); in an SRPO/RRPO run no other part calls it. Restored by unpatch.
        profiler.replace(BatchContext, "generate", profiler.timed("srpo: generate_from_prefixes",
                                                                  BatchContext.generate, count_tokens=True))
        profiler.wrap_module_function(srpo_localize, "answer_scores", "srpo: scored localization (forward)")
        profiler.wrap_method(trainer.rollout, "_collect_seeds", "srpo: seed verdicts (rewards)")


def srpo_token_breakdown(events, num_groups: int, base_size: int, per_round: int) -> dict:
    """Split SRPO's generation calls of one step by role, from their order (trl_credit/srpo/parts.py):
    call 1 = base rollouts + first seed candidates (per prompt: base_size rows then per_round rows), greedy calls
    = localization, the last sampled call = suffixes, other sampled calls = extra seed rounds."""
    calls = [(kwargs, lengths) for name, kwargs, lengths in events if name == "srpo: generate_from_prefixes"]
    out = defaultdict(int)
    if not calls:
        return {}
    sampled = [i for i, (kwargs, _) in enumerate(calls) if not kwargs.get("greedy")]
    for index, (kwargs, lengths) in enumerate(calls):
        if index == 0:
            block = base_size + per_round
            for row, length in enumerate(lengths):
                out["base rollouts" if row % block < base_size else "seed candidates (round 1)"] += length
        elif kwargs.get("greedy"):
            out["localization (greedy)"] += sum(lengths)
        elif index == sampled[-1]:
            out["suffixes"] += sum(lengths)
        else:
            out["seed candidates (later rounds)"] += sum(lengths)
    out["base_rows"] = num_groups * base_size
    return dict(out)


def build_trainer(method: str, config, model_path: str, dataset, reward_funcs, peft_config=None, **trainer_kwargs):
    """``trainer_kwargs``: the method's own constructor arguments (e.g. Cue-GRPO's ``partition_fn``)."""
    trainer_class, _ = classes(method) if not type(config).__name__ == "GRPOConfig" else classes("grpo")
    return trainer_class(model=model_path, reward_funcs=reward_funcs, args=config, train_dataset=dataset,
                         peft_config=peft_config, **trainer_kwargs)


def prepare_manual_stepping(trainer):
    trainer.create_optimizer_and_scheduler(num_training_steps=trainer.args.max_steps)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which we replace
    return iter(trainer.get_train_dataloader())


def run_step(trainer, batches) -> float:
    """One optimizer step as Trainer runs it (one generation batch = one step with these settings); seconds."""
    batch = next(batches)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    trainer.training_step(trainer.model, batch, None)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.optimizer.zero_grad()
    trainer.state.global_step += 1
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def last_metrics(trainer, prefix: str | None = None) -> dict:
    """Latest value of every metric in TRL's train buffer (optionally only names starting with ``prefix``)."""
    metrics = getattr(trainer, "_metrics", {}).get("train", {})
    return {k: float(v[-1]) for k, v in metrics.items() if v and (prefix is None or k.startswith(prefix))}
