"""The per-batch context (trl_credit/core/context.py): parts read a BatchContext, not the trainer, so a credit and a
modifier run on a record and its args alone; the context's verbs without a trainer; one context per batch, and one
per optimizer step and mode for the hooks outside a batch.

The hand-worked example: GRPO's group-normalized outcome (``A = (r - mean_g) / (std_g + 1e-4)``, std unbiased) and
Cue-GRPO's CR rarity weights (paper Eq. 3 and 8: ``|C_i|^-alpha`` normalized to mean 1 over P, clipped to
[0.3, 3], shifted up so the smallest is tau = 1.05) on P, the correct rows with a positive advantage.
"""

from __future__ import annotations

import math
import random
import warnings
from types import SimpleNamespace

import pytest
import torch

from trl_credit.config import CreditConfig
from trl_credit.core.batch import NO_GROUP, ROW_BASE, RowBatch
from trl_credit.core.context import BatchContext, hook_context
from trl_credit.core.trainer import CreditTrainer, GroupOutcome, Modifier
from trl_credit.cue_grpo.parts import RarityWeights

EPS = 1e-4


def _record():
    # Group 0 = rows 0-3 (rewards 1, 1, 1, 0), group 1 = rows 4, 5 (1, 0), row 6 in no group. One process.
    rewards = torch.tensor([[1.0], [1.0], [1.0], [0.0], [1.0], [0.0], [1.0]])
    return RowBatch(rewards_per_func=rewards, group_ids=torch.tensor([0, 0, 0, 0, 1, 1, NO_GROUP]),
                    row_kinds=torch.full((7,), ROW_BASE), success=rewards[:, 0] >= 1.0,
                    scorable=torch.ones(7, dtype=torch.bool), num_local=7, process_index=0)


def test_a_credit_and_a_modifier_run_on_a_record_and_args_alone(tmp_path):
    args = CreditConfig(output_dir=str(tmp_path), modifiers=["cue"], cue_partition="callable", cue_alpha=1.0,
                        report_to="none", use_cpu=True)
    texts = ["a", "a", "b", "c", "d", "e", "f"]  # the completions TRL generated; partition_fn clusters by text
    ctx = BatchContext(args=args, inputs=[{"prompt": "p"}] * 7, reward_func_names=["verifier"], success_index=0)
    batch = _record()
    # what the core fills in the record from TRL's batch (core.trainer.fill_record): prompts, texts, loss mask
    batch.prompts, batch.completions, batch.loss_mask = ["p"] * 7, texts, torch.ones(7, 3, dtype=torch.long)
    ctx.record = batch
    output = {"advantages": torch.zeros(7), "completion_mask": torch.ones(7, 3, dtype=torch.long)}

    outcome = GroupOutcome().advantages(ctx, batch, ctx.inputs, output)
    # group 0: mean 3/4, std sqrt((3 (1/4)^2 + (3/4)^2) / 3) = 1/2; group 1: mean 1/2, std sqrt(1/2); row 6: 0
    a0, a1 = 0.25 / (0.5 + EPS), 0.5 / (math.sqrt(0.5) + EPS)
    assert outcome.tolist() == pytest.approx([a0, a0, a0, -3 * a0, a1, -a1, 0.0], abs=1e-6)

    modifier = RarityWeights(partition_fn=lambda completions, prompt: completions)  # setup(trainer): construction
    result = modifier.apply(ctx, batch, ctx.inputs, output, outcome)
    # P = {0, 1, 2} in clusters {0, 1}, {2}: |C|^-1 = 1/2, 1/2, 1, mean 2/3 -> 3/4, 3/4, 3/2; floor shift
    # 1.05 - 3/4 = 0.3 -> 1.05, 1.05, 1.8. P = {4}: one cluster, 1 -> 1.05. Negative and ungrouped rows keep theirs.
    expected = [a0 * 1.05, a0 * 1.05, a0 * 1.8, -3 * a0, a1 * 1.05, -a1, 0.0]
    assert result.tolist() == pytest.approx(expected, abs=1e-6)
    assert batch.table_advantages == pytest.approx(expected, abs=1e-6)  # the modifier's values win the table
    # both parts logged into the context's metrics (TRL's buffer when a trainer built it)
    assert ctx.metrics["credit/nonfinite_reward_rate"] == [0.0]
    assert ctx.metrics["cue/frac_groups_redistributed"] == [1.0]  # both groups have a positive
    assert ctx.metrics["cue/clusters_per_group"] == [1.5]  # 2 clusters in group 0, 1 in group 1
    assert ctx.metrics["cue/frac_positive_advantage_excluded"] == [0.0]


