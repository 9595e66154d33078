"""Golden values of the trainers: record them, or run a scenario and compare it with them (tests/test_golden.py).

###############################################################################################################
#  REGENERATING THE GOLDEN FILES IS ONLY ALLOWED WHEN A CHANGE IS *MEANT* TO CHANGE NUMBERS.                  #
#                                                                                                             #
#      python -m tests.golden.record            # rewrites tests/golden/one_process.json and two_processes.json #
#                                                                                                             #
#  A refactor (moving trainer glue into a shared core, renaming internals, reordering code) must reproduce    #
#  these files as they are: if tests/test_golden.py fails after such a change, the change is wrong, not the   #
#  golden files. Regenerate only for a deliberate change of behaviour (a bug fix that changes advantages, a    #
#  new RNG use, a TRL upgrade), say so in the commit message, and name which values moved and why.            #
###############################################################################################################

What is pinned, per scenario (a trainer, a loss type, LoRA or not, the method's options; fixed seed, tiny model of
tests/tiny.py, two reward functions, 2 optimizer steps), per step:

- ``generated``: every completion TRL's generation primitive (``GRPOTrainer._generate_single_turn``) returned, in
  call order: base rollouts, and the methods' extra generations (DATPO branches, SRPO seeds, localization and
  suffixes), plus a digest of the prompt rows they continued;
- ``loss_calls``: for every call of ``GRPOTrainer._compute_loss`` (what a method hands to TRL's loss), the rows'
  completion ids and mask, prompt lengths and a digest of the prompt ids, the advantages (per row or per token),
  the old/reference/sampling log-probs when present, and the returned loss;
- ``log``: every metric logged for the step (``trainer.state.log_history``, timing keys left out);

and at the end ``params``: the count, sum and sum of squares of the trainable parameters.

Configs: every constructor field of each config class is passed explicitly, from the defaults recorded in the
golden file (``config_defaults``) overlaid with the scenario's own settings, so a later change of a config default
cannot change a golden run. The comparison (``compare``) is exact for integers and strings (token ids, masks,
counts, steps) and within rtol 1e-6 / atol 1e-7 for floats, ``grad_norm`` within rtol 1e-5, ``params/sum`` within
PARAMS_SUM_ULPS float32 ulps of sqrt(sum_of_squares) (it can cancel to near 0), and OPPO's floats within
NOISE_MARGIN times their round-off band (``noise``: tests/golden/noise.py; see tests/test_golden.py for why). Each
file stores the versions and the CPU kind it was recorded with (``environment``) and those its bands were measured
with (``noise_environment``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from typing import Any

import tests.benchmarks_path  # noqa: F401  (benchmarks/ on sys.path: the harness package)
from harness.machine import cpu_kind  # noqa: E402
from tests.golden import noise  # noqa: E402

GOLDEN_DIR = os.path.dirname(os.path.abspath(__file__))
ONE_PROCESS_FILE = os.path.join(GOLDEN_DIR, "one_process.json")
TWO_PROCESSES_FILE = os.path.join(GOLDEN_DIR, "two_processes.json")
TWO_PROCESS_SCRIPT = "tests/mp_scripts/golden_two_processes.py"

RTOL, ATOL = 1e-6, 1e-7
# grad_norm is the norm of every gradient coordinate, a float32 reduction whose order follows the CPU's vector
# kernels (AVX-512 vs AVX2 lanes): two machines of one kind gave 1.2e-6 relative apart on Cue-GRPO's. 1e-5 admits
# that reordering (~log2(#parameters) ulps) and no change of the gradients, which moves the advantages first.
GRAD_NORM_RTOL = 1e-5
# A quantity with a measured round-off band (tests/golden/noise.py: OPPO's floats under a one-ulp change of its
# log-probs) may differ by NOISE_MARGIN times that band: the band is the largest of 4 draws, and other kernels'
# rounding landed within 0.4x of it for the advantages and 1.1x for any value (measured, tests/test_golden.py).
NOISE_MARGIN = 3.0
# params/sum is a sum of every trainable parameter, which can cancel to near 0 (srpo/dapo-self-lora: -0.36 from 44k
# parameters of size ~0.07), where rtol means nothing: parameters one float32 ulp apart (another CPU's kernels), in
# random directions, move it by ~2^-24 sqrt(sum_of_squares) (8.4e-7 there; an AMD EPYC gave 1.1e-6 against the Xeon
# that recorded it). It may differ by PARAMS_SUM_ULPS times that; sum_of_squares, which does not cancel, keeps rtol.
PARAMS_SUM_ULPS = 16.0
SEED = 0
# Wall-clock values: never reproducible, never golden.
TIMING_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time")
# Tensors of the loss inputs that carry numbers TRL's loss reads (besides advantages and the row masks).
LOGP_KEYS = ("old_per_token_logps", "ref_per_token_logps", "sampling_per_token_logps", "importance_sampling_ratio")


# ---------------------------------------------------------------------------------------------------- rewards
def _text(completion) -> str:
    from trl_credit.tasks.rewards import completion_text

    return completion_text(completion)


def parity_accuracy_reward(completions, answer, **kwargs):
    """The verifier (first reward function, so ``success_reward`` picks it): 1.0 when the completion's length has
    the parity of the reference answer. A stand-in for ``accuracy_reward`` that a random tiny model passes about
    half the time, so groups have correct and incorrect completions and every method's mechanism runs."""
    return [float(len(_text(c)) % 2 == int(a) % 2) for c, a in zip(completions, answer)]


