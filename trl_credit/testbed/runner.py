"""Train any trainer on the tiny testbed and measure it (docs/testbed.md#the-tiny-testbed).

:func:`run` builds a trainer of the given class on a fresh copy of the testbed model (full fine-tuning: the model is
0.3M parameters), trains it ``steps`` optimizer steps on the sums task with ``[accuracy, format]`` rewards, and
evaluates it on held-out problems every ``eval_every`` steps with the training prompt: sampled accuracy (pass@1),
pass@k, solution structures, generated tokens so far. Evaluation draws from its own random state and restores the
training one, so a run with evaluation trains exactly as one without. :data:`METHODS` holds the settings of every
method of the grid (benchmarks/tiny/tiny_grid.py); a user's own credit method runs the same way::

    from trl_credit.testbed.runner import run
    result = run(MyTrainer, MyConfig, seed=0, learning_rate=1e-4, steps=40, **my_fields)
"""

from __future__ import annotations

import math
import os
import random
import tempfile
import time

import numpy as np
import torch

from trl_credit.evaluation.metrics import pass_at_k  # the package's unbiased estimator, re-exported for the grids
from trl_credit.tasks import sums
from trl_credit.testbed.model import make_tokenizer, testbed_model_path

__all__ = ["METHODS", "method_spec", "method_fields", "run", "evaluate", "pass_at_k"]

#: Shared by every method: prompts per step, rollouts per prompt (G), sampling, completion cap, TRL's default loss.
SHARED = dict(num_generations=8, temperature=1.0, top_p=1.0, max_completion_length=48, loss_type="dapo", beta=0.0)
PROMPTS_PER_STEP = 8
_SRPO = dict(rollout_template="none", thought_delimiter="\n", reset_groups=1, suffixes_per_reset=4,
             localization_template=sums.LOCALIZATION_TEMPLATE, localization_max_tokens=12)
_OPPO = dict(oracle="self", oracle_template=sums.ORACLE_TEMPLATE, answer_column="answer")


def method_spec(name: str) -> dict:
    """``{"trainer": class, "config": class, "fields": {...}, "kwargs": {...}}`` of a grid method."""
    import trl

    import trl_credit

    if name == "grpo":
        return dict(trainer=trl.GRPOTrainer, config=trl.GRPOConfig, fields={}, kwargs={})
    if name == "cue_grpo":  # rarity over the solution structures (the default cue partition sees no cue in digits)
        return dict(trainer=trl_credit.CueGRPOTrainer, config=trl_credit.CueGRPOConfig,
                    fields=dict(cue_partition="callable"), kwargs=dict(partition_fn=sums.structure_partition))
    if name == "oppo":
        return dict(trainer=trl_credit.OPPOTrainer, config=trl_credit.OPPOConfig, fields=dict(_OPPO), kwargs={})
    if name == "datpo":  # the paper's adaptive budget: N = G/2 base rollouts, K_max 3, B_max 4
        return dict(trainer=trl_credit.DATPOTrainer, config=trl_credit.DATPOConfig, fields=dict(num_generations=4),
                    kwargs={})
    if name == "datpo_matched":  # at most G leaves per prompt: 2 base rollouts, 1 fork each, up to 3 branches
        return dict(trainer=trl_credit.DATPOTrainer, config=trl_credit.DATPOConfig,
                    fields=dict(num_generations=2, max_forks=1, max_branches=3), kwargs={})
    if name in ("srpo", "rrpo", "srpo_oracle"):
        # SRPO decodes the policy's \boxed{k} answer as the paper does (the model learned the localization prompt);
        # an unparsed answer resets uniformly (the paper's fallback)
        reset = {"srpo": "self", "rrpo": "random", "srpo_oracle": "oracle"}[name]
        fields = dict(_SRPO, reset=reset, localization="generate", localization_fallback="random",
                      step_checker="sums")
        return dict(trainer=trl_credit.SRPOTrainer, config=trl_credit.SRPOConfig, fields=fields, kwargs={})
    if name == "srpo_oppo":
        fields = dict(_SRPO, **_OPPO, rollout="resets", credit="oppo", reset="self", localization="generate",
                      localization_fallback="random", step_checker="sums")
        return dict(trainer=trl_credit.CreditTrainer, config=trl_credit.CreditConfig, fields=fields, kwargs={})
    if name == "process":  # the oracle token credit: the step checker's per-step rewards (DeepSeekMath §4.1.3)
        return dict(trainer=trl_credit.CreditTrainer, config=trl_credit.CreditConfig,
                    fields=dict(credit="process", process_step_reward="sums"), kwargs={})
    if name == "prime":  # the implicit PRM learned from the outcome labels alone (Cui et al. 2025); its learning
        # rate keeps the released recipe's ratio to the policy's (1e-6 / 5e-7): a 1e-6 PRM on a from-scratch model
        # trained at 1e-3 would barely move, and its token rewards would stay ~0
        # The settings the committed "prime" rows were measured with, pinned since the defaults moved (issue 62):
        # every group trains (no prompt filter) and the PRM's gradient is clipped at 1.0. benchmarks/tiny/tiny_grid.py's
        # "prime_filter" runs the current defaults (the paper's prompt filter, the recipe's clip of 10.0).
        return dict(trainer=trl_credit.CreditTrainer, config=trl_credit.CreditConfig,
                    fields=dict(credit="implicit_prm", prime_prompt_filter=False, prime_grad_clip=1.0), kwargs={},
                    lr_scaled=dict(prime_learning_rate=2.0))
    raise ValueError(f"unknown testbed method {name!r}; choose from {list(METHODS)}")