def test_metric_warn_gather_cut_and_scratch_without_a_trainer():
    ctx = BatchContext(args=None, process_index=1)
    ctx.metric("x/y", 2)
    ctx.metric("x/y", 0.5)
    assert dict(ctx.metrics) == {"x/y": [2.0, 0.5]}
    with pytest.warns(UserWarning, match="first"):
        ctx.warn("key", "first")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ctx.warn("key", "second")  # once per key
        ctx.warn("other", "third")
    assert [str(w.message) for w in caught] == ["third"]
    values = torch.arange(6)
    assert ctx.gather(values) is values and ctx.gather_rows([1, 2]) == [1, 2] and ctx.gather_counts(3) == [3]
    assert ctx.cut(values, 2).tolist() == [2, 3]  # process 1's rows, 2 per process
    part, other = object(), object()
    ctx.scratch(part)["weighted"] = True
    assert ctx.scratch(part) == {"weighted": True} and ctx.scratch(other) == {}
    assert BatchContext(args=None).scratch(part) == {}  # a new batch starts empty
    assert ctx.speaker() == "CreditTrainer" and ctx.speaker(SimpleNamespace(name="cue")) == "CreditTrainer (cue)"


def test_rng_is_seeded_by_the_run_seed_the_step_and_the_key():
    ctx = BatchContext(args=SimpleNamespace(seed=7), step=3)
    draws = [ctx.rng(2, 5).random() for _ in range(2)]
    assert draws[0] == draws[1] == random.Random("7:3:2:5").random()  # the same on every call (every process)
    assert ctx.rng(2, 6).random() != draws[0]  # another key
    assert BatchContext(args=SimpleNamespace(seed=7), step=4).rng(2, 5).random() != draws[0]  # another step


def test_without_a_trainer_the_model_verbs_and_several_processes_are_refused_by_name():
    ctx = BatchContext(args=None)
    assert not hasattr(ctx, "trainer")  # no way back to the trainer (the transitional hatch is gone)
    for verb, call in [("generate", lambda: ctx.generate([[1]])), ("tokenize", lambda: ctx.tokenize(["p"])),
                       ("policy", lambda: ctx.policy), ("trl_batch", lambda: ctx.trl_batch([])),
                       ("logprobs", lambda: ctx.logprobs(None, None, None, None))]:
        with pytest.raises(RuntimeError, match=f"BatchContext.{verb} needs the trainer"):
            call()
    with pytest.raises(RuntimeError, match="BatchContext.gather_rows: 2 processes need a trainer"):
        BatchContext(args=None, num_processes=2).gather_rows([1])
    with pytest.raises(ValueError, match="mode must be 'train' or 'eval'"):
        BatchContext(args=None, mode="test")


class _WatchLoss(Modifier):
    """Keeps the context each micro-batch's loss hook got (a hook outside a generation batch)."""

    name = "watch"

    def __init__(self):
        self.seen = []

    def apply(self, ctx, batch, inputs, output, advantages):
        return advantages

    def loss(self, ctx, proceed, model, inputs):
        self.seen.append(ctx)
        return proceed(model, inputs)