def short_format_reward(completions, **kwargs):
    """A format-like second reward: 0.5 for a short completion. It moves TRL's advantages but never correctness."""
    return [0.5 * float(len(_text(c)) < 16) for c in completions]


def first_alone_partition(completions, prompt):
    """Cue-GRPO ``partition_fn``: the first positive completion is a strategy of its own, the others share one, so
    a positive set of 3 or more splits into clusters of unequal sizes and the rarity weights differ."""
    return [0] + [1] * (len(completions) - 1)


REWARD_FUNCS = [parity_accuracy_reward, short_format_reward]

# ---------------------------------------------------------------------------------------------------- scenarios
# Settings every scenario shares; each scenario adds or overrides its own. Everything else comes from the recorded
# constructor defaults (see module docstring), so these need not repeat TRL's defaults, but the ones that shape the
# numbers are written out here to be read.
COMMON = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=8,
    max_steps=2,
    learning_rate=2e-2,
    gradient_accumulation_steps=1,
    num_iterations=1,
    temperature=1.0,
    top_p=1.0,
    beta=0.0,
    weight_decay=0.0,
    scale_rewards="group",
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    use_cpu=True,
    bf16=False,
    disable_tqdm=True,
    seed=SEED,
)
# LoRA scenarios also train with a KL term (beta > 0): the reference log-probs then reach the loss.
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
WITH_LORA = dict(learning_rate=5e-2, beta=0.04)

SRPO_COMMON = dict(
    reset_groups=1, suffixes_per_reset=2, seed_source="fresh", seed_candidates_per_round=2, max_seed_rounds=2,
    thought_delimiter=" ", rollout_template="Q: {question}",
    localization_template="P: {question}\n{steps}\nFirst wrong step (1 to {num_steps})?", localization_max_tokens=6,
    reset_seed=SEED,
)
DATPO_COMMON = dict(
    per_device_train_batch_size=4,  # one prompt per step: its tree is up to 4 base rows + 4 x 2 x 2 branches
    max_forks=2, max_branches=2, difficulty_adaptive=True, branch_budget="remaining", value_estimate="subtree",
    diversity_alpha=0.2, diversity_alpha_final=0.0, diversity_alpha_schedule="linear", rows_per_forward=8,
)