METHODS = ("grpo", "cue_grpo", "oppo", "datpo", "datpo_matched", "srpo", "rrpo", "srpo_oracle", "srpo_oppo",
           "process", "prime")


def method_fields(spec: dict, learning_rate: float) -> dict:
    """A method's config fields at a policy learning rate: its fixed ``fields`` and its ``lr_scaled`` ones (a field
    set to a ratio times the policy's rate, e.g. PRIME's PRM learning rate)."""
    scaled = {name: ratio * learning_rate for name, ratio in spec.get("lr_scaled", {}).items()}
    return dict(spec["fields"], **scaled)


def generated_tokens(sequences: torch.Tensor, prompt_width: int, eos_id: int, pad_id: int) -> int:
    """Tokens generated up to and including each row's first EOS (padding after it not counted)."""
    new = sequences[:, prompt_width:]
    total = 0
    for row in new.tolist():
        length = len(row)
        for index, token in enumerate(row):
            if token == eos_id:
                length = index + 1
                break
            if token == pad_id:
                length = index
                break
        total += length
    return total


def count_generated(model, eos_id: int, pad_id: int) -> dict:
    """Wrap ``model.generate`` to count the tokens it generates (:func:`generated_tokens`) and its calls: every
    rollout, seed, branch and localization call of any trainer. ``counted["paused"] = True`` stops the count (an
    evaluation that goes through the wrapper: not the run's tokens)."""
    counted = {"tokens": 0, "calls": 0}
    original = model.generate

    def counting_generate(*args, **kwargs):
        out = original(*args, **kwargs)
        if counted.get("paused"):
            return out
        inputs = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]
        counted["tokens"] += generated_tokens(out if torch.is_tensor(out) else out.sequences, inputs.size(1), eos_id,
                                              pad_id)
        counted["calls"] += 1
        return out

    model.generate = counting_generate
    return counted


class _RandomState:
    """Saves torch's, numpy's and Python's global random states and restores them on exit."""

    def __enter__(self):
        self.states = torch.get_rng_state(), np.random.get_state(), random.getstate()

    def __exit__(self, *exc):
        torch.set_rng_state(self.states[0])
        np.random.set_state(self.states[1])
        random.setstate(self.states[2])


