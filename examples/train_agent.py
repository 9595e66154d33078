"""Train a tool-calling agent with TRL's `environment_factory`, under any trainer of the package (issue 60).

The environment is a key-value store, one per rollout: the model is asked for the value stored under a key, looks it
up with the `lookup` tool, hands it in with `submit`, and the environment owns the reward (`get_reward`: 1 when the
submitted value is the stored one). A two-turn task with one outcome at the end, where credit assignment decides
which turn earned it. Everything is TRL's API: an environment class with `reset`, tool methods with docstrings, and
`get_reward`; the trainer is chosen by a flag and nothing else changes:

    python examples/train_agent.py                       # GRPO (TRL's GRPOTrainer)
    python examples/train_agent.py --method oppo         # or cue_grpo, process, prime, srpo, datpo

Offline on a CPU in minutes: the default model is the tiny tool model (`trl_credit.testbed.tool_model`: a 2-layer
Qwen3 with TRL's qwen3 chat template), built on first use and warm-started for a few seconds on scripted episodes of
this environment (a third of them submitting a wrong value), so it calls the tools from the first step and has
something to learn. Any Hub model whose chat template TRL can parse tool calls from works the same
(`--model_name_or_path Qwen/Qwen3-0.6B`). Every field of the chosen method's config is a flag (`--oracle teacher`,
`--reset self`, `--loss_type dapo`, ...); `--config <recipe.yaml>` as in the other examples.

The run ends with a summary: reward, tool-call frequencies and the method's metrics from the first to the last step.
"""

import argparse
import json
import random
import sys
from dataclasses import dataclass, field

from datasets import Dataset
from trl import get_peft_config

from trl_credit.run_results import method_metric_names
from trl_credit.scripts import make_parser
from trl_credit.testbed.tool_model import TOOL_MODEL, tool_model_path
from trl_credit.trl_bridge.compat import hidden_library_deprecations

KEYS = ["apple", "pear", "plum", "fig", "kiwi", "lime", "date", "lemon"]


class KeyValueEnvironment:
    """A key-value store; the rollout's row (``store``, ``key``) sets it up, ``get_reward`` scores the submission."""

    def reset(self, store: str, key: str, **row) -> None:
        self.store = json.loads(store)
        self.key = key
        self.submitted = None
        # credit="process"'s turn rewards (process_step_reward="environment", docs/multiturn.md#turn-rewards): each
        # tool call's verdict, then None for the closing answer turn (the outcome, get_reward, scores the episode)
        self.turn_rewards = [None]
        return None  # the prompt already asks the question

    def lookup(self, key: str) -> str:
        """
        Look up the value stored under a key.

        Args:
            key: The key to look up.

        Returns:
            The value stored under the key.
        """
        self.turn_rewards.insert(-1, float(key == self.key))  # the asked key looked up
        if key not in self.store:
            raise KeyError(f"no key {key!r}; keys: {sorted(self.store)}")
        return str(self.store[key])

    def submit(self, value: int) -> str:
        """
        Submit the value found, once.

        Args:
            value: The value stored under the key asked for.

        Returns:
            A confirmation.
        """
        self.turn_rewards.insert(-1, float(self.submitted is None and value == self.store[self.key]))
        if self.submitted is not None:
            raise ValueError("already submitted")
        self.submitted = value
        return "submitted"

    def get_reward(self) -> float:
        return float(self.submitted == self.store[self.key])


def make_dataset(num_rows: int, num_keys: int, seed: int) -> Dataset:
    """Rows of one question each: a fresh store of ``num_keys`` keys with values 10-99, the key asked for, and the
    answer (OPPO's oracle reads the ``answer`` column; the environment checks the submission itself)."""
    rng = random.Random(seed)
    rows = {"prompt": [], "store": [], "key": [], "answer": []}
    for _ in range(num_rows):
        store = {k: rng.randint(10, 99) for k in rng.sample(KEYS, num_keys)}
        key = rng.choice(sorted(store))
        rows["prompt"].append([{"role": "user", "content": f"What is the value of {key}? Look it up, then submit it."}])
        rows["store"].append(json.dumps(store))
        rows["key"].append(key)
        rows["answer"].append(str(store[key]))
    return Dataset.from_dict(rows)