# name -> (trainer class name in trl / trl_credit, config class name, settings, LoRA?, extra trainer kwargs)
SCENARIOS: dict[str, tuple[str, str, dict, bool, dict]] = {
    # The control: plain TRL, the harness itself must be deterministic.
    "grpo/grpo": ("GRPOTrainer", "GRPOConfig", dict(loss_type="grpo"), False, {}),
    "grpo/dapo-lora": ("GRPOTrainer", "GRPOConfig", dict(loss_type="dapo", **WITH_LORA), True, {}),
    "cue_grpo/grpo": (
        "CueGRPOTrainer", "CueGRPOConfig",
        dict(loss_type="grpo", cue_partition="callable", cue_weighting="cr", cue_alpha=0.8),
        False, dict(partition_fn=first_alone_partition),
    ),
    "cue_grpo/dapo-lora": (
        "CueGRPOTrainer", "CueGRPOConfig",
        dict(loss_type="dapo", cue_partition="callable", cue_weighting="uarl", cue_alpha=0.5, **WITH_LORA),
        True, dict(partition_fn=first_alone_partition),
    ),
    "oppo/grpo": (
        "OPPOTrainer", "OPPOConfig", dict(loss_type="grpo", oracle="self", plain_logps="auto"), False, {},
    ),
    "oppo/dapo-lora": (
        "OPPOTrainer", "OPPOConfig", dict(loss_type="dapo", oracle="self", plain_logps="recompute", **WITH_LORA),
        True, {},
    ),
    "oppo/dr_grpo": (
        "OPPOTrainer", "OPPOConfig", dict(loss_type="dr_grpo", oracle="self", plain_logps="auto"), False, {},
    ),
    "datpo/dapo": (
        "DATPOTrainer", "DATPOConfig",
        dict(DATPO_COMMON, loss_type="dapo", fork_method="sent_entropy", fork_fallback="tok_entropy",
             use_diversity=True),
        False, {},
    ),
    "datpo/grpo-lora": (
        "DATPOTrainer", "DATPOConfig",
        dict(DATPO_COMMON, loss_type="grpo", fork_method="tok_entropy", use_diversity=True, **WITH_LORA),
        True, {},
    ),
    "datpo/bnpo": (  # not difficulty-adaptive: every base rollout forks max_forks times into max_branches branches
        "DATPOTrainer", "DATPOConfig",
        dict(DATPO_COMMON, loss_type="bnpo", fork_method="fixed_seg", difficulty_adaptive=False, use_diversity=False,
             rows_per_forward=3),
        False, {},
    ),
    "srpo/grpo-random": ("SRPOTrainer", "SRPOConfig", dict(SRPO_COMMON, loss_type="grpo", reset="random"), False, {}),
    "srpo/dapo-self-lora": (
        "SRPOTrainer", "SRPOConfig", dict(SRPO_COMMON, loss_type="dapo", reset="self", **WITH_LORA), True, {},
    ),
}

# 2 processes (torchrun, gloo): one scenario per method; same global batch as the 1-process scenario it follows.
TWO_PROCESS_SCENARIOS: dict[str, tuple[str, str, dict, bool, dict]] = {
    name: (trainer, config, dict(settings, per_device_train_batch_size=settings.get(
        "per_device_train_batch_size", COMMON["per_device_train_batch_size"]) // 2), lora, extra)
    for name, (trainer, config, settings, lora, extra) in SCENARIOS.items()
    if name in ("grpo/grpo", "cue_grpo/grpo", "oppo/grpo", "datpo/dapo", "srpo/grpo-random")
}


# ---------------------------------------------------------------------------------------------------- configs
def _field_default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise ValueError(f"config field {field.name} has no default")


def constructor_defaults(config_class) -> dict:
    """Every constructor field of ``config_class`` with its default (``output_dir`` aside, it is the run's)."""
    return {
        f.name: _field_default(f) for f in dataclasses.fields(config_class) if f.init and f.name != "output_dir"
    }


def config_defaults_record() -> dict:
    """The defaults to store: GRPOConfig's in full, then per method config only what differs from them."""
    from trl import GRPOConfig

    import trl_credit

    base = constructor_defaults(GRPOConfig)
    record = {"GRPOConfig": base}
    for name in ("CueGRPOConfig", "OPPOConfig", "DATPOConfig", "SRPOConfig"):
        own = constructor_defaults(getattr(trl_credit, name))
        record[name] = {k: v for k, v in own.items() if k not in base or base[k] != v}
    return json.loads(json.dumps(record))


# Config fields added after the golden files were recorded, pinned to the behaviour the recorded runs had (a field
# the recorded defaults hold keeps the recorded value): SRPO's localization was the decoded answer with a uniform
# draw when unparsed, before `localization` existed and its default became the scored choice.
NEWER_FIELDS = {"SRPOConfig": dict(localization="generate", localization_fallback="random")}


def build_config(config_name: str, settings: dict, defaults: dict, output_dir: str):
    """The scenario's config with every constructor field passed explicitly (recorded defaults + settings)."""
    config_class = _resolve(config_name)
    values = dict(defaults["GRPOConfig"])
    if config_name != "GRPOConfig":
        values.update(defaults[config_name])
        for name, value in NEWER_FIELDS.get(config_name, {}).items():
            values.setdefault(name, value)
    values.update(COMMON)
    values.update(settings)
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(config_class) if f.init})
    if unknown:
        raise TypeError(f"{config_name} no longer has the fields {unknown} (configs must keep their fields)")
    return config_class(output_dir=output_dir, **values)


