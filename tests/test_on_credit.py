"""The public ``on_credit`` callback of the credit core (trl_credit/core/trainer.py, docs/design.md#watching-the-credit): once
per generation batch, the batch's record and the advantages the credit and modifiers left, without patching a
trainer method."""

import math

import pytest
import torch
from trl import GRPOConfig

import trl_credit
from trl_credit.core.row_count import NUM_ROWS
from trl_credit.core.trainer import CreditStep, CreditTrainer, GroupRollout, Modifier


def _grpo_reference(rewards: list[float], group_size: int) -> list[float]:
    """TRL's default group-normalized outcome (scale_rewards="group"), with plain loops: (r - mean) / (std + 1e-4)
    over each group, std with Bessel's correction as torch.std."""
    result = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        result += [(r - mean) / (std + 1e-4) for r in group]
    return result


def test_on_credit_sees_each_generation_batch_once_with_the_record_and_its_advantages(
    tiny_model_path, tiny_dataset, tmp_path
):
    returned = []  # the rewards the reward function returned, per call (one call per generation batch here)

    def id_sum_reward(completion_ids, **kwargs):
        rewards = [float(sum(ids) % 3) for ids in completion_ids]
        returned.append(rewards)
        return rewards

    order, steps = [], []
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, max_steps=2, report_to="none", use_cpu=True, save_strategy="no")
    trainer = CreditTrainer(tiny_model_path, id_sum_reward, args=args, train_dataset=tiny_dataset,
                            on_credit=[lambda step: order.append("first"), steps.append])
    trainer.add_credit_callback(lambda step: order.append("added"))
    trainer.train()

    assert len(steps) == len(returned) == 2  # 2 optimizer steps, one generation batch each
    assert order == ["first", "added"] * 2  # on_credit's in its order, then add_credit_callback's
    for number, (step, rewards) in enumerate(zip(steps, returned, strict=True)):
        assert isinstance(step, CreditStep) and step.trainer is trainer and len(step.inputs) == 8
        # the context the parts got: this batch's (its record, inputs and optimizer step), one per batch
        assert step.context.record is step.record and step.context.inputs is step.inputs
        assert (step.context.mode, step.context.step) == ("train", number)
        assert step.record.rewards_per_func[:, 0].tolist() == rewards
        assert step.record.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
        expected = _grpo_reference(rewards, 4)
        assert any(abs(value) > 0 for value in expected), f"rewards {rewards}: no signal, the check would be vacuous"
        assert step.advantages.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-5)
        assert step.output["advantages"] is step.advantages  # what TRL trains on
        assert step.trl_advantages.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-5)  # GRPO's credit is TRL's
        assert step.output["completion_ids"].size(0) == 8
        # What parts read lives in the record: this process's prompts, texts as TRL decoded them, the loss mask.
        assert step.record.prompts == [x["prompt"] for x in step.inputs]
        ids, mask = step.output["completion_ids"], step.output["completion_mask"]
        decode = trainer.processing_class.decode
        assert step.record.completions == [decode(ids[i][mask[i].bool()], skip_special_tokens=True) for i in range(8)]
        assert torch.equal(step.record.loss_mask, mask)
    assert steps[0].context is not steps[1].context


def test_a_preset_calls_an_added_callback_with_its_modifiers_advantages(tiny_model_path, tiny_dataset, tmp_path):
    seen = []
    args = trl_credit.CueGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                                    max_completion_length=6, max_steps=1, report_to="none", use_cpu=True,
                                    save_strategy="no")
    trainer = trl_credit.CueGRPOTrainer(model=tiny_model_path, reward_funcs=lambda completion_ids, **kw:
                                        [float(len(ids) % 2) for ids in completion_ids],
                                        args=args, train_dataset=tiny_dataset)
    trainer.add_credit_callback(seen.append)
    trainer.train()
    (step,) = seen
    assert step.record is not None and step.advantages.shape == (8,)
    assert step.output["advantages"] is step.advantages


class _Doubled(Modifier):
    name = "doubled"

    def apply(self, ctx, batch, inputs, output, advantages):
        return advantages * 2


class _OwnRows(GroupRollout):
    """A rollout that builds its own training rows: TRL's rows again, in a new dict (as DATPO's trees build theirs)."""

    builds_rows = True

    def training_batch(self, ctx, batch, inputs, output, advantages):
        return {**output, "advantages": advantages, NUM_ROWS: torch.tensor(advantages.size(0))}


def _one_step(tiny_model_path, tiny_dataset, tmp_path, **parts):
    seen, returned = [], []

    def id_sum_reward(completion_ids, **kwargs):
        returned.append([float(sum(ids) % 3) for ids in completion_ids])
        return returned[-1]

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, max_steps=1, report_to="none", use_cpu=True, save_strategy="no")
    trainer = CreditTrainer(tiny_model_path, id_sum_reward, args=args, train_dataset=tiny_dataset,
                            on_credit=seen.append, **parts)
    trainer.train()
    (step,), (rewards,) = seen, returned
    return step, rewards


def test_trl_advantages_are_trls_before_any_part_acted(tiny_model_path, tiny_dataset, tmp_path):
    step, rewards = _one_step(tiny_model_path, tiny_dataset, tmp_path, modifiers=[_Doubled()])
    expected = _grpo_reference(rewards, 4)
    assert any(abs(value) > 0 for value in expected), f"rewards {rewards}: no signal, the check would be vacuous"
    assert step.trl_advantages.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-5)  # not doubled
    assert step.advantages.tolist() == pytest.approx([2 * a for a in expected], rel=1e-5, abs=1e-5)


def test_trl_advantages_are_none_when_the_rollout_builds_its_own_rows(tiny_model_path, tiny_dataset, tmp_path):
    step, rewards = _one_step(tiny_model_path, tiny_dataset, tmp_path, rollout=_OwnRows())
    assert step.trl_advantages is None
    assert step.output["advantages"].tolist() == pytest.approx(_grpo_reference(rewards, 4), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("on_credit", [3, [print, "not a function"]])
def test_a_callback_that_is_not_callable_is_refused_by_name(on_credit):
    # refused before anything is loaded: the model path is never read
    with pytest.raises(TypeError, match="on_credit: expected a callable"):
        CreditTrainer("no-such-model", on_credit=on_credit)
