"""Train any trainer on the tool regime and measure it (docs/testbed.md#the-tool-regime).

:func:`run_tools` is the tool regime's :func:`trl_credit.testbed.runner.run`: a fresh copy of the regime's model
(:func:`~trl_credit.testbed.tool_regime.tool_regime_model_path`), trained ``steps`` optimizer steps through TRL's tool
loop with ``environment_factory=`` :class:`~trl_credit.tasks.keychain.KeyChainEnvironment` (its ``get_reward`` is the
outcome: TRL adds it as a reward function, weight 1) and a format reward second, then measured with the training
prompt through the same loop (:func:`~trl_credit.testbed.tool_regime.tool_rollouts`): greedy accuracy on the test
split, accuracy and pass@k at temperature 1. :data:`TOOL_METHODS` holds the settings of every method of the grid
(benchmarks/tools/tool_grid.py); every method sees the same ``[format, KeyChainEnvironment.get_reward]`` rewards.

Generated tokens are the model's tokens only (tool results are not generated): every ``generate`` call of the model
(rollouts, their tool-loop rounds, SRPO's suffixes and localization, OPPO has none) is counted up to its EOS.
"""

from __future__ import annotations

import os
import random
import tempfile
import time

import torch

from trl_credit.evaluation.metrics import pass_at_k
from trl_credit.tasks import keychain
from trl_credit.testbed.runner import count_generated
from trl_credit.testbed.tool_regime import (MAX_COMPLETION_LENGTH, MAX_TOOL_CALLS, correct_per_row, rollout_summary,
                                            tool_regime_model_path, tool_rollouts)

__all__ = ["TOOL_METHODS", "TOOL_SHARED", "TOOL_PROMPTS_PER_STEP", "tool_method_spec", "format_reward", "run_tools",
           "evaluate_tools"]

#: Shared by every method: rollouts per prompt (G), sampling, the completion and tool-call budgets, TRL's default loss.
TOOL_SHARED = dict(num_generations=8, temperature=1.0, top_p=1.0, max_completion_length=MAX_COMPLETION_LENGTH,
                   max_tool_calling_iterations=MAX_TOOL_CALLS, loss_type="dapo", beta=0.0)
TOOL_PROMPTS_PER_STEP = 4

#: The verifier of every method that reads one (success, OPPO's evidence, PRIME's labels, SRPO's failed seeds, DATPO's
#: V_root): the environment's reward, as TRL names it (the first reward function is the format reward).
_OUTCOME = "KeyChainEnvironment"

#: SRPO in the regime: a step is a model turn (the delimiter never occurs), resets land at a turn's start, one reset
#: group of 4 suffixes; the environment is replayed to the reset point (docs/multiturn.md#srpo--rrpo-resets).
_SRPO = dict(rollout_template="none", thought_delimiter="</thought>", reset_groups=1, suffixes_per_reset=4,
             step_checker="keychain", success_reward=_OUTCOME)

TOOL_METHODS = ("grpo", "process", "oppo", "srpo", "rrpo", "srpo_oracle", "prime", "datpo")


def format_reward(completions, **kwargs) -> list[float]:
    """0.1 when the episode ends in a closing turn without a tool call (the model stopped of its own accord), else 0:
    the users' second reward, small beside the outcome."""
    rewards = []
    for messages in completions:
        last = messages[-1] if messages else {}
        rewards.append(0.1 if last.get("role") == "assistant" and not last.get("tool_calls") else 0.0)
    return rewards


