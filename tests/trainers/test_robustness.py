"""Inputs every trainer must survive like GRPOTrainer (docs/design.md#robustness): a non-finite reward, an empty
completion, a hybrid (attention + linear-attention) model."""

import math
import warnings

import pytest
import torch

import trl_credit
from trl_credit.tasks.rewards import completion_text

from tests.trainers.test_all_trainers import CASES, CaptureLogs  # method -> (trainer, config, settings, prefix)


def _trainer(method, model, reward_funcs, dataset, tmp_path, **overrides):
    trainer_name, config_name, settings, _ = CASES[method]
    config_class = getattr(trl_credit, config_name)
    args = config_class(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        max_completion_length=8,
        max_steps=1,
        learning_rate=5e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
        **{**settings, **overrides},
    )
    capture = CaptureLogs()
    trainer = getattr(trl_credit, trainer_name)(
        model=model, reward_funcs=reward_funcs, args=args, train_dataset=dataset, callbacks=[capture]
    )
    return trainer, capture


def _all_finite(trainer) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())


# ---------------------------------------------------------------------------------------------- non-finite rewards


def _first_row_reward(value):
    def exploding_reward(completions, **kwargs):
        # parity of the text length (variance in every group), and `value` for the batch's second row
        rewards = [float(len(completion_text(c)) % 2) for c in completions]
        rewards[min(1, len(rewards) - 1)] = value
        return rewards

    return exploding_reward


@pytest.mark.parametrize(
    "value, overrides",
    [
        pytest.param(math.inf, {}, id="+inf"),
        pytest.param(-math.inf, {}, id="-inf"),
        pytest.param(math.inf, dict(scale_rewards="none"), id="+inf-scale_none"),
    ],
)
@pytest.mark.parametrize("method", sorted(CASES))
def test_a_nonfinite_reward_leaves_the_model_finite_and_is_named(
    method, value, overrides, tiny_model_path, tiny_dataset, tmp_path
):
    trainer, capture = _trainer(method, tiny_model_path, [_first_row_reward(value)], tiny_dataset, tmp_path, **overrides)
    outputs = []
    trainer.add_credit_callback(lambda step: outputs.append(step.output))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert _all_finite(trainer), "a ±inf reward turned the model into NaN"
    named = [str(w.message) for w in caught if "'exploding_reward' returned ±inf" in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]
    rate = CASES[method][3] + "nonfinite_reward_rate"
    logged = [logs[rate] for logs in capture.logs if rate in logs]
    assert logged and 0 < logged[0] <= 1, capture.logs
    if method in ("cue_grpo", "oppo"):  # TRL's layout: the first group (rows 0-3) holds the ±inf reward
        advantages = outputs[0]["advantages"]
        assert (advantages[:4] == 0).all() and (advantages[4:] != 0).any(), advantages