def _resolve(name: str):
    import trl

    import trl_credit

    return getattr(trl_credit, name, None) or getattr(trl, name)


# ---------------------------------------------------------------------------------------------------- capture
def _f32(values) -> Any:
    """Nested lists of a float32 tensor, each number as the shortest decimal that reads back to the same float32
    (exact, and half the size of float64's 17 digits)."""
    import numpy as np

    if isinstance(values, list):
        return [_f32(v) for v in values]
    return float(str(np.float32(values)))


def _tensor(tensor) -> Any:
    tensor = tensor.detach().cpu()
    if tensor.dtype.is_floating_point:
        return _f32(tensor.float().tolist())
    return tensor.tolist()


def _digest(rows) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


class Recorder:
    """Collects one scenario's generations and loss inputs, per optimizer step (``trainer.state.global_step`` at
    the time of the call: the step being computed)."""

    def __init__(self):
        self.steps: dict[int, dict] = {}

    def _step(self, trainer) -> dict:
        return self.steps.setdefault(
            trainer.state.global_step, {"generated": [], "generated_prompts": [], "loss_calls": []}
        )

    def generation(self, trainer, prompt_ids, completion_ids):
        step = self._step(trainer)
        step["generated"].extend([list(map(int, ids)) for ids in completion_ids])
        step["generated_prompts"].extend([list(map(int, ids)) for ids in prompt_ids])

    def loss_call(self, trainer, inputs, loss):
        prompt_mask = inputs["prompt_mask"].bool()
        prompt_rows = [row[mask].tolist() for row, mask in zip(inputs["prompt_ids"].cpu(), prompt_mask.cpu())]
        call = {
            "prompt_lengths": [len(row) for row in prompt_rows],
            "prompt_digest": _digest(prompt_rows),
            "completion_ids": _tensor(inputs["completion_ids"]),
            "completion_mask": _tensor(inputs["completion_mask"]),
            "advantages": _tensor(inputs["advantages"]),
        }
        for key in LOGP_KEYS:
            if inputs.get(key) is not None:
                call[key] = _tensor(inputs[key])
        call["loss"] = _tensor(loss)
        self._step(trainer)["loss_calls"].append(call)

    def steps_record(self) -> list[dict]:
        records = []
        for index in sorted(self.steps):
            step = dict(self.steps[index])
            step["generated_prompts"] = _digest(step["generated_prompts"])
            records.append({"step": index, **step})
        return records


@contextlib.contextmanager
def capturing(recorder: Recorder):
    """Wraps TRL's loss and generation primitives (class attributes, restored on exit) and runs torch on one
    thread: a CPU matmul's float result depends on how many threads split its reductions."""
    import torch
    from trl import GRPOTrainer

    real_loss, real_generate = GRPOTrainer._compute_loss, GRPOTrainer._generate_single_turn

    def _compute_loss(self, model, inputs):
        loss = real_loss(self, model, inputs)
        recorder.loss_call(self, inputs, loss)
        return loss

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        completion_ids, logprobs = real_generate(self, prompt_ids, *args, **kwargs)
        recorder.generation(self, prompt_ids, completion_ids)
        return completion_ids, logprobs

    threads = torch.get_num_threads()
    GRPOTrainer._compute_loss, GRPOTrainer._generate_single_turn = _compute_loss, _generate_single_turn
    torch.set_num_threads(1)
    try:
        yield recorder
    finally:
        GRPOTrainer._compute_loss, GRPOTrainer._generate_single_turn = real_loss, real_generate
        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------- runs