def tool_method_spec(name: str) -> dict:
    """``{"trainer", "config", "fields", "kwargs"}`` of a grid method (:data:`TOOL_METHODS`)."""
    import trl

    import trl_credit

    if name == "grpo":
        return dict(trainer=trl.GRPOTrainer, config=trl.GRPOConfig, fields={}, kwargs={})
    if name == "process":  # the oracle: the environment's turn rewards (1 up to the first wrong call, 0 from it on)
        return dict(trainer=trl_credit.CreditTrainer, config=trl_credit.CreditConfig,
                    fields=dict(credit="process", process_step_reward="environment", success_reward=_OUTCOME),
                    kwargs={})
    if name == "oppo":  # the policy shown the answer (the chain's colour) as the oracle
        return dict(trainer=trl_credit.OPPOTrainer, config=trl_credit.OPPOConfig,
                    fields=dict(oracle="self", answer_column="answer", success_reward=_OUTCOME), kwargs={})
    if name in ("srpo", "rrpo", "srpo_oracle"):
        # self: the policy's scored localization (the model never saw the localization prompt: where its resets land
        # is measured, not assumed); random: RRPO; oracle: the first wrong call, read from the transcript
        reset = {"srpo": "self", "rrpo": "random", "srpo_oracle": "oracle"}[name]
        return dict(trainer=trl_credit.SRPOTrainer, config=trl_credit.SRPOConfig,
                    fields=dict(_SRPO, reset=reset, localization="scored", localization_max_tokens=12), kwargs={})
    if name == "prime":  # the implicit PRM from the outcome labels, its rate at the released recipe's ratio (2x)
        return dict(trainer=trl_credit.CreditTrainer, config=trl_credit.CreditConfig,
                    fields=dict(credit="implicit_prm", success_reward=_OUTCOME), kwargs={},
                    lr_scaled=dict(prime_learning_rate=2.0))
    if name == "datpo":  # G/2 base rollouts, forks inside model turns, branches through the tool loop
        return dict(trainer=trl_credit.DATPOTrainer, config=trl_credit.DATPOConfig,
                    fields=dict(num_generations=4, success_reward=_OUTCOME), kwargs={})
    raise ValueError(f"unknown tool regime method {name!r}; choose from {list(TOOL_METHODS)}")


def evaluate_tools(model, test, samples: int = 8, sampled_rows: int = 64, seed: int = 1234,
                   greedy_rows: int | None = None) -> dict:
    """Greedy accuracy on every ``test`` row (the first ``greedy_rows``) and ``samples`` episodes at temperature 1 on
    the first ``sampled_rows`` (accuracy = pass@1, pass@k up to ``samples``), with the training prompt through TRL's
    tool loop; per-row counts for paired statistics, the share of rows all-fail in ``samples``, and where the
    episodes first went wrong."""
    state = torch.get_rng_state(), random.getstate()
    try:
        greedy_test = test if greedy_rows is None else test.select(range(min(greedy_rows, len(test))))
        greedy = tool_rollouts(model, greedy_test, 1, greedy=True, seed=seed)
        sampled = tool_rollouts(model, test.select(range(min(sampled_rows, len(test)))), samples, seed=seed + 1)
    finally:
        torch.set_rng_state(state[0])
        random.setstate(state[1])
    correct, summary = correct_per_row(sampled), rollout_summary(sampled)
    return dict(greedy_accuracy=sum(r["reward"] for r in greedy) / len(greedy),
                greedy_correct=[int(r["reward"]) for r in greedy],
                accuracy=sum(correct) / (samples * len(correct)), correct_per_row=correct,
                pass_at_k={k: sum(pass_at_k(samples, c, k) for c in correct) / len(correct)
                           for k in range(1, samples + 1)},
                all_fail_share=sum(c == 0 for c in correct) / len(correct),
                **{key: summary[key] for key in ("mean_calls", "first_wrong_kinds", "mean_completion_tokens")})


