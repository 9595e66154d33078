"""The batch record carries what parts read (trl_credit/core/batch.py, docs/design.md#the-credit-core): this process's
prompts, completion texts and loss mask, filled once by the core from TRL's batch, and typed payloads a rollout
hands its credit instead of an untyped bag."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from trl_credit.core.batch import NO_GROUP, ROW_BASE, MissingPayload, Outcomes, RowBatch
from trl_credit.core.mixins import RolloutCapture
from trl_credit.core.context import BatchContext
from trl_credit.core.trainer import Credit, GroupRollout, Modifier, Rollout, credit_step, fill_record, training_batch


def _record(num_rows=4, num_local=2, process_index=1, **fields) -> RowBatch:
    return RowBatch(
        rewards_per_func=torch.zeros(num_rows, 1), group_ids=torch.tensor([0, 0, 1, NO_GROUP][:num_rows]),
        row_kinds=torch.full((num_rows,), ROW_BASE), success=None, scorable=torch.ones(num_rows, dtype=torch.bool),
        num_local=num_local, process_index=process_index, **fields,
    )


@dataclasses.dataclass
class _Trees:
    forks: list


@dataclasses.dataclass
class _Flags:
    clean: list


def test_a_payload_is_found_by_its_type_and_a_missing_one_is_named():
    batch = _record()
    trees = _Trees(forks=[[2]])
    batch.attach(trees)
    assert batch.payload(_Trees) is trees and batch.has_payload(_Trees) and not batch.has_payload(_Flags)
    with pytest.raises(MissingPayload, match=r"no _Flags payload \(attached: _Trees\)"):
        batch.payload(_Flags)
    with pytest.raises(LookupError, match="no _Trees payload \\(attached: none\\)"):  # MissingPayload is a LookupError
        _record().payload(_Trees)


def test_attach_refuses_what_is_not_a_dataclass_instance_and_a_second_payload_of_a_type():
    batch = _record()
    with pytest.raises(TypeError, match="payload must be a dataclass instance, got dict"):
        batch.attach({"trees": 1})
    with pytest.raises(TypeError, match="got type"):
        batch.attach(_Trees)  # the class, not an instance
    batch.attach(_Flags(clean=[1, 0]))
    with pytest.raises(ValueError, match="a _Flags payload is already attached"):
        batch.attach(_Flags(clean=[0, 0]))


def test_the_block_credit_names_the_payload_it_is_missing():
    # BlockCredit on a record no `Trees` rollout built: the error names DATPO's payload type.
    from trl_credit.datpo.parts import BlockCredit

    with pytest.raises(MissingPayload, match="no TreeBatch payload"):
        BlockCredit().advantages(None, _record(), [], {})


def test_the_core_fills_this_processes_prompts_texts_and_loss_mask_from_trls_batch():
    # This process holds rows 2-3 (process 1 of 2). TRL's completion_mask ends each row at its EOS; the rollout's
    # tool_mask (SRPO's shared prefix) masks row 3's first token. A conversational completion's text is the
    # assistant turn's content.
    inputs = [{"prompt": "2+2?", "answer": "4"}, {"prompt": "3+1?", "answer": "4"}]
    output = {"completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
              "tool_mask": torch.tensor([[1, 1, 1], [0, 1, 1]]), **_ids()}
    capture = RolloutCapture()
    capture.generated = (None, None, None, ["four", [{"role": "assistant", "content": "it is 4"}]])
    batch = _record()
    fill_record(batch, inputs, output, capture)
    assert batch.prompts == ["2+2?", "3+1?"]
    assert batch.completions == ["four", "it is 4"]
    assert batch.loss_mask.tolist() == [[1, 1, 0], [0, 1, 1]]
    # the token ids and masks are TRL's tensors themselves (no copy); completion_mask before the prefix masking
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"):
        assert getattr(batch, name) is output[name], name
    assert batch.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]


def _ids() -> dict:
    """TRL's token ids and prompt mask of two rows (left-padded prompts of width 2, completions of width 3)."""
    return {"prompt_ids": torch.tensor([[0, 5], [6, 7]]), "prompt_mask": torch.tensor([[0, 1], [1, 1]]),
            "completion_ids": torch.tensor([[8, 9, 0], [10, 11, 12]])}


