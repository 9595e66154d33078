"""Every trainer, one after the other in one pair of processes, for the DeepSpeed tests (tests/engines/test_deepspeed.py).

usage: engine_trainers.py MODEL_DIR OUT_DIR NAME[,NAME...]
Launched under 2-process DDP (torchrun) or under ZeRO-2 / ZeRO-3 (``accelerate launch --config_file
examples/accelerate_configs/zero{2,3}_cpu.yaml``), with the same settings, so the runs can be compared row by row.
The trainers are built by tests/engine_trainers_common.py (the vLLM suite's too) with this suite's settings (``ENGINE``).
Each trainer trains 2 steps with sampled generation (TRL's own path: under ZeRO-3 the policy's weights are gathered
for generation, and DATPO's branches, SRPO's seeds / suffixes / localization and OPPO's oracle pass run as collective
forwards). It writes ``OUT_DIR/NAME.rank<R>.json``: the first generation batch as this process trains it (prompt
and completion ids, advantages, per token when they are), the logged losses and the number of steps.

The users' scenario: two reward functions (an accuracy-like verifier first, a format reward second). The frozen
helpers are loaded by the user after the config, as the docs show (``cue_judge``: a Cue-GRPO judge model;
``datpo``: ``load_default_embedder()``): under ZeRO-3 they are born partitioned. NAME ``lora``
trains OPPO with a LoRA adapter and saves it (``save_model``) to ``OUT_DIR/lora_adapter``. NAME ``prime`` /
``prime_lora``: PRIME (``credit="implicit_prm"``) with its PRM as a model copy / a second LoRA adapter; their report
also holds the PRM's parameters after its first update (``prm``). ``prime_lora`` runs with seed 2, whose first batch
leaves one process without a credited row (the prompt filter drops its group): under ZeRO-3 that process runs filler
PRM forwards to match the other's. NAME ``env_process`` / ``env_oppo`` / ``env_datpo``: the process credit / OPPO /
DATPO with TRL's ``environment_factory`` on the tool-calling tiny model (tests/tiny_tools.py); their rows also hold
TRL's ``tool_mask`` (DATPO's: its base rows, then its branch rows, whose tool loop resumed from the fork).

DATPO's branch calls do not compact their rows here, under any launcher (:func:`same_samples_on_every_launcher`).
"""

import json
import os
import sys
from dataclasses import replace

from tests.engine_trainers_common import Engine
from tests.engine_trainers_common import build as build_trainer
from tests.tiny import build_tiny_model  # noqa: F401  (keeps the tests package importable under the launchers)

NAMES = ("grpo", "cue_grpo", "cue_judge", "oppo", "oppo_teacher", "datpo", "srpo_scored", "srpo_generate",
         "resets_oppo", "process", "lora", "prime", "prime_lora")
#: Multi-turn: ``env_NAME`` trains NAME with TRL's environment_factory (MODEL_DIR: the tool-calling tiny model).
ENVIRONMENT_NAMES = ("env_process", "env_oppo", "env_datpo")


def accuracy_reward(completions, completion_ids, **kwargs):
    # a verifier of the completion's tokens: about half the rows are correct, whatever the (tiny, random) model says
    return [float(sum(ids) % 2) for ids in completion_ids]


def format_reward(completions, **kwargs):
    return [1.0 if len(c[0]["content"]) % 3 else 0.0 for c in completions]


def step_reward(prompt, completion, steps, **row):
    # a step is right while the token-length parity of the steps so far holds
    return [float(len(step) % 2) for step in steps]


def common_args():
    # Identical under DDP and DeepSpeed. use_cpu / bf16=False: what trl_credit.scripts.offline_defaults sets on a
    # CPU (under DeepSpeed, use_cpu=True also makes accelerate start gloo: without it each process runs alone).
    return dict(
        per_device_train_batch_size=4, num_generations=4, max_completion_length=12, max_steps=2, learning_rate=1e-3,
        seed=0, report_to="none", use_cpu=True, bf16=False, save_strategy="no", logging_steps=1, disable_tqdm=True,
    )


