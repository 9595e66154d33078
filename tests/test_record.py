"""The batch record carries what parts read (trl_credit/batch.py, docs/design.md#the-credit-core): this process's
prompts, completion texts and loss mask, filled once by the core from TRL's batch, and typed payloads a rollout
hands its credit instead of an untyped bag."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from trl_credit.batch import NO_GROUP, ROW_BASE, MissingPayload, RowBatch
from trl_credit.core import fill_record
from trl_credit.mixins import RolloutCapture


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
    output = {"completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]), "tool_mask": torch.tensor([[1, 1, 1], [0, 1, 1]])}
    capture = RolloutCapture()
    capture.generated = (None, None, None, ["four", [{"role": "assistant", "content": "it is 4"}]])
    batch = _record()
    fill_record(batch, inputs, output, capture)
    assert batch.prompts == ["2+2?", "3+1?"]
    assert batch.completions == ["four", "it is 4"]
    assert batch.loss_mask.tolist() == [[1, 1, 0], [0, 1, 1]]


def test_what_a_rollout_set_itself_is_kept_and_a_missing_capture_leaves_no_texts():
    # SRPO sets the prompts it generated from (its rollout template); without tool_mask the loss mask is TRL's.
    batch = _record(prompts=["<wrapped> 2+2?", "<wrapped> 3+1?"])
    fill_record(batch, [{"prompt": "2+2?"}, {"prompt": "3+1?"}], {"completion_mask": torch.tensor([[1, 0], [1, 1]])},
                RolloutCapture())
    assert batch.prompts == ["<wrapped> 2+2?", "<wrapped> 3+1?"]
    assert batch.completions is None
    assert batch.loss_mask.tolist() == [[1, 0], [1, 1]]


def test_rarity_weights_refuse_a_record_without_texts_by_name():
    from trl_credit.cue_grpo.parts import RarityWeights

    batch = _record(num_rows=2, num_local=2, process_index=0, loss_mask=torch.ones(2, 2))
    trainer = SimpleNamespace(args=SimpleNamespace(), accelerator=SimpleNamespace(process_index=0))
    with pytest.raises(RuntimeError, match="holds no completion texts"):
        RarityWeights().apply(trainer, batch, [{"prompt": "p"}] * 2, {}, torch.zeros(2))