def test_what_a_rollout_set_itself_is_kept_and_a_missing_capture_leaves_no_texts():
    # SRPO sets the prompts it generated from (its rollout template); without tool_mask the loss mask is TRL's.
    batch = _record(prompts=["<wrapped> 2+2?", "<wrapped> 3+1?"])
    fill_record(batch, [{"prompt": "2+2?"}, {"prompt": "3+1?"}],
                {"completion_mask": torch.tensor([[1, 0], [1, 1]]), **_ids()}, RolloutCapture())
    assert batch.prompts == ["<wrapped> 2+2?", "<wrapped> 3+1?"]
    assert batch.completions is None
    assert batch.loss_mask.tolist() == [[1, 0], [1, 1]]


def test_rarity_weights_refuse_a_record_without_texts_by_name():
    from trl_credit.cue_grpo.parts import RarityWeights

    batch = _record(num_rows=2, num_local=2, process_index=0, loss_mask=torch.ones(2, 2))
    ctx = BatchContext(args=SimpleNamespace())
    with pytest.raises(RuntimeError, match="holds no completion texts"):
        RarityWeights().apply(ctx, batch, [{"prompt": "p"}] * 2, {}, torch.zeros(2))


# ------------------------------------------------------------------ the core's step: outcome stage, one cut, one write
class _ToyRollout(Rollout):
    """Two processes x 2 rows, this process the second: rows 2-3. Declares outcomes when ``with_outcomes``."""

    def __init__(self, calls, with_outcomes=True):
        self.calls, self.with_outcomes = calls, with_outcomes

    def generate_and_score(self, trainer, inputs, capture):
        self.calls.append("rollout")
        output = {"completion_mask": torch.ones(2, 3, dtype=torch.long), "advantages": torch.zeros(2), **_ids()}
        return output, _record()

    def outcomes(self, trainer, batch):
        self.calls.append("outcomes")
        if not self.with_outcomes:
            return None
        return Outcomes(groups={0: [0, 1], 1: [2]}, rewards=torch.tensor([1.0, 0.0, 3.0], dtype=torch.float64),
                        correct=torch.tensor([True, False, True]), in_loss=torch.ones(3, dtype=torch.bool),
                        local_texts={}, rows=["a", "b", "c"], unit_rows=["a", "b", "c"])


class _OutcomeCredit(Credit):
    """The sum of the outcomes' rewards as every row's advantage (every row of the record: global)."""

    def __init__(self, calls):
        self.calls = calls

    def advantages(self, trainer, batch, inputs, output):
        self.calls.append("credit")
        total = 0.0 if batch.outcomes is None else float(batch.outcomes.rewards.sum())
        return torch.arange(4, dtype=torch.float32) + total


class _Doubling(Modifier):
    acts_on_outcomes = True

    def __init__(self, calls):
        self.calls = calls

    def leaf_outcomes(self, trainer, batch, outcomes):
        self.calls.append(("outcomes x2", outcomes.rewards.tolist()))
        return outcomes.rewards * 2

    def apply(self, trainer, batch, inputs, output, advantages):
        self.calls.append(("apply", advantages.tolist()))
        return advantages


def _toy_trainer(calls, with_outcomes=True):
    return SimpleNamespace(rollout=_ToyRollout(calls, with_outcomes), credit=_OutcomeCredit(calls),
                           modifiers=[_Doubling(calls), _Doubling(calls)])


def test_the_core_runs_outcome_stage_modifiers_before_the_credit_without_datpo():
    calls = []
    output, batch, advantages = credit_step(_toy_trainer(calls), BatchContext(args=None), [{"prompt": "p"}] * 2,
                                           RolloutCapture())
    # Outcomes 1, 0, 3: doubled twice (in modifier order) before the credit -> 4, 0, 12, sum 16.
    assert calls == ["rollout", "outcomes", ("outcomes x2", [1.0, 0.0, 3.0]), ("outcomes x2", [2.0, 0.0, 6.0]),
                     "credit", ("apply", [16.0, 17.0, 18.0, 19.0]), ("apply", [16.0, 17.0, 18.0, 19.0])]
    assert batch.outcomes.rewards.tolist() == [4.0, 0.0, 12.0]
    # The modifiers got every row (the credit's global advantages); the core cut them to rows 2-3 once and wrote them.
    assert advantages.tolist() == [18.0, 19.0] and output["advantages"] is advantages