def _sample(model, tokenizer, prompts: list[str], seed: int, batch_size: int, max_new_tokens: int,
            temperature: float | None, extra: dict | None = None) -> list[str]:
    """Completions of ``prompts``: sampled at ``temperature`` from ``seed`` (``extra``: more sampling arguments,
    e.g. ``top_p``, ``min_p``), or greedy when it is None."""
    texts = []
    torch.manual_seed(seed)
    generate = type(model).generate  # the class's own: not the token-counting wrapper on the instance
    sampling = dict(do_sample=False) if temperature is None else {
        **dict(do_sample=True, temperature=temperature, top_p=1.0, top_k=0), **(extra or {})}
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False)
        out = generate(model, **batch, **sampling, max_new_tokens=max_new_tokens,
                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts += tokenizer.batch_decode(out[:, batch["input_ids"].size(1):], skip_special_tokens=True)
    return texts


#: the k of the large-sample pass@k (pass@k for k = 1, 2, 4, ... up to the samples drawn)
def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


@torch.no_grad()
def evaluate(model, tokenizer, test, samples: int = 8, temperature: float = 1.0, seed: int = 1234,
             batch_size: int = 512, max_new_tokens: int = 48, greedy: bool = False, passk_samples: int = 0,
             passk_problems: int | None = None) -> dict:
    """Sampled held-out evaluation with the training prompt: accuracy (mean over samples = pass@1), pass@k for k =
    1..samples, correct samples per structure and the mean completion length. Seeded; global random state kept.

    ``greedy``: also the greedy accuracy (``greedy_accuracy``, ``greedy_correct`` per problem). ``passk_samples``:
    also ``passk_samples`` more samples on the first ``passk_problems`` problems (all by default), drawn from
    ``seed + 1``, for pass@k up to k = ``passk_samples`` (``pass_at_k_large``, k = 1, 2, 4, ...; unbiased
    estimator) and ``passk_correct_per_problem``. The 8-sample numbers above are unchanged by either."""
    was_training = model.training
    model.eval()
    prompts = [p for p in test["prompt"] for _ in range(samples)]
    extra = {}
    with _RandomState():
        texts = _sample(model, tokenizer, prompts, seed, batch_size, max_new_tokens, temperature)
        if greedy:
            greedy_texts = _sample(model, tokenizer, list(test["prompt"]), seed, batch_size, max_new_tokens, None)
            extra["greedy_correct"] = [int(c) for c in sums.accuracy_reward(greedy_texts, test["answer"])]
            extra["greedy_accuracy"] = sum(extra["greedy_correct"]) / len(extra["greedy_correct"])
        if passk_samples:
            count = len(test["prompt"]) if passk_problems is None else min(passk_problems, len(test["prompt"]))
            many = [p for p in test["prompt"][:count] for _ in range(passk_samples)]
            many_texts = _sample(model, tokenizer, many, seed + 1, batch_size, max_new_tokens, temperature)
            ok = sums.accuracy_reward(many_texts, [a for a in test["answer"][:count] for _ in range(passk_samples)])
            per = [int(sum(ok[i * passk_samples : (i + 1) * passk_samples])) for i in range(count)]
            extra.update(passk_samples=passk_samples, passk_problems=count, passk_correct_per_problem=per,
                         pass_at_k_large={k: sum(pass_at_k(passk_samples, c, k) for c in per) / count
                                          for k in _powers_of_two(passk_samples)})
    if was_training:
        model.train()
    answers = [a for a in test["answer"] for _ in range(samples)]
    correct = sums.accuracy_reward(texts, answers)
    per_problem = [int(sum(correct[i * samples : (i + 1) * samples])) for i in range(len(test["prompt"]))]
    structures: dict[str, list[int]] = {}
    for prompt, text, ok_ in zip(prompts, texts, correct):
        tally = structures.setdefault(sums.solution_structure(prompt, text), [0, 0])
        tally[0] += int(ok_)
        tally[1] += 1
    return dict(accuracy=sum(correct) / len(correct),
                pass_at_k={k: sum(pass_at_k(samples, c, k) for c in per_problem) / len(per_problem)
                           for k in range(1, samples + 1)},
                correct_per_problem=per_problem, structures=structures,
                mean_length=sum(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts) / len(texts),
                **extra)


def run(trainer_class, config_class, seed: int, learning_rate: float, steps: int = 40, eval_every: int = 5,
        eval_samples: int = 8, test=None, trainer_kwargs: dict | None = None, model_path: str | None = None,
        evaluate_at_start: bool = False, on_trainer=None, regime: str = "tiny", greedy_eval: bool = True,
        final_passk_samples: int = 64, passk_problems: int | None = 128, **fields) -> dict:
    """Train a ``trainer_class`` (``config_class`` with the shared settings, ``fields`` on top) from the testbed
    model and return its curve: per evaluation, the step, generated tokens so far and :func:`evaluate`'s report.

    ``regime`` picks the model (trl_credit.testbed.regimes; ``model_path`` overrides it). Every evaluation also
    reports the greedy accuracy (``greedy_eval``); the last one also pass@k up to ``final_passk_samples`` from that
    many samples on the first ``passk_problems`` held-out problems (0: not measured)."""
    from transformers import LlamaForCausalLM, PrinterCallback, TrainerCallback

    from trl_credit.testbed.regimes import SUMS_REGIMES, regime_recipe

    if regime_recipe(regime) and regime not in SUMS_REGIMES:
        raise ValueError(f"run(regime={regime!r}): this runner trains the sums regimes {list(SUMS_REGIMES)}; the "
                         f"{regime!r} regime plays its own task through TRL's tool loop (environment_factory, "
                         "trl_credit.testbed.tool_regime), which this runner does not drive yet.")
    model_path = model_path or testbed_model_path(regime_recipe(regime))
    data = sums.make_dataset()
    test = data["test"] if test is None else test
    tokenizer = make_tokenizer()
    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    counted = count_generated(model, tokenizer.eos_token_id, tokenizer.pad_token_id)
    curve: list[dict] = []
    cpu = {"eval": 0.0}

    def record(step):
        start = time.process_time()
        report = evaluate(model, tokenizer, test, samples=eval_samples, greedy=greedy_eval,
                          passk_samples=final_passk_samples if step == steps else 0, passk_problems=passk_problems)
        cpu["eval"] += time.process_time() - start
        curve.append(dict(step=step, generated_tokens=counted["tokens"], generate_calls=counted["calls"], **report))

    class EvalCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % eval_every == 0 or state.global_step == steps:
                record(state.global_step)

    settings = dict(SHARED, output_dir=tempfile.mkdtemp(prefix="tiny_testbed_"), learning_rate=learning_rate,
                    max_steps=steps, logging_steps=1, save_strategy="no", report_to="none", seed=seed, use_cpu=True,
                    disable_tqdm=True)
    settings.update(fields)
    settings["per_device_train_batch_size"] = PROMPTS_PER_STEP * settings["num_generations"]
    config = config_class(**settings)
    trainer = trainer_class(model=model, reward_funcs=[sums.accuracy_reward, sums.format_reward], args=config,
                            train_dataset=data["train"], processing_class=tokenizer, callbacks=[EvalCallback()],
                            **(trainer_kwargs or {}))
    trainer.remove_callback(PrinterCallback)  # disable_tqdm's replacement prints every log line
    if on_trainer is not None:  # e.g. a hook that records what reaches the loss (benchmarks/tiny/tiny_mechanisms.py)
        on_trainer(trainer)
    if evaluate_at_start:
        record(0)
    start, cpu_start = time.perf_counter(), time.process_time()
    trainer.train()
    train_cpu = time.process_time() - cpu_start - cpu["eval"]
    logs = [log for log in trainer.state.log_history if "reward" in log]
    if not os.environ.get("TRL_CREDIT_KEEP_OUTPUT"):  # the trainer's output folder (no checkpoints are saved)
        _remove(settings["output_dir"])
    return dict(curve=curve, logs=logs, train_cpu_seconds=train_cpu, eval_cpu_seconds=cpu["eval"],
                wall_seconds=time.perf_counter() - start, settings={k: v for k, v in settings.items()
                                                                    if k != "output_dir"})


def _remove(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