#: The DeepSpeed suite's engine settings (tests/engine_trainers_common.py builds every trainer from them).
ENGINE = Engine(
    args=common_args(),
    rewards=[accuracy_reward, format_reward],
    srpo=dict(seed_candidates_per_round=2, max_seed_rounds=2, thought_delimiter=" ", rollout_template="{question}",
              localization_template="{question}\n{steps}\n1-{num_steps}?", localization_max_tokens=4),
    lora=dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    step_reward=step_reward,
    overrides={"resets_oppo": dict(reset="random"), "prime_lora": dict(seed=2)},  # prime_lora: module docstring
)


#: The environment runs (``env_NAME``): tests/tiny_tools.py's MultiplyEnvironment, one per rollout, on "What is A
#: times B?"; room for a tool call (~30 tokens), its result and the answer; the process credit's steps are the model's
#: turns, scored by the environment's turn rewards, the outcome as a last step (docs/multiturn.md#turn-rewards).
ENVIRONMENT_ENGINE = replace(ENGINE, args={**ENGINE.args, "max_completion_length": 96}, step_reward="environment",
                             overrides={"process": dict(process_outcome="final_step")})


def same_samples_on_every_launcher():
    """Turn off the row compaction of DATPO's branch calls (trl_credit/generation/hooks.py) for every launcher.
    ZeRO-3 runs without it (a forward is a collective call there); DDP and ZeRO-2 compact. Compaction keeps each
    row's distribution, but after it the running rows draw from the sampling RNG in a smaller batch, so under one
    seed they sample other tokens than an uncompacted call: a DDP run would differ from ZeRO-3 in every branch
    sampled after a compaction (env_datpo on an AMD EPYC: first loss 0.105 under DDP, 0.044 under ZeRO-3; without
    compaction both 0.044). Compaction's own tokens are tested in tests/test_trl_helpers.py."""
    from trl_credit.generation import hooks

    hooks._can_compact = lambda model, kwargs: False


def build(name, model_dir, out_dir):
    if name in ENVIRONMENT_NAMES:
        from tests.tiny_tools import MultiplyEnvironment, multiply_dataset

        return build_trainer(name[len("env_"):], model_dir, os.path.join(out_dir, name), ENVIRONMENT_ENGINE,
                             train_dataset=multiply_dataset(8, seed=0), environment_factory=MultiplyEnvironment)
    if name not in NAMES:
        raise ValueError(f"NAME must be among {NAMES + ENVIRONMENT_NAMES}, got {name!r}")
    return build_trainer(name, model_dir, os.path.join(out_dir, name), ENGINE)


def run(name, model_dir, out_dir):
    trainer = build(name, model_dir, out_dir)
    first, prm = [], []
    generate = trainer._generate_and_score_completions

    def recording(inputs):  # the first generation batch, as this process will train it (made by the initial policy)
        output = generate(inputs)
        if not first:
            for i in range(output["completion_ids"].size(0)):
                mask = output["completion_mask"][i].bool()
                advantages = output["advantages"][i]
                first.append({
                    "prompt": output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist(),
                    "completion": output["completion_ids"][i][mask].tolist(),
                    "advantages": (advantages[mask] if advantages.dim() else advantages.reshape(1)).tolist(),
                })
                if "tool_mask" in output:  # multi-turn: 0 on the environment's results
                    first[-1]["tool_mask"] = output["tool_mask"][i][mask].tolist()
            if name.startswith("prime"):  # the PRM after its first update (update, then score: inside the batch)
                for p in trainer.credit.prm.parameters:
                    values = p.detach().double().flatten()
                    prm.append([float(values.sum()), float(values.abs().sum()), values[:8].tolist()])
        return output

    trainer._generate_and_score_completions = recording
    trainer.train()
    rank = trainer.accelerator.process_index
    report = {
        "rank": rank, "world": trainer.accelerator.num_processes, "steps": trainer.state.global_step,
        "deepspeed": bool(trainer.is_deepspeed_enabled),
        "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage if trainer.is_deepspeed_enabled else 0,
        "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
        "rows": first,
        "prm": prm,
    }
    if name == "lora":
        trainer.save_model(os.path.join(out_dir, "lora_adapter"))
    with open(os.path.join(out_dir, f"{name}.rank{rank}.json"), "w") as handle:
        json.dump(report, handle)
    del trainer
    import gc

    gc.collect()


def main(model_dir, out_dir, names):
    same_samples_on_every_launcher()
    for name in names.split(","):
        run(name, model_dir, out_dir)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, *sys.argv[1:])