def make_dataset():
    from trl_credit.tasks.data import make_arithmetic_dataset

    return make_arithmetic_dataset(num_train=8, num_test=2, seed=SEED)["train"]


def run_scenario(scenario: tuple, model_dir: str, output_dir: str, defaults: dict) -> dict:
    """Train one scenario for its steps and return its record (JSON-ready)."""
    import torch
    from peft import LoraConfig
    from transformers import set_seed

    trainer_name, config_name, settings, lora, extra = scenario
    args = build_config(config_name, settings, defaults, output_dir)
    recorder = Recorder()
    with capturing(recorder):
        # The LoRA weights are drawn while the trainer is built, before Trainer.__init__ seeds: seed first.
        set_seed(SEED)
        trainer = _resolve(trainer_name)(
            model=model_dir, reward_funcs=list(REWARD_FUNCS), args=args, train_dataset=make_dataset(),
            peft_config=LoraConfig(**LORA) if lora else None, **extra,
        )
        trainer.train()
    trainable = [p.detach().double() for p in trainer.model.parameters() if p.requires_grad]
    log = [{k: v for k, v in entry.items() if k not in TIMING_KEYS} for entry in trainer.state.log_history]
    record = {
        "steps": recorder.steps_record(),
        "log": log,
        "params": {
            "count": sum(p.numel() for p in trainable),
            "sum": float(sum(p.sum() for p in trainable)),
            "sum_of_squares": float(sum((p * p).sum() for p in trainable)),
        },
    }
    del trainer
    return json.loads(json.dumps(record))  # the types a golden file reads back (tuples -> lists)


# ---------------------------------------------------------------------------------------------------- compare
def compare(golden, fresh, path: str = "", bands: dict | None = None, rtol: float = RTOL, atol: float = ATOL) -> list[str]:
    """Differences between a golden record and a fresh one: integers, strings, booleans and None exactly, floats
    within ``rtol``/``atol`` (NaN equals NaN; a ``grad_norm`` within GRAD_NORM_RTOL) or, for a quantity with a
    measured round-off band (``bands``, tests/golden/noise.py, keyed by paths below ``path``), within NOISE_MARGIN
    times its band; same keys, same lengths. Returns one line per difference."""
    from tests.golden.noise import band_key

    def walk(golden, fresh, where: str, atol: float = atol) -> list[str]:
        if isinstance(golden, dict) and isinstance(fresh, dict):
            out = []
            if golden.keys() != fresh.keys():
                out.append(f"{where}: keys differ: only golden {sorted(golden.keys() - fresh.keys())}, "
                           f"only fresh {sorted(fresh.keys() - golden.keys())}")
            for key in golden.keys() & fresh.keys():
                here = atol
                if key == "sum" and isinstance(golden.get("sum_of_squares"), float):  # the params' statistics
                    here = max(atol, PARAMS_SUM_ULPS * 2.0**-24 * math.sqrt(golden["sum_of_squares"]))
                out.extend(walk(golden[key], fresh[key], f"{where}/{key}", here))
            return out
        if isinstance(golden, list) and isinstance(fresh, list):
            if len(golden) != len(fresh):
                return [f"{where}: length {len(fresh)} != golden {len(golden)}"]
            out = []
            for index, (g, f) in enumerate(zip(golden, fresh)):
                out.extend(walk(g, f, f"{where}[{index}]", atol))
            return out
        if isinstance(golden, float) and isinstance(fresh, float):
            if math.isnan(golden) and math.isnan(fresh):
                return []
            relative = max(rtol, GRAD_NORM_RTOL) if where.endswith("/grad_norm") else rtol
            if math.isclose(fresh, golden, rel_tol=relative, abs_tol=atol):
                return []
            band = (bands or {}).get(band_key(where[len(path):]), 0.0)
            if abs(fresh - golden) <= NOISE_MARGIN * band:
                return []
            allowed = f" (round-off band {band:.2g} x {NOISE_MARGIN})" if band else ""
            return [f"{where}: {fresh!r} != golden {golden!r}{allowed}"]
        if type(golden) is not type(fresh) or golden != fresh:
            return [f"{where}: {fresh!r} != golden {golden!r}"]
        return []

    return walk(golden, fresh, path)


def load(path: str) -> dict:
    with open(path) as file:
        return json.load(file)