def scripted_episode(row: dict, wrong: bool, rng: random.Random) -> dict:
    """One episode played by a script through the environment's own tools: lookup, submit (a wrong value when
    ``wrong``), a closing sentence. The warm start's supervision: the format of the tool calls, not the task solved."""
    env = KeyValueEnvironment()
    env.reset(**row)
    value = int(env.lookup(row["key"]))
    submitted = value + rng.choice([-2, -1, 1, 2]) if wrong else value

    def call(name, arguments):
        return {"role": "assistant", "content": "",
                "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}

    messages = [
        *row["prompt"],
        call("lookup", {"key": row["key"]}),
        {"role": "tool", "name": "lookup", "content": str(value)},
        call("submit", {"value": submitted}),
        {"role": "tool", "name": "submit", "content": env.submit(submitted)},
        {"role": "assistant", "content": f"The value is {submitted}."},
    ]
    return {"messages": messages, "tools": [env.lookup, env.submit]}


def _trainers():
    """--method -> (trainer class, config class, the method's settings for this task)."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_credit import (CreditConfig, CreditTrainer, CueGRPOConfig, CueGRPOTrainer, DATPOConfig, DATPOTrainer,
                            OPPOConfig, OPPOTrainer, SRPOConfig, SRPOTrainer)
    return {
        "grpo": (GRPOTrainer, GRPOConfig, {}),
        "cue_grpo": (CueGRPOTrainer, CueGRPOConfig, {}),
        "oppo": (OPPOTrainer, OPPOConfig, dict(oracle="self")),
        # a step per model turn, scored by the environment's turn rewards, and the outcome as a last step
        "process": (CreditTrainer, CreditConfig, dict(credit="process", process_step_reward="environment",
                                                      process_outcome="final_step")),
        "prime": (CreditTrainer, CreditConfig, dict(credit="implicit_prm", prime_learning_rate=1e-3)),
        # 8 rows per prompt: 4 base rollouts + 1 reset x 4 suffixes; the agent's prompt unchanged
        "srpo": (SRPOTrainer, SRPOConfig, dict(rollout_template="none", thought_delimiter="\n",
                                               localization_max_tokens=8)),
        "datpo": (DATPOTrainer, DATPOConfig, dict(max_forks=2, max_branches=2)),
    }


METHODS = ["grpo", "cue_grpo", "oppo", "process", "prime", "srpo", "datpo"]


@dataclass
class AgentArguments:
    """The task's arguments (the method's config and ModelConfig give the rest)."""

    method: str = field(default="grpo", metadata={"help": f"The trainer: one of {METHODS}."})
    num_train: int = field(default=64, metadata={"help": "Training questions."})
    num_keys: int = field(default=4, metadata={"help": "Keys in each question's store."})
    task_seed: int = field(default=0, metadata={"help": "Seed of the questions and of the warm start's episodes."})
    warm_start_episodes: int = field(
        default=2048,  # fewer are memorized rather than learned: on 256, a new question's value is rarely copied
        metadata={"help": f"Scripted episodes the tiny tool model ({TOOL_MODEL}) is warm-started on before RL, a "
                          "third of them with a wrong submission (0: the random model, which never calls a tool)."},
    )
    warm_start_steps: int = field(default=400, metadata={"help": "Supervised steps of the warm start."})
    warm_start_batch_size: int = field(default=16, metadata={"help": "Episodes per supervised step of the warm start."})


def defaults(method: str) -> dict:
    """A short offline CPU run on the tiny tool model: 8 rollouts per prompt, 2 prompts per step."""
    import torch

    values = dict(
        model_name_or_path=TOOL_MODEL, output_dir=f"outputs/agent-{method}", max_steps=10,
        per_device_train_batch_size=16, num_generations=8, max_completion_length=160, learning_rate=5e-5,
        temperature=1.0, logging_steps=1, save_strategy="no", report_to="none", seed=42, loss_type="grpo",
        beta=0.0,
    )
    if not torch.cuda.is_available():
        values.update(use_cpu=True, bf16=False)
    return values


def main(argv: list[str] | None = None):
    """Parse the arguments, build the chosen trainer on the environment, train, save. Returns the trainer."""
    with hidden_library_deprecations():  # the library-internal checkpointing deprecations, as trl_credit.scripts.main
        return _main(sys.argv[1:] if argv is None else list(argv))


def _main(argv: list[str]):
    chosen = argparse.ArgumentParser(add_help=False)
    chosen.add_argument("--method", default="grpo", choices=METHODS)
    method = chosen.parse_known_args(argv)[0].method
    trainer_class, config_class, settings = _trainers()[method]

    parser = make_parser(config_class, {**defaults(method), **settings}, argv, script_arguments=AgentArguments)
    agent_args, training_args, model_args = parser.parse_args_and_config(args=argv)

    dataset = make_dataset(agent_args.num_train, agent_args.num_keys, agent_args.task_seed)
    model = model_args.model_name_or_path
    if model == TOOL_MODEL:
        rng = random.Random(agent_args.task_seed + 1)
        rows = make_dataset(agent_args.warm_start_episodes, agent_args.num_keys, agent_args.task_seed + 1)
        episodes = [scripted_episode(row, wrong=i % 3 == 2, rng=rng) for i, row in enumerate(rows)]
        model = tool_model_path(episodes or None, steps=agent_args.warm_start_steps,
                                batch_size=agent_args.warm_start_batch_size)

    trainer = trainer_class(
        model=model,
        reward_funcs=None,  # the environment owns the reward (get_reward)
        args=training_args,
        train_dataset=dataset,
        environment_factory=KeyValueEnvironment,
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(summary(trainer))
    return trainer


def summary(trainer) -> str:
    """Steps, then reward, tool calls and the method's metrics from the first to the last logged step."""
    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    name = getattr(trainer, "_name", type(trainer).__name__)
    steps = trainer.state.global_step
    lines = ["", f"== {name} agent run finished: {steps} optimizer step{'' if steps == 1 else 's'} =="]
    keys = ["reward", "tools/call_frequency", "tools/failure_frequency", *method_metric_names(history)]
    for key in keys:
        values = [entry[key] for entry in history if isinstance(entry.get(key), (int, float))]
        if values:
            lines.append(f"  {key:<32} {values[0]:.4g} -> {values[-1]:.4g}")
    lines.append(f"Saved to {trainer.args.output_dir}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
