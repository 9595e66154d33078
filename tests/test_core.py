"""The credit core (trl_credit/core/trainer.py, trl_credit/core/batch.py): a CreditTrainer without parts is GRPOTrainer to the
last bit; the parts' TRL hooks run in the documented order around TRL's method; the batch record's cuts and groups."""

import pytest
import torch
from trl import GRPOConfig

from tests.golden.record import SCENARIOS, compare, load, ONE_PROCESS_FILE, run_scenario
from trl_credit.core.batch import NO_GROUP, ROW_BASE, RowBatch
from trl_credit.core.setup import user_rollout_func
from trl_credit.core.trainer import CreditTrainer, Part, Rollout


@pytest.mark.parametrize("name", ["grpo/grpo", "grpo/dapo-lora"])
def test_a_credit_trainer_without_parts_is_grpo(name, tiny_model_path, tmp_path):
    # The golden GRPOTrainer runs (token ids, advantages and log-probs reaching the loss, losses, metrics, trained
    # parameters), replayed with CreditTrainer: GRPO's rollouts, TRL's advantages. The one difference: the outcome
    # credit logs the share of groups with a ±inf reward (0 here).
    golden = load(ONE_PROCESS_FILE)
    _, config, settings, lora, extra = SCENARIOS[name]
    fresh = run_scenario(("CreditTrainer", config, settings, lora, extra), tiny_model_path, str(tmp_path),
                         golden["config_defaults"])
    rates = [entry.pop("credit/nonfinite_reward_rate") for entry in fresh["log"] if "loss" in entry]
    assert rates == [0.0, 0.0]
    assert compare(golden["runs"][name], fresh) == []


class _Recording(Part):
    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def loss(self, ctx, proceed, model, inputs):
        self.calls.append(f"{self.name} in")
        self.contexts = getattr(self, "contexts", []) + [ctx]
        result = proceed(model, {**inputs, "seen": inputs.get("seen", ()) + (self.name,)})
        self.calls.append(f"{self.name} out")
        return result

    def rng_state(self):
        return {f"{self.name}_draws": len(self.name)}

    def set_rng_state(self, state):
        self.calls.append(("restored", state[f"{self.name}_draws"]))


def test_parts_wrap_trls_hook_rollout_outermost():
    calls = []

    class Stub:
        parts = [_Recording("rollout", calls), _Recording("credit", calls), _Recording("modifier", calls)]
        _through_parts = CreditTrainer._through_parts
        _batch_context = object()  # inside a generation batch: its context, not the trainer, reaches every hook

    def trls_compute_loss(model, inputs):
        calls.append(("trl", inputs["seen"]))
        return 7

    assert Stub()._through_parts("loss", trls_compute_loss)("model", {}) == 7
    assert calls == ["rollout in", "credit in", "modifier in", ("trl", ("rollout", "credit", "modifier")),
                     "modifier out", "credit out", "rollout out"]
    assert all(part.contexts == [Stub._batch_context] for part in Stub.parts)