# ---------------------------------------------------------------------------------------------------- recording
def environment() -> dict:
    import peft
    import torch
    import transformers
    import trl

    return {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__,
            "peft": peft.__version__, "python": sys.version.split()[0], "cpu": cpu_kind()}


def record_one_process(model_dir: str, work_dir: str) -> dict:
    defaults = config_defaults_record()
    runs = {}
    for name, scenario in SCENARIOS.items():
        print(f"recording {name}", flush=True)
        runs[name] = run_scenario(scenario, model_dir, os.path.join(work_dir, name.replace("/", "_")), defaults)
    return {"environment": environment(), "config_defaults": defaults, "settings": scenario_settings(SCENARIOS),
            "runs": runs, "noise": noise.one_process_noise(model_dir, work_dir, defaults, runs),
            "noise_environment": environment()}


def two_process_runs(model_dir: str, work_dir: str, defaults: dict, noise: bool) -> list[dict]:
    """Both ranks' records of the 2-process scenarios (with ``noise``: also their perturbed reruns, ``noise_runs``)."""
    from tests.mp import run_torchrun

    defaults_file = os.path.join(work_dir, "config_defaults.json")
    with open(defaults_file, "w") as file:
        json.dump(defaults, file)
    run_torchrun(TWO_PROCESS_SCRIPT, model_dir, work_dir, defaults_file, *(["noise"] if noise else []), nproc=2)
    return [load(os.path.join(work_dir, f"rank{rank}.json")) for rank in (0, 1)]


def record_two_processes(model_dir: str, work_dir: str) -> dict:
    defaults = config_defaults_record()
    ranks = two_process_runs(model_dir, work_dir, defaults, noise=True)
    return {"environment": environment(), "config_defaults": defaults, "settings": scenario_settings(TWO_PROCESS_SCENARIOS),
            "runs": {name: [rank["runs"][name] for rank in ranks] for name in TWO_PROCESS_SCENARIOS},
            "noise": noise.two_process_noise(ranks), "noise_environment": environment()}


def scenario_settings(scenarios: dict) -> dict:
    """What each scenario sets on top of the recorded defaults (stored so the test notices an edited scenario)."""
    return json.loads(json.dumps({
        name: {"trainer": trainer, "config": config, "settings": {**COMMON, **settings}, "lora": LORA if lora else None,
               "extra": sorted(extra)}
        for name, (trainer, config, settings, lora, extra) in scenarios.items()
    }))


def _write(path: str, record: dict) -> None:
    with open(path, "w") as file:
        json.dump(record, file, indent=None, separators=(",", ":"))
        file.write("\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=GOLDEN_DIR, help="folder for the JSON files (default: tests/golden)")
    parser.add_argument("--only", choices=("one", "two"), help="record only the 1-process or 2-process file")
    parser.add_argument(
        "--noise-only", action="store_true",
        help="keep the recorded values; only (re)measure the round-off bands of tests/golden/noise.py and store "
             "them, with this machine's environment as `noise_environment`, in the existing files",
    )
    options = parser.parse_args(argv)
    for name, value in (("HF_HUB_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false"), ("WANDB_MODE", "disabled")):
        os.environ.setdefault(name, value)
    from tests.tiny import build_tiny_model

    os.makedirs(options.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="golden_")
    one_file, two_file = os.path.join(options.out, "one_process.json"), os.path.join(options.out, "two_processes.json")
    try:
        model_dir = build_tiny_model(os.path.join(work, "tiny_model"))
        if options.only in (None, "one"):
            if options.noise_only:
                record = load(one_file)
                record["noise"] = noise.one_process_noise(model_dir, work, record["config_defaults"], {})
                record["noise_environment"] = environment()
            else:
                record = record_one_process(model_dir, work)
            _write(one_file, record)
        if options.only in (None, "two"):
            two_dir = os.path.join(work, "two")
            os.makedirs(two_dir)
            if options.noise_only:
                record = load(two_file)
                runs = two_process_runs(model_dir, two_dir, record["config_defaults"], noise=True)
                record["noise"] = noise.two_process_noise(runs)
                record["noise_environment"] = environment()
            else:
                record = record_two_processes(model_dir, two_dir)
            _write(two_file, record)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