def _trl_advantages(rewards_per_func, weights, group_size, scale="group", aggregation="sum_then_normalize"):
    """GRPOTrainer._generate_and_score_completions (trl 1.16.0), restated: TRL's advantages of one batch."""
    from trl.trainer.utils import nanstd

    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        mean = torch.nanmean(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size)
        if scale == "batch":
            std = nanstd(rewards).expand_as(rewards)
        else:
            std = nanstd(rewards.view(-1, group_size), dim=1).repeat_interleave(group_size)
        advantages = rewards - mean
        if scale != "none":
            advantages = advantages / (std + 1e-4)
    else:
        grouped = rewards_per_func.view(-1, group_size, rewards_per_func.size(1))
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True)
        reward_k = ((grouped - mean_k) / (std_k + 1e-4)).view(-1, rewards_per_func.size(1))
        rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        advantages = (rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


@pytest.mark.parametrize("value", [math.inf, -math.inf])
@pytest.mark.parametrize("scale", ["group", "batch"])
def test_srpo_group_advantages_treat_an_infinite_reward_as_trl(value, scale):
    from trl_credit.srpo.advantages import grouped_advantages

    rewards = torch.tensor([[value], [0.0], [1.0], [1.0], [0.0], [1.0], [1.0], [0.0]], dtype=torch.float64)
    expected = _trl_advantages(rewards, torch.ones(1, dtype=torch.float64), 4, scale)
    assert (expected[:4] == 0).all()  # TRL: the group with the ±inf reward takes no step
    actual = grouped_advantages(rewards[:, 0], [0] * 4 + [1] * 4, scale=scale)
    torch.testing.assert_close(actual.double(), expected, atol=1e-6, rtol=0)


def test_srpo_group_advantages_without_scaling_zero_an_infinite_group():
    # TRL gives the other rows of the group -3.4e38 here (and a NaN model); SRPO gives the group 0.
    from trl_credit.srpo.advantages import grouped_advantages

    rewards = torch.tensor([math.inf, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0])
    actual = grouped_advantages(rewards, [0] * 4 + [1] * 4, scale="none")
    torch.testing.assert_close(actual, torch.tensor([0.0, 0.0, 0.0, 0.0, -0.5, 0.5, 0.5, -0.5]))


def test_srpo_normalize_then_sum_drops_an_infinite_function_from_its_group_as_trl():
    from trl_credit.srpo.advantages import normalize_then_sum_advantages

    # function 0 returns +inf once in group 0: TRL drops it there; function 1 still counts
    rewards = torch.tensor(
        [[math.inf, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]],
        dtype=torch.float64,
    )
    weights = torch.tensor([1.0, 0.5], dtype=torch.float64)
    expected = _trl_advantages(rewards, weights, 4, aggregation="normalize_then_sum")
    assert torch.isfinite(expected).all() and (expected[:4] != 0).all()
    actual = normalize_then_sum_advantages(rewards, [0] * 4 + [1] * 4, weights)
    torch.testing.assert_close(actual.double(), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("value", [math.inf, -math.inf])
def test_datpo_tree_with_an_infinite_leaf_gets_zero_advantage(value):
    from trl_credit.datpo.tree import block_advantages

    # Two base rollouts; rollout 0 forks at node "f" (blocks root→f, f→leaf) and one branch from f.
    start = [0, "f", 0, "f"]
    end = ["f", None, None, None]
    for leaf in (1, 2, 3):
        reward = [None, 1.0, 0.0, 1.0]
        reward[leaf] = value
        advantages = block_advantages(start, end, reward)
        assert advantages.tolist() == [0.0, 0.0, 0.0, 0.0], (leaf, advantages)
    # the same tree with finite rewards: V(root) = 2/3, V(f) = 1 (subtree values, docs/datpo.md)
    torch.testing.assert_close(
        block_advantages(start, end, [None, 1.0, 0.0, 1.0]),
        torch.tensor([1 / 3, 0.0, -2 / 3, 0.0], dtype=torch.float64),
    )


# ---------------------------------------------------------------------------------------------- empty completions


def parity_reward(completions, **kwargs):
    return [float(len(completion_text(c)) % 2) for c in completions]


def _empty_row_in_first_call(monkeypatch, row):
    """A generation backend (GRPOTrainer._generate_single_turn, under every trainer's own code) whose first call
    returns 0 tokens for ``row``: what a custom backend may do where HF generate and vLLM return the EOS token."""
    from trl import GRPOTrainer

    real, calls = GRPOTrainer._generate_single_turn, []

    def generate(self, prompt_ids, *args, **kwargs):
        completion_ids, logprobs = real(self, prompt_ids, *args, **kwargs)
        calls.append(len(completion_ids))
        if len(calls) == 1:
            completion_ids = [list(ids) for ids in completion_ids]
            completion_ids[row] = []
            if logprobs is not None:
                logprobs = [list(lp) for lp in logprobs]
                logprobs[row] = []
        return completion_ids, logprobs

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", generate)
    return calls


def test_trl_grpo_cannot_train_on_an_empty_completion(tiny_model_path, tiny_dataset, tmp_path, monkeypatch):
    # What the trainers below match: TRL 1.16 reads each completion's last token (GRPOTrainer._generate).
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=8, max_steps=1, report_to="none", save_strategy="no", use_cpu=True)
    trainer = GRPOTrainer(model=tiny_model_path, reward_funcs=parity_reward, args=args, train_dataset=tiny_dataset)
    _empty_row_in_first_call(monkeypatch, 1)
    with pytest.raises(IndexError):
        trainer.train()


@pytest.mark.parametrize("method", sorted(CASES))
def test_an_empty_training_completion_is_refused_by_name(method, tiny_model_path, tiny_dataset, tmp_path, monkeypatch):
    trainer, _ = _trainer(method, tiny_model_path, [parity_reward], tiny_dataset, tmp_path)
    _empty_row_in_first_call(monkeypatch, 1)  # SRPO: a base rollout (its first call: base rows, then candidates)
    with pytest.raises(ValueError, match=r"empty completion \(0 tokens\) for 1 of 8 rows \(first: row 1\)"):
        trainer.train()


def _emptied(completion_ids, logprobs, row):
    completion_ids = [list(ids) for ids in completion_ids]
    completion_ids[row] = []
    if logprobs is not None:
        logprobs = [list(lp) for lp in logprobs]
        logprobs[row] = []
    return completion_ids, logprobs


@pytest.mark.parametrize("method", ["cue_grpo", "oppo"])
def test_an_empty_completion_from_a_subclass_override_is_refused_by_name(method, tiny_model_path, tiny_dataset,
                                                                         tmp_path):
    # What a user writes: a subclass whose _generate_single_turn post-processes the trainer's own (the check must
    # see what TRL's _generate receives, not what the core's override returned below it)
    trainer_class = getattr(trl_credit, CASES[method][0])

    class EmptyingTrainer(trainer_class):
        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
            completion_ids, logprobs = super()._generate_single_turn(prompt_ids, images, multimodal_fields,
                                                                     num_generations, has_tool_images)
            return _emptied(completion_ids, logprobs, 1)

    _, config_name, settings, _ = CASES[method]
    args = getattr(trl_credit, config_name)(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_completion_length=8, max_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, **settings)
    trainer = EmptyingTrainer(model=tiny_model_path, reward_funcs=[parity_reward], args=args,
                              train_dataset=tiny_dataset)
    with pytest.raises(ValueError, match=rf"{type(trainer).__name__}: the generation \(_generate_single_turn\) "
                                         r"returned an empty completion \(0 tokens\) for 1 of 8 rows \(first: row 1\)"):
        trainer.train()


@pytest.mark.parametrize("method", ["cue_grpo", "oppo"])
def test_an_empty_completion_from_a_generation_set_on_the_instance_is_refused_by_name(method, tiny_model_path,
                                                                                      tiny_dataset, tmp_path):
    trainer, _ = _trainer(method, tiny_model_path, [parity_reward], tiny_dataset, tmp_path)
    own = trainer._generate_single_turn

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return _emptied(*own(prompt_ids, images, multimodal_fields, num_generations, has_tool_images), 2)

    trainer._generate_single_turn = generate
    with pytest.raises(ValueError, match=r"empty completion \(0 tokens\) for 1 of 8 rows \(first: row 2\)"):
        trainer.train()
    assert trainer._generate_single_turn is generate  # the user's function is left in place


def test_cue_grpo_refuses_an_empty_completion_from_a_rollout_func(tiny_model_path, tiny_dataset, tmp_path):
    def rollout_func(prompts, trainer):
        eos = trainer.processing_class.eos_token_id
        completions = [[5, 6, eos]] * len(prompts)
        completions[2] = []
        return {"prompt_ids": [[5, 6, 7]] * len(prompts), "completion_ids": completions, "logprobs": None}

    args = trl_credit.CueGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                                    max_completion_length=8, max_steps=1, report_to="none", save_strategy="no",
                                    use_cpu=True)
    trainer = trl_credit.CueGRPOTrainer(model=tiny_model_path, reward_funcs=parity_reward, args=args,
                                        train_dataset=tiny_dataset, rollout_func=rollout_func)
    with pytest.raises(ValueError, match=r"the rollout_func returned an empty completion .* \(first: row 2\)"):
        trainer.train()