class _OwnRows(Rollout):
    """A rollout that builds its rows itself (Rollout.rollout_rows), as SRPO's resets do."""

    name = "own_rows"

    def rollout_rows(self, ctx, prompts):
        self.seen = (ctx, list(prompts))
        return {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": None}


def test_a_rollout_that_builds_its_rows_is_trls_rollout_func_and_gets_the_batch_context(tiny_model_path, tiny_dataset,
                                                                                         tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, report_to="none", use_cpu=True, save_strategy="no")

    def build(**kwargs):
        return CreditTrainer(model=tiny_model_path, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                             args=args, train_dataset=tiny_dataset, **kwargs)

    trainer = build(rollout=_OwnRows())
    assert trainer.rollout_func is not None and user_rollout_func(trainer) is None  # the core's, not a user's
    batch_context = object()
    trainer._batch_context = batch_context  # inside a generation batch
    output = trainer.rollout_func(["p", "p"], trainer)  # as TRL's _generate calls it: rollout_func(prompts, self)
    assert trainer.rollout.seen == (batch_context, ["p", "p"]) and output["completion_ids"] == [[2]]
    assert build().rollout_func is None  # GRPO's rollout: TRL generates
    with pytest.raises(ValueError, match=r"CreditTrainer \(own_rows rollout\) does not support a custom `rollout_func`"):
        build(rollout=_OwnRows(), rollout_func=lambda prompts, trainer: {})


def test_each_parts_random_state_is_saved_and_restored():
    calls = []
    stub = type("Stub", (), {"parts": [_Recording("resets", calls), _Recording("rarity", calls)]})()
    state = CreditTrainer._method_rng_state(stub)
    assert state == {"resets_draws": 6, "rarity_draws": 6}
    CreditTrainer._set_method_rng_state(stub, state)
    assert calls == [("restored", 6), ("restored", 6)]


def test_the_batch_record_cuts_and_groups_rows():
    # 2 processes x 3 rows; groups 4 = {0, 1, 3}, 5 = {2, 4}; row 5 in no group (a fallback row).
    batch = RowBatch(
        rewards_per_func=torch.zeros(6, 2), group_ids=torch.tensor([4, 4, 5, 4, 5, NO_GROUP]),
        row_kinds=torch.full((6,), ROW_BASE), success=torch.zeros(6, dtype=torch.bool),
        scorable=torch.ones(6, dtype=torch.bool), num_local=3, process_index=1,
    )
    assert batch.num_rows == 6 and batch.local == slice(3, 6)
    assert batch.local_rows(list("abcdef")) == list("def")
    assert batch.local_rows(torch.arange(6)).tolist() == [3, 4, 5]
    assert batch.groups() == {4: [0, 1, 3], 5: [2, 4]}


# ------------------------------------------------------------------------------------- composition (docs/composition.md)
def test_a_credit_config_selects_the_parts_by_name(tiny_model_path, tiny_dataset, tmp_path):
    from trl_credit import CreditConfig
    from trl_credit.cue_grpo.parts import RarityWeights
    from trl_credit.oppo.parts import ValueRecursion
    from tests.golden.record import REWARD_FUNCS

    args = CreditConfig(str(tmp_path), use_cpu=True, credit="oppo", modifiers=["cue"], num_generations=4,
                        per_device_train_batch_size=4, max_completion_length=4, report_to="none")
    trainer = CreditTrainer(tiny_model_path, list(REWARD_FUNCS), args=args, train_dataset=tiny_dataset)
    assert [type(part).__name__ for part in trainer.parts] == ["GroupRollout", "ValueRecursion", "RarityWeights"]
    assert isinstance(trainer.credit, ValueRecursion) and isinstance(trainer.modifiers[0], RarityWeights)
    assert trainer._name == "groups x oppo x cue"


def test_unsupported_combinations_are_refused_before_loading_with_the_reason(tmp_path):
    from trl_credit import CreditConfig
    from trl_credit.datpo.parts import BlockCredit, Trees
    from trl_credit.oppo.parts import ValueRecursion

    def build(args, **parts):  # "not/loaded": a refusal must come before any model is loaded
        return CreditTrainer("not/loaded", lambda completions, **kw: [0.0] * len(completions), args=args, **parts)

    from trl import GRPOConfig

    plain = GRPOConfig(str(tmp_path), use_cpu=True)  # no selection: the parts passed are the method
    with pytest.raises(ValueError, match="rollout='trees' with credit='oppo'.*only the block Monte Carlo"):
        build(plain, rollout=Trees(), credit=ValueRecursion())
    with pytest.raises(ValueError, match="credit='blocks' with rollout='groups'"):
        build(plain, credit=BlockCredit())
    grpo_args = CreditConfig(str(tmp_path), use_cpu=True)
    # a part passed with a config that selects another: the config's field checks would not be the part's
    with pytest.raises(ValueError, match=r"credit='oppo' \(the part passed\) but args.credit='outcome'"):
        build(grpo_args, credit=ValueRecursion())
    with pytest.raises(TypeError, match="CreditTrainer needs `args` to be a CreditConfig"):
        build("not a config")