def test_hooks_outside_a_batch_share_one_context_per_optimizer_step_and_mode(tiny_model_path, tiny_dataset, tmp_path):
    from trl import GRPOConfig

    # 2 micro-batches per optimizer step (gradient accumulation), 2 steps: 4 loss calls, 2 contexts.
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                      num_generations=4, max_completion_length=4, max_steps=2, report_to="none", use_cpu=True,
                      save_strategy="no")
    watch = _WatchLoss()
    trainer = CreditTrainer(tiny_model_path, lambda completion_ids, **kw: [float(len(c) % 2) for c in completion_ids],
                            args=args, train_dataset=tiny_dataset, modifiers=[watch])
    trainer.train()
    first, second, third, fourth = watch.seen
    assert first is second and third is fourth and first is not third
    assert (first.step, third.step) == (0, 1) and first.mode == third.mode == "train"
    assert first.record is None and len(first.inputs) == 0  # no batch's rows in a hook context

    # Directly: two calls at one step and mode give the same context; a new step or mode a new one.
    now = hook_context(trainer)
    assert hook_context(trainer) is now and now.step == trainer.state.global_step == 2
    trainer.state.global_step += 1
    later = hook_context(trainer)
    assert later is not now and later.step == 3
    trainer.model.eval()
    evaluating = hook_context(trainer)
    assert evaluating is not later and evaluating.mode == "eval" and hook_context(trainer) is evaluating


def test_grpos_outcome_on_trls_groups_is_every_rows_when_the_core_kept_trls_global_advantages():
    # Process 1 of 2, groups of 2: group 0 = rows 0-1 (process 0), group 1 = rows 2-3 (this process) holds a +inf
    # reward, so its rows get 0 (TRL's arithmetic: NaN, then 0). The global advantages (made up: only their layout
    # and the zeroing are under test) come from the capture; without them, TRL's of this process's rows.
    rewards = torch.tensor([[1.0], [0.0], [math.inf], [1.0]])
    batch = RowBatch(rewards_per_func=rewards, group_ids=torch.tensor([0, 0, 1, 1]),
                     row_kinds=torch.full((4,), ROW_BASE), success=None, scorable=torch.ones(4, dtype=torch.bool),
                     num_local=2, process_index=1, group_size=2)
    output = {"advantages": torch.tensor([0.5, -0.5])}
    kept = SimpleNamespace(trl_global_advantages=torch.tensor([0.75, -0.75, 0.5, -0.5]))
    for capture, expected in [(kept, [0.75, -0.75, 0.0, 0.0]), (None, [0.0, 0.0])]:
        ctx = BatchContext(args=None, process_index=1, num_processes=2, group_size=2, capture=capture,
                           reward_func_names=["r"])
        with pytest.warns(UserWarning, match="inf"):
            advantages = GroupOutcome().advantages(ctx, batch, [], output)
        assert advantages.tolist() == expected
        assert ctx.metrics["credit/nonfinite_reward_rate"] == [0.5]  # 1 group in 2
    assert batch.is_global(torch.zeros(4))  # the core cuts the global ones once: this process's rows
    assert batch.local_rows(torch.tensor([0.75, -0.75, 0.0, 0.0])).tolist() == [0, 0]


def test_the_rollout_verbs_without_a_trainer():
    # The verbs of a rollout inside TRL's rollout_func: those that need the model refuse by name; the forward is not a
    # collective call on one process; 0-token rows are refused speaking as the part, from the first empty row.
    ctx = BatchContext(args=None, owner="SRPOTrainer")
    for verb, call in [("generate_groups", lambda: ctx.generate_groups([[1]])), ("autocast", ctx.autocast),
                       ("unwrapped_policy", lambda: ctx.unwrapped_policy),
                       ("eos_token_ids", lambda: ctx.eos_token_ids), ("pad_token_id", lambda: ctx.pad_token_id)]:
        with pytest.raises(RuntimeError, match=f"BatchContext.{verb} needs the trainer"):
            call()
    assert ctx.collective_forward is False
    ctx.refuse_empty_completions([[1], [2, 3]], "the generation of suffixes")  # none empty: no error
    part = SimpleNamespace(name="resets")
    with pytest.raises(ValueError, match=r"^SRPOTrainer \(resets\): the generation of suffixes returned an empty "
                                         r"completion \(0 tokens\) for 2 of 3 rows \(first: row 1\)"):
        ctx.refuse_empty_completions([[1], [], []], "the generation of suffixes", part=part)