def test_srpo_skips_an_empty_seed_candidate_by_name(tiny_model_path, tiny_dataset, tmp_path, monkeypatch):
    trainer, capture = _trainer("srpo", tiny_model_path, [parity_reward], tiny_dataset, tmp_path)
    # SRPO's first call: 4 base rows, then the first seed candidate (row 4), empty: incorrect by the parity
    # reward (length 0), but with no thought to reset from
    assert trainer.args.num_base_generations == 4 and trainer.args.seed_candidates_per_round == 1
    calls = _empty_row_in_first_call(monkeypatch, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert calls[0] == 5
    assert any("seed candidates were empty (0 tokens)" in str(w.message) for w in caught)
    logs = next(logs for logs in capture.logs if "srpo/seed_rounds" in logs)
    # one prompt, one candidate per round: as many candidates scored as rounds, the first of them empty
    assert logs["srpo/empty_candidate_rate"] == pytest.approx(1 / logs["srpo/seed_rounds"])
    assert _all_finite(trainer)


# ---------------------------------------------------------------------------------------------- hybrid models


@pytest.fixture(scope="module")
def tiny_hybrid_model_path(tmp_path_factory):
    from tests.tiny import build_tiny_hybrid_model

    return build_tiny_hybrid_model(str(tmp_path_factory.mktemp("tiny_hybrid_model")))


@pytest.mark.parametrize("method", sorted(CASES))
def test_every_trainer_trains_a_hybrid_attention_and_ssm_model(method, tiny_hybrid_model_path, tiny_dataset, tmp_path):
    # NemotronH's cache holds a linear-attention (Mamba) layer, whose rows cannot be selected in this transformers:
    # DATPO's and SRPO's shared prefill and DATPO's row compaction must stand aside, as HF generate does not need them.
    trainer, _ = _trainer(method, tiny_hybrid_model_path, [parity_reward], tiny_dataset, tmp_path)
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 1 and _all_finite(trainer)
    assert any(not torch.equal(before[name], p) for name, p in trainer.model.named_parameters())


@pytest.mark.parametrize("repeated", [True, False], ids=["shared-prefill-and-compaction", "compaction"])
def test_shared_prefill_and_row_compaction_stand_aside_for_a_hybrid_cache(
    repeated, tiny_hybrid_model_path, tiny_tokenizer, tiny_dataset, tmp_path
):
    # Repeated rows (shared prefill) or not, with budgets that leave 2 of 5 rows running after 3 tokens (row
    # compaction): with a Mamba layer in the cache neither applies, so generate runs its own prefill of all 5 rows
    # and keeps them to the end, and the tokens are those of the same call without the hooks.
    from trl import GRPOConfig, GRPOTrainer

    from trl_credit.core.generation import sampling_overrides
    from trl_credit.generation.hooks import hf_generate_hooks

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, report_to="none",
                      use_cpu=True)
    trainer = GRPOTrainer(model=tiny_hybrid_model_path, reward_funcs=parity_reward, args=args,
                          train_dataset=tiny_dataset)
    texts = ["What is 3 + 4? First, we add", "Step 1:", "Let x = 2. Then", "Consider 2x + 3 = 11.", "Add 5 and 6."]
    a, b = (tiny_tokenizer(text)["input_ids"] for text in texts[:2])
    rows = [a, a, a, b, b] if repeated else [tiny_tokenizer(text)["input_ids"] for text in texts]
    budgets = [2, 3, 3, 12, 12]
    model = trainer.accelerator.unwrap_model(trainer.model)
    shapes = []
    handle = model.register_forward_hook(
        lambda module, args, kwargs, output: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        with sampling_overrides(trainer, max_new_tokens=12, greedy=True):
            plain, _ = trainer._generate_single_turn(rows, None, {}, 1)
            shapes.clear()
            with hf_generate_hooks(trainer, budgets, compact_rows=True):
                hooked, _ = trainer._generate_single_turn(rows, None, {}, 1)
    finally:
        handle.remove()
    assert [c[:n] for c, n in zip(hooked, budgets)] == [c[:n] for c, n in zip(plain, budgets)]
    assert shapes[0] == (5, max(map(len, rows))) and all(batch == 5 for batch, _ in shapes)


def test_rows_are_selectable_only_where_every_layer_selects_all_its_state():
    from transformers.cache_utils import (
        DummyLayer,
        DynamicLayer,
        DynamicSlidingWindowLayer,
        LinearAttentionAndFullAttentionLayer,
        LinearAttentionLayer,
    )

    from trl_credit.generation.hooks import _layers_rows_selectable

    assert _layers_rows_selectable([DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=4), DummyLayer()])
    assert not _layers_rows_selectable([DynamicLayer(), LinearAttentionLayer()])  # no batch_select_indices
    # has DynamicLayer's batch_select_indices, which would leave its conv/recurrent states unselected
    assert hasattr(LinearAttentionAndFullAttentionLayer, "batch_select_indices")
    assert not _layers_rows_selectable([LinearAttentionAndFullAttentionLayer()])
