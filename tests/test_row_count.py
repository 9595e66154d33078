"""The core owns the variable row count of a rollout that builds its training rows (``Rollout.builds_rows``,
trl_credit/core/row_count.py): the split into micro-batches that drops no row, and the loss renormalized to the whole
generation batch. DATPO's numbers through it are the golden files' (tests/test_golden.py)."""

import functools
from types import SimpleNamespace

import pytest
import torch

from trl_credit.core.row_count import NUM_ROWS, renormalized_loss, split_rows
from trl_credit.core.trainer import CreditTrainer, Rollout


def _rows(num_rows: int, width: int = 4) -> dict:
    lengths = [1 + row % width for row in range(num_rows)]
    return {
        "prompt_ids": torch.ones(num_rows, 2, dtype=torch.long),
        "prompt_mask": torch.ones(num_rows, 2, dtype=torch.long),
        "completion_ids": torch.arange(num_rows * width).view(num_rows, width),
        "completion_mask": torch.tensor([[1] * n + [0] * (width - n) for n in lengths]),
        "advantages": torch.ones(num_rows, width),
        NUM_ROWS: torch.tensor(num_rows),
    }


def test_every_per_token_tensor_is_trimmed_with_the_completion_whatever_its_name():
    # A rollout's own per-token key (here "bonus") is cut to the micro-batch's completion width like the
    # advantages; a per-row (B, 1) ratio and the prompt keep theirs.
    batch = _rows(4)
    batch["bonus"] = torch.arange(16.0).view(4, 4)
    batch["ratio"] = torch.ones(4, 1)
    first, second = split_rows(batch, 2)
    # rows 0-1 use 1 and 2 completion tokens -> width 2; rows 2-3 use 3 and 4 -> width 4
    assert first["completion_ids"].shape == first["bonus"].shape == first["advantages"].shape == (2, 2)
    assert first["bonus"].tolist() == [[0.0, 1.0], [4.0, 5.0]]
    assert second["bonus"].shape == (2, 4) and first["ratio"].shape == (2, 1) and first["prompt_ids"].shape == (2, 2)
    assert int(first[NUM_ROWS]) == 4  # a 0-d value goes to every micro-batch


class _BuildsRows(Rollout):
    builds_rows = True


def _fake_trainer(num_rows: int, training: bool = True):
    # _batch_context: any object, as no part's hook reads it (parts=[])
    trainer = SimpleNamespace(
        rollout=_BuildsRows(), model=SimpleNamespace(training=training), parts=[], _batch_context=object(),
        args=SimpleNamespace(steps_per_generation=2), num_iterations=1, pad_to_multiple_of=None,
        _step=0, _buffered_inputs=None, generated=[],
    )

    def generate_and_score(generation_batch):
        trainer.generated.append(generation_batch)
        return _rows(num_rows)

    trainer._generate_and_score_completions = generate_and_score
    trainer._through_parts = functools.partial(CreditTrainer._through_parts, trainer)
    return trainer


def test_the_core_splits_rows_a_rollout_built_without_dropping_any():
    # 5 rows over steps_per_generation = 2: micro-batches of 3 and 2 (TRL's split would floor-divide to 2 + 2).
    trainer = _fake_trainer(5)
    first = CreditTrainer._prepare_inputs(trainer, ["prompt"])
    trainer._step = 1
    second = CreditTrainer._prepare_inputs(trainer, ["prompt"])
    assert trainer.generated == [["prompt"]]  # one generation batch serves both optimizer steps
    assert sorted([first["completion_ids"].size(0), second["completion_ids"].size(0)]) == [2, 3]
    seen = torch.cat([first["completion_ids"][:, 0], second["completion_ids"][:, 0]]).tolist()
    assert sorted(seen) == [0, 4, 8, 12, 16]  # every row once (shuffled)


def test_evaluation_batches_go_to_trls_split():
    trainer = _fake_trainer(5, training=False)
    with pytest.raises(TypeError):  # TRL's method, reached through super(): the fake is not a trainer
        CreditTrainer._prepare_inputs(trainer, ["prompt"])
    assert trainer.generated == []


@pytest.mark.parametrize("loss_type, expected", [("grpo", 1.2), ("dr_grpo", 1.2), ("bnpo", 0.8), ("dapo", 1.0)])
def test_the_loss_of_built_rows_is_renormalized_to_the_generation_batch(loss_type, expected):
    # 2 processes x 2 micro-batches per generation; this micro-batch: 3 rows, 5 loss tokens; the generation batch:
    # 10 real rows, 25 loss tokens. Row-averaging losses: 3 rows x 4 micro-batches / 10 rows = 1.2; bnpo: 5 tokens
    # x 4 / 25 = 0.8; dapo already divides by the generation batch's tokens (num_items_in_batch).
    trainer = SimpleNamespace(accelerator=SimpleNamespace(num_processes=2),
                              args=SimpleNamespace(steps_per_generation=2), loss_type=loss_type)
    inputs = {"completion_ids": torch.zeros(3, 4), "completion_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0],
                                                                                     [1, 1, 0, 0]]),
              NUM_ROWS: torch.tensor(10), "num_items_in_batch": torch.tensor(25)}
    assert float(renormalized_loss(trainer, torch.tensor(1.0), inputs)) == pytest.approx(expected)


def test_bnpo_counts_the_model_tokens_of_multi_turn_rows():
    # Multi-turn rows (DATPO's trees with tools): TRL's bnpo averages over completion_mask * tool_mask, so the
    # renormalization counts the same tokens. The micro-batch above with one of its 5 tokens a tool result (row 0,
    # column 1): 4 loss tokens x 4 micro-batches / 25 = 0.64 (it would be 0.8 counting the tool result).
    trainer = SimpleNamespace(accelerator=SimpleNamespace(num_processes=2),
                              args=SimpleNamespace(steps_per_generation=2), loss_type="bnpo")
    inputs = {"completion_ids": torch.zeros(3, 4), "completion_mask": torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0],
                                                                                     [1, 1, 0, 0]]),
              "tool_mask": torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]]),
              NUM_ROWS: torch.tensor(10), "num_items_in_batch": torch.tensor(25)}
    assert float(renormalized_loss(trainer, torch.tensor(1.0), inputs)) == pytest.approx(0.64)