def test_a_rollout_without_outcomes_skips_the_outcome_stage():
    calls = []
    _, batch, advantages = credit_step(_toy_trainer(calls, with_outcomes=False), BatchContext(args=None), [{"prompt": "p"}] * 2,
                                       RolloutCapture())
    assert calls == ["rollout", "outcomes", "credit", ("apply", [0.0, 1.0, 2.0, 3.0]), ("apply", [0.0, 1.0, 2.0, 3.0])]
    assert batch.outcomes is None and advantages.tolist() == [2.0, 3.0]


def test_no_modifier_on_outcomes_asks_the_rollout_for_none():
    calls = []

    class Plain(_Doubling):
        acts_on_outcomes = False

    trainer = _toy_trainer(calls)
    trainer.modifiers = [Plain(calls)]
    credit_step(trainer, BatchContext(args=None), [{"prompt": "p"}] * 2, RolloutCapture())
    assert "outcomes" not in calls  # building outcomes (DATPO: decoding every leaf) only when a modifier wants them


def test_local_advantages_are_written_as_they_are():
    # A credit over TRL's groups returns this process's rows (TRL's advantages): no second cut.
    batch = _record()
    trainer = SimpleNamespace(rollout=GroupRollout())
    output = {"advantages": torch.zeros(2)}
    written, advantages = training_batch(trainer, BatchContext(args=None), batch, [], output, torch.tensor([5.0, 6.0]))
    assert advantages.tolist() == [5.0, 6.0] and written["advantages"] is advantages


class _NoFloatGather:
    """An accelerator of one process that refuses to gather advantages (floats): the masks may be gathered."""

    num_processes, process_index, is_main_process = 1, 0, True

    def gather(self, tensor):
        assert not tensor.is_floating_point(), "advantages gathered"
        return tensor


def test_rarity_weights_take_global_advantages_without_gathering_them(tmp_path):
    # SRPO's sub-groups x Cue: GroupOutcome returns every row; Cue reads them as they are (no gather) and returns
    # every row, which the core cuts once. Group 0 = rows 0-2 (rewards 1, 1, 0), P = {0, 1} in clusters "a", "b";
    # group 1 = rows 3, 4 (1, 0), P = {3}. CR with α = 1 over P = {0, 1}: sizes 1, 1 -> 1, 1 -> floor shift τ - 1
    # = 0.05 -> 1.05 each; P = {3}: 1.05.
    from tests.test_compose_oppo import _fake_trainer
    from trl_credit.cue_grpo.parts import RarityWeights

    rewards = torch.tensor([[1.0], [1.0], [0.0], [1.0], [0.0]])
    batch = RowBatch(rewards_per_func=rewards, group_ids=torch.tensor([0, 0, 0, 1, 1]),
                     row_kinds=torch.full((5,), ROW_BASE), success=rewards[:, 0] >= 1.0,
                     scorable=torch.ones(5, dtype=torch.bool), num_local=5, process_index=0,
                     completions=["a", "b", "c", "d", "e"], loss_mask=torch.ones(5, 2, dtype=torch.long))
    modifier = RarityWeights(partition_fn=lambda completions, prompt: completions)
    trainer = _fake_trainer(tmp_path, None, rewards)
    modifier.setup(trainer)
    ctx = BatchContext(args=trainer.args, reward_func_names=["verifier"], success_index=0)
    ctx.gather = _NoFloatGather().gather
    advantages = torch.tensor([0.5, 0.5, -1.0, 0.7, -0.7])
    result = modifier.apply(ctx, batch, [{"prompt": "p"}] * 5, {}, advantages)
    torch.testing.assert_close(result, torch.tensor([0.5 * 1.05, 0.5 * 1.05, -1.0, 0.7 * 1.05, -0.7]))
