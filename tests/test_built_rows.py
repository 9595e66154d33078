"""The core's moves for rows a rollout builds (trl_credit/core/built_rows.py) and the batch-context verbs that offer
them (docs/design.md#the-batch-context): padding with filler rows, collective scoring with the same forwards on every
process, vLLM's sampling log-probs and importance ratios. A stand-in context plays one process of two (its
``gather_counts`` answers what the other process would have said); expected tensors are worked out by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from trl_credit.core.built_rows import (
    importance_sampling_ratio,
    pad_built_rows,
    sampling_logprobs_rows,
    score_collectively,
)
from trl_credit.core.context import BatchContext, hook_context

PAD = 0


def _ctx(counts, batch_size=2, pad_to_multiple_of=None):
    """One process of several: ``counts`` are the row counts every process reports (this one's included)."""
    forwards = []

    def logprobs(p_ids, p_mask, c_ids, c_mask, *, model=None, batch_size=None):
        # a "log-prob" per token that is the token id itself, so the test sees which token landed where
        forwards.append((model, c_ids.tolist(), batch_size))
        return c_ids.float() * c_mask, None

    ctx = SimpleNamespace(
        gather_counts=lambda n: list(counts), device=torch.device("cpu"),
        rows=SimpleNamespace(pad_token_id=PAD, pad_to_multiple_of=pad_to_multiple_of),
        args=SimpleNamespace(per_device_train_batch_size=batch_size), logprobs=logprobs,
    )
    return ctx, forwards


def test_built_rows_are_padded_as_trl_pads_then_filled_to_the_largest_process():
    ctx, _ = _ctx(counts=[2, 3])  # this process has 2 rows, the other 3: one filler row here
    rows = pad_built_rows(ctx, [[5, 6], [7]], [[1, 2, 3], [4]])
    assert rows.row_counts == [2, 3]
    # prompts left-padded, the filler's one-token prompt [PAD] too; completions right-padded
    assert rows.prompt_ids.tolist() == [[5, 6], [0, 7], [0, 0]]
    assert rows.prompt_mask.tolist() == [[1, 1], [0, 1], [0, 1]]
    assert rows.completion_ids.tolist() == [[1, 2, 3], [4, 0, 0], [0, 0, 0]]
    # the filler's one completion token is outside the loss
    assert rows.completion_mask.tolist() == [[1, 1, 1], [1, 0, 0], [0, 0, 0]]


def test_built_rows_pad_to_a_multiple_and_refuse_unpaired_rows():
    ctx, _ = _ctx(counts=[1], pad_to_multiple_of=4)
    rows = pad_built_rows(ctx, [[5]], [[1, 2, 3, 4, 5]])
    assert rows.prompt_ids.shape == (1, 4) and rows.completion_ids.shape == (1, 8)
    with pytest.raises(ValueError, match="prompt_rows has 2 rows, completion_rows 1"):
        pad_built_rows(ctx, [[5], [6]], [[1]])


def test_scoring_runs_as_many_forwards_as_the_process_with_most_rows():
    # 1 row here, 3 on the other process, 2 rows per forward: 2 forwards each; the second one here scores a
    # one-token filler row and drops it
    ctx, forwards = _ctx(counts=[1, 3])
    scored = score_collectively(ctx, "policy", [[9]], [[1, 2]])
    assert [(c, size) for _, c, size in forwards] == [([[1, 2]], 1), ([[PAD]], 1)]
    assert all(model == "policy" for model, _, _ in forwards)
    assert scored.tolist() == [[1.0, 2.0]]


def test_scored_pieces_of_different_widths_line_up_row_by_row():
    ctx, forwards = _ctx(counts=[3, 1])
    scored = score_collectively(ctx, "ref", [[9], [9], [9]], [[1, 2, 3], [4], [5]])
    assert len(forwards) == 2  # rows 0-1, then row 2
    assert scored.tolist() == [[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 0.0, 0.0]]


def test_scoring_no_rows_anywhere_is_none_and_no_rows_here_is_empty():
    ctx, forwards = _ctx(counts=[0, 0])
    assert score_collectively(ctx, "policy", [], []) is None and forwards == []
    ctx, forwards = _ctx(counts=[0, 2])
    assert score_collectively(ctx, "policy", [], []).shape == (0, 1)
    assert len(forwards) == 1  # still the other process's one forward, on a filler row


def test_sampling_logprobs_rows_are_right_padded_and_nan_where_vllm_had_none():
    values = sampling_logprobs_rows([[-0.5, None], []], width=3, device="cpu")
    assert values[0, 0].item() == -0.5 and math.isnan(values[0, 1].item()) and values[0, 2].item() == 0.0
    assert values[1].tolist() == [0.0, 0.0, 0.0]


def test_importance_sampling_ratio_follows_trl_modes():
    old = torch.tensor([[-1.0, -2.0, 0.0]])
    sampling = torch.tensor([[-1.5, -1.0, 5.0]])
    mask = torch.tensor([[1, 1, 0]])
    # log ratio per token = (old − sampling)·mask = [0.5, −1.0, 0]

    def ratio(mode, low, high, sampled=sampling):
        fake = SimpleNamespace(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=low,
                               vllm_importance_sampling_clip_max=high)
        return importance_sampling_ratio(fake, old, sampled, mask)

    # sequence: exp(0.5 − 1.0) = exp(−0.5) = 0.6065 <= 3 (TRL's default mode and cap), kept
    assert ratio("sequence_mask", None, 3.0)[0].tolist() == pytest.approx([math.exp(-0.5)])
    assert ratio("sequence_mask", 0.7, 3.0).tolist() == [[0.0]]  # below the floor: masked
    # token truncate to [0.5, 1.5]: exp(0.5) = 1.65 -> 1.5, exp(−1) = 0.37 -> 0.5, exp(0) = 1
    assert ratio("token_truncate", 0.5, 1.5)[0].tolist() == pytest.approx([1.5, 0.5, 1.0])
    # token mask above 1.5: exp(0.5) masked to 0, exp(−1) kept
    assert ratio("token_mask", None, 1.5)[0].tolist() == pytest.approx([0.0, math.exp(-1.0), 1.0])
    # a token vLLM could not score (NaN) gets ratio 1
    nan_sampled = torch.tensor([[float("nan"), -2.0, 0.0]])
    assert ratio("token_truncate", None, 3.0, nan_sampled)[0].tolist() == pytest.approx([1.0, 1.0, 1.0])

def test_without_a_trainer_the_row_settings_come_from_the_args_and_the_model_verbs_refuse(tmp_path):
    args = SimpleNamespace(max_steps=7, mask_truncated_completions=True, max_completion_length=16,
                           pad_to_multiple_of=None, vllm_importance_sampling_mode="token_mask",
                           vllm_importance_sampling_clip_min=None, vllm_importance_sampling_clip_max=2.0)
    ctx = BatchContext(args=args)
    assert ctx.max_steps == 7 and not ctx.deepspeed
    rows = ctx.rows
    assert (rows.mask_truncated_completions, rows.max_completion_length, rows.eos_token_ids, rows.pad_token_id) == (
        True, 16, None, None)
    # exp(0.5) = 1.65 <= 2 kept, exp(1) = 2.72 > 2 masked (token_mask from the args)
    ratio = ctx.importance_sampling_ratio(torch.tensor([[0.5, 1.0]]), torch.zeros(1, 2), torch.ones(1, 2))
    assert ratio.tolist() == [[pytest.approx(math.exp(0.5)), 0.0]]
    with pytest.raises(ValueError, match="model_kind must be 'policy' or 'reference', got 'ref'"):
        ctx.score_rows("ref", [], [])
    for verb, call in [("score_rows", lambda: ctx.score_rows("policy", [], [])),
                       ("decode_completions", lambda: ctx.decode_completions(["p"], [[1]], [[2]])),
                       ("generate_call", lambda: ctx.generate_call([[1]], 1, max_new_tokens=2)),
                       ("no_sync", lambda: ctx.no_sync(None)), ("backward", lambda: ctx.backward(None))]:
        with pytest.raises(RuntimeError, match=f"BatchContext.{verb} needs the trainer"):
            call()


def test_over_a_trainer_the_row_settings_are_trls(tiny_model_path, tmp_path):
    from trl_credit import DATPOConfig, DATPOTrainer
    from trl_credit.tasks.data import make_arithmetic_dataset

    args = DATPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, report_to="none",
                       use_cpu=True, use_diversity=False, max_completion_length=12, max_steps=3,
                       mask_truncated_completions=True)
    trainer = DATPOTrainer(model=tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                           args=args, train_dataset=make_arithmetic_dataset(num_train=4, num_test=1, seed=0)["train"])
    ctx = hook_context(trainer)
    rows = ctx.rows
    assert rows.pad_token_id == trainer.processing_class.pad_token_id
    assert rows.eos_token_ids == trainer.eos_token_ids and rows.max_completion_length == 12
    assert rows.mask_truncated_completions is True and not ctx.deepspeed
    trainer.state.max_steps = 5  # what Trainer.train sets (from max_steps or the epochs), not args.max_steps = 3
    assert hook_context(trainer).max_steps == 5
