"""The tool regime (docs/testbed.md#the-tool-regime): a tiny Qwen3 pre-trained from scratch on key-chain episodes
(:mod:`trl_credit.tasks.keychain`) with a planted mis-copy, and its start statistics measured through TRL's own tool
loop.

:func:`build_tool_regime_model` is deterministic: the tiny tool model of :mod:`trl_credit.testbed.tool_model` (random
2-layer Qwen3, Qwen-format tokenizer, TRL's qwen3 template), then supervised steps on scripted episodes
(:func:`trl_credit.tasks.keychain.scripted_episode`, one thread, seeded). :func:`tool_regime_model_path` caches it
under ``~/.cache/trl_credit/testbed/tools-<digest>`` (``TRL_CREDIT_CACHE`` moves the root); the committed build is
``benchmarks/results/tools/model``.

:func:`tool_rollouts` plays episodes with ``GRPOTrainer``'s generation and tool loop (``environment_factory``): an
evaluation pass of a trainer whose recording reward reads each rollout's environment, so what it measures is what
a training step would generate. :func:`tool_profile` turns them into the start statistics: greedy accuracy, accuracy
and pass@k at temperature 1, the share of training groups of G all-fail, tool calls per episode, and the share of
episodes whose first wrong call is the planted one::

    python -m trl_credit.testbed.tool_regime [--build] [--results benchmarks/results/tools/base_profile.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections import Counter

from trl_credit.evaluation.metrics import pass_at_k
from trl_credit.tasks import keychain

__all__ = ["ToolRecipe", "build_tool_regime_model", "tool_regime_model_path", "tool_rollouts", "tool_profile",
           "correct_per_row", "rollout_summary",
           "MAX_COMPLETION_LENGTH", "MAX_TOOL_CALLS"]

#: Bump when the build changes in a way the recipe does not show.
BUILD_VERSION = 1
#: The completion budget of a rollout (model turns and tool results): a right 7-call episode is 277 tokens.
MAX_COMPLETION_LENGTH = 384
#: TRL's ``max_tool_calling_iterations``: a few more than the longest right episode (7 calls).
MAX_TOOL_CALLS = 10


@dataclasses.dataclass(frozen=True)
class ToolRecipe:
    """Everything that decides the built weights (hashed into the cache folder's name)."""

    hidden_size: int = 64
    num_layers: int = 2
    episodes: int = 3000
    steps: int = 600
    batch_size: int = 16
    learning_rate: float = 3e-3
    trap_error_rate: float = 0.8
    data_seed: int = 1
    seed: int = 0
    #: A second stage on the same episodes at a lower rate (seed + 1 draws its batches): it sharpens the plain
    #: copies, whose sampled errors at temperature 1 are noise beside the planted one (without it a third of the
    #: episodes at T = 1 first went wrong at a plain key). 0: one stage.
    polish_steps: int = 400
    polish_learning_rate: float = 1e-3

    def digest(self) -> str:
        recipe = dataclasses.asdict(self)
        if not self.polish_steps:  # fields added after the first build hash only when used
            del recipe["polish_steps"], recipe["polish_learning_rate"]
        text = json.dumps({"recipe": recipe, "words": keychain.WORDS, "version": BUILD_VERSION}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def supervised_episodes(recipe: ToolRecipe) -> list[dict]:
    """The build's scripted episodes (their stores drawn from ``data_seed``, apart from the task's splits)."""
    rng = random.Random(recipe.data_seed)
    return [keychain.scripted_episode(keychain.make_episode(rng), recipe.trap_error_rate, rng)
            for _ in range(recipe.episodes)]


def build_tool_regime_model(recipe: ToolRecipe, output_dir: str) -> dict:
    """Build the model into ``output_dir`` (module docstring); returns its ``build.json``."""
    from transformers import AutoModelForCausalLM

    from trl_credit.testbed.model import weights_digest
    from trl_credit.testbed.tool_model import build_tool_model, warm_start_tool_calls

    start = time.process_time()
    build_tool_model(output_dir, seed=recipe.seed, hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                     extra_words=keychain.WORDS)  # every key and answer one token: a call copies one token
    episodes = supervised_episodes(recipe)
    warm = warm_start_tool_calls(output_dir, episodes, steps=recipe.steps, batch_size=recipe.batch_size,
                                 learning_rate=recipe.learning_rate, seed=recipe.seed)
    if recipe.polish_steps:
        warm = {"first_stage": warm, "polish": warm_start_tool_calls(
            output_dir, episodes, steps=recipe.polish_steps, batch_size=recipe.batch_size,
            learning_rate=recipe.polish_learning_rate, seed=recipe.seed + 1)}
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    info = {"recipe": dataclasses.asdict(recipe), "digest": recipe.digest(), "version": BUILD_VERSION,
            "weights_sha256": weights_digest(model), "parameters": sum(p.numel() for p in model.parameters()),
            "warm_start": warm, "build_cpu_seconds": round(time.process_time() - start, 1)}
    with open(os.path.join(output_dir, "build.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def tool_regime_model_path(recipe: ToolRecipe | None = None, build: bool = True) -> str:
    """The folder of the model ``recipe`` builds (default recipe): the committed build when it is that recipe's,
    else the cache's, built first when missing."""
    from trl_credit.models import _cache_root

    recipe = recipe or ToolRecipe()
    committed = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                             "benchmarks", "results", "tools", "model")
    if os.path.exists(os.path.join(committed, "build.json")):
        with open(os.path.join(committed, "build.json")) as f:
            if json.load(f)["digest"] == recipe.digest():
                return committed
    path = _cache_root() / "testbed" / f"tools-{recipe.digest()}"
    if not (path / "build.json").exists():
        if not build:
            raise FileNotFoundError(f"no tool regime model at {path}: run `python -m trl_credit.testbed.tool_regime "
                                    "--build`.")
        partial = path.with_name(path.name + f".partial-{os.getpid()}")
        build_tool_regime_model(recipe, str(partial))
        try:
            partial.rename(path)  # atomic: a concurrent build of the same digest keeps the first one
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)
    return str(path)


def tool_rollouts(model, dataset, samples: int, temperature: float = 1.0, greedy: bool = False, seed: int = 0,
                  batch_rollouts: int = 256) -> list[dict]:
    """Play ``samples`` episodes of every row of ``dataset`` (a :func:`keychain.make_dataset` split) with TRL's
    generation and tool loop: the evaluation pass of a ``GRPOTrainer`` with ``environment_factory=``
    :class:`keychain.KeyChainEnvironment`, whose extra reward function records each rollout's environment. Sampled at
    ``temperature`` (TRL's sampling: top-p 1, no top-k), or greedy. ``model``: a folder or a loaded model.

    Returns one dict per rollout, in row order (``row``: the row's index): ``reward`` (``get_reward``), ``calls``,
    ``first_wrong``, ``kind``, ``turn_rewards``, ``model_turns`` (assistant messages) and ``completion_tokens``."""
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from trl_credit.trl_bridge.compat import hidden_library_deprecations

    if batch_rollouts % samples:
        raise ValueError(f"batch_rollouts ({batch_rollouts}) must be a multiple of samples ({samples}).")
    indexed = dataset.add_column("row", list(range(len(dataset))))
    records: dict[int, list[dict]] = {}

    def record_rollouts(prompts, completions, completion_ids, environments, row, **kwargs):
        for env, messages, ids, index in zip(environments, completions, completion_ids, row):
            wrong, kind = env.first_wrong
            records.setdefault(index, []).append(dict(
                row=index, reward=env.get_reward(), calls=len(env.calls), first_wrong=wrong, kind=kind,
                turn_rewards=env.turn_rewards, completion_tokens=len(ids),
                model_turns=sum(m["role"] == "assistant" for m in messages)))
        return [None] * len(prompts)  # measures, does not score

    output_dir = tempfile.mkdtemp(prefix="tool_regime_")
    threads = torch.get_num_threads()
    try:
        with hidden_library_deprecations():
            args = GRPOConfig(
                output_dir=output_dir, use_cpu=True, report_to="none", seed=seed, temperature=temperature,
                top_p=1.0, max_completion_length=MAX_COMPLETION_LENGTH, max_tool_calling_iterations=MAX_TOOL_CALLS,
                num_generations=max(2, samples), num_generations_eval=samples,
                per_device_train_batch_size=max(2, samples), per_device_eval_batch_size=batch_rollouts,
                generation_kwargs={"do_sample": False} if greedy else None, disable_tqdm=True, beta=0.0,
            )
            trainer = GRPOTrainer(model=model, reward_funcs=[record_rollouts], args=args, train_dataset=indexed,
                                  eval_dataset=indexed, environment_factory=keychain.KeyChainEnvironment)
            torch.manual_seed(seed)
            trainer.evaluate()
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(output_dir, ignore_errors=True)
    return [r for index in sorted(records) for r in records[index]]


def rollout_summary(rollouts: list[dict]) -> dict:
    """Accuracy, tool calls (mean and histogram), where the episodes first went wrong (``first_wrong_kinds``,
    ``planted_share``) and completion tokens of :func:`tool_rollouts`' records."""
    calls = Counter(r["calls"] for r in rollouts)
    kinds = Counter(r["kind"] or "right" for r in rollouts)
    return dict(accuracy=sum(r["reward"] for r in rollouts) / len(rollouts),
                mean_calls=sum(r["calls"] for r in rollouts) / len(rollouts),
                calls_histogram={str(k): calls[k] for k in sorted(calls)},
                first_wrong_kinds=dict(sorted(kinds.items())),
                planted_share=kinds["planted"] / len(rollouts),
                mean_completion_tokens=sum(r["completion_tokens"] for r in rollouts) / len(rollouts),
                max_completion_tokens=max(r["completion_tokens"] for r in rollouts))


def correct_per_row(rollouts: list[dict]) -> list[int]:
    """Right rollouts (reward 1) per dataset row of :func:`tool_rollouts`' records, in row order."""
    correct: dict[int, int] = {}
    for r in rollouts:
        correct[r["row"]] = correct.get(r["row"], 0) + int(r["reward"] == 1.0)
    return [correct[i] for i in sorted(correct)]


def tool_profile(model, test, train, group: int = 8, train_rows: int = 256, test_rows: int = 128,
                 passk_samples: int = 32, passk_rows: int = 32, seed: int = 0) -> dict:
    """The start statistics (module docstring): greedy on every ``test`` row; ``group`` samples at temperature 1 on
    the first ``train_rows`` of ``train`` (all-fail share, as GRPO's groups of ``group`` see them) and on the first
    ``test_rows`` test rows (accuracy, pass@1..group); ``passk_samples`` samples on the first ``passk_rows`` test rows
    (pass@k up to k = ``passk_samples``)."""
    start = time.process_time()
    greedy = tool_rollouts(model, test, 1, greedy=True, seed=seed)
    groups = tool_rollouts(model, train.select(range(min(train_rows, len(train)))), group, seed=seed + 1)
    sampled = tool_rollouts(model, test.select(range(min(test_rows, len(test)))), group, seed=seed + 2)
    many = tool_rollouts(model, test.select(range(min(passk_rows, len(test)))), passk_samples, seed=seed + 3)
    per_group, per_test, per_many = correct_per_row(groups), correct_per_row(sampled), correct_per_row(many)
    traps = list(test["traps"])
    by_traps = {}
    for count in sorted(set(traps)):
        rows = [i for i, t in enumerate(traps) if t == count]
        sampled_rows = [i for i in rows if i < len(per_test)]
        by_traps[str(count)] = dict(rows=len(rows), greedy=sum(greedy[i]["reward"] for i in rows) / len(rows),
                                    sampled=sum(per_test[i] for i in sampled_rows) / (group * len(sampled_rows))
                                    if sampled_rows else None)
    ks = [2**i for i in range(int(math.log2(passk_samples)) + 1)]
    return dict(
        greedy_accuracy=sum(r["reward"] for r in greedy) / len(greedy),
        accuracy_t1=sum(per_test) / (group * len(per_test)),
        train_all_fail_share=sum(c == 0 for c in per_group) / len(per_group), group_size=group,
        train_groups=len(per_group), train_accuracy_t1=sum(per_group) / (group * len(per_group)),
        pass_at_k={str(k): sum(pass_at_k(group, c, k) for c in per_test) / len(per_test) for k in range(1, group + 1)},
        pass_at_k_large={str(k): sum(pass_at_k(passk_samples, c, k) for c in per_many) / len(per_many) for k in ks},
        passk_samples=passk_samples, passk_rows=len(per_many), by_trap_keys=by_traps,
        greedy=rollout_summary(greedy), t1_test=rollout_summary(sampled), t1_train=rollout_summary(groups),
        greedy_correct=[int(r["reward"]) for r in greedy], correct_per_row=per_test, train_correct_per_row=per_group,
        passk_correct_per_row=per_many, cpu_seconds=round(time.process_time() - start, 1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--build", default=None, help="build the default recipe into this folder first")
    parser.add_argument("--model", default=None, help="a tool regime model folder (default: the regime's build)")
    parser.add_argument("--results", default=None, help="write the profile here (JSON)")
    parser.add_argument("--train-rows", type=int, default=256)
    parser.add_argument("--test-rows", type=int, default=128)
    parser.add_argument("--passk-rows", type=int, default=32)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if args.build:
        print(json.dumps(build_tool_regime_model(ToolRecipe(), args.build), indent=1))
    path = args.model or args.build or tool_regime_model_path()
    data = keychain.make_dataset()
    profile = tool_profile(path, data["test"], data["train"], train_rows=args.train_rows,
                           test_rows=args.test_rows, passk_rows=args.passk_rows)
    from trl_credit.testbed.model import save_profile

    save_profile(profile, path, "tools", args.results, per_item="per_row")


if __name__ == "__main__":
    main()