def run_tools(method: str, seed: int, learning_rate: float, steps: int = 30, eval_samples: int = 8,
              eval_rows: int = 64, model_path: str | None = None, on_trainer=None, evaluate_at_end: bool = True,
              greedy_rows: int | None = None, eval_every: int = 0, **fields) -> dict:
    """Train grid method ``method`` (:data:`TOOL_METHODS`) from the regime's model ``steps`` steps at ``learning_rate``
    (``fields`` on top of its settings) and evaluate it at the end (:func:`evaluate_tools`; also every ``eval_every``
    steps before it, into ``curve``, with the tokens generated so far). Returns the final
    report, the generated model tokens, TRL's logged metrics per step, the all-fail share of the groups (of
    ``num_generations`` rows as TRL scores them: GRPO's groups; a rollout part's rows in its own order) of every
    training batch, and the CPU seconds of training."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from trl_credit.testbed.runner import method_fields
    from trl_credit.trl_bridge.compat import hidden_library_deprecations

    spec = tool_method_spec(method)
    model_path = model_path or tool_regime_model_path()
    data = keychain.make_dataset()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    counted = count_generated(model, tokenizer.eos_token_id, tokenizer.pad_token_id)
    settings = dict(TOOL_SHARED, output_dir=tempfile.mkdtemp(prefix="tool_testbed_"), learning_rate=learning_rate,
                    max_steps=steps, logging_steps=1, save_strategy="no", report_to="none", seed=seed, use_cpu=True,
                    disable_tqdm=True)
    settings.update(method_fields(spec, learning_rate))
    settings.update(fields)
    settings["per_device_train_batch_size"] = TOOL_PROMPTS_PER_STEP * settings["num_generations"]
    outcomes: list[list[float]] = []  # per reward call (a training batch): each rollout's outcome, in TRL's row order

    def format_reward_recording(completions, environments=None, **kwargs):
        # the format reward, recording the outcomes it does not score (the all-fail share of the batch's groups)
        if environments is not None:
            outcomes.append([float(env.get_reward()) for env in environments])
        return format_reward(completions)

    format_reward_recording.__name__ = "format_reward"
    with hidden_library_deprecations():
        config = spec["config"](**settings)
        trainer = spec["trainer"](model=model, reward_funcs=[format_reward_recording], args=config,
                                  train_dataset=data["train"], processing_class=tokenizer,
                                  environment_factory=keychain.KeyChainEnvironment, **spec["kwargs"])
    trainer.remove_callback(PrinterCallback)
    curve: list[dict] = []
    if eval_every:
        from transformers import TrainerCallback

        class EvaluateEvery(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step % eval_every == 0 and state.global_step < steps:
                    counted["paused"], begun = True, time.process_time()
                    report = evaluate_tools(model, data["test"], samples=eval_samples, sampled_rows=eval_rows,
                                            greedy_rows=greedy_rows)
                    counted["paused"] = False
                    counted["eval_cpu"] = counted.get("eval_cpu", 0.0) + time.process_time() - begun
                    curve.append(dict(step=state.global_step, generated_tokens=counted["tokens"], **report))
                    model.train()

        trainer.add_callback(EvaluateEvery())
    if on_trainer is not None:  # e.g. a hook recording what reaches the loss (benchmarks/tools/tool_mechanisms.py)
        on_trainer(trainer)
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.train()
    train_cpu = time.process_time() - cpu_start - counted.get("eval_cpu", 0.0)
    tokens, calls = counted["tokens"], counted["calls"]
    counted["paused"] = True  # the end's evaluation: not the run's tokens
    report = evaluate_tools(model, data["test"], samples=eval_samples, sampled_rows=eval_rows,
                            greedy_rows=greedy_rows) if evaluate_at_end else None
    logs = [log for log in trainer.state.log_history if "reward" in log]
    if not os.environ.get("TRL_CREDIT_KEEP_OUTPUT"):
        import shutil

        shutil.rmtree(settings["output_dir"], ignore_errors=True)
    group = settings["num_generations"]
    all_fail = [sum(not any(batch[i: i + group]) for i in range(0, len(batch) - group + 1, group))
                / max(1, len(batch) // group) for batch in outcomes]
    return dict(final=report, curve=curve, generated_tokens=tokens, train_all_fail_share=all_fail,
                generate_calls=calls, logs=logs, train_cpu_seconds=train_cpu, wall_seconds=time.perf_counter() - start,
                eval_cpu_seconds=time.process_time() - cpu_start - train_cpu,  # the curve's and the end's
                settings={k: v for k, v in settings.items() if k != "output_dir"})
