"""CONTRIBUTING.md's checklist "Adding a fifth method", followed for a toy method kept in this file (not in the
library): Sign-GRPO, whose advantage is only the sign of a rollout's reward against its group's mean.

    A_i = sign_scale * sign(r_i - mean of the scorable rewards of i's group),  0 for an unscorable row

Each step of the checklist is one piece below: (1) the pure math, (2) the config, (3) a credit part of the credit
core, (4) a preset trainer that picks its parts and overrides no TRL method. The tests check what the checklist
promises: one training step on the tiny model gives the formula's advantages on that step's rewards, the toy passes
the TRL contract scan with no TRL hook of its own, and the config keeps every ``GRPOConfig`` default.

A second toy is a token-level credit with a model pass, added as a folder would add it: one registered part and
nothing else (no preset, no config, no edit anywhere in the library). Surprise credit scores each completion once
more with the policy (``scoring.score_completions``) and spreads the sign advantage over the tokens by how
surprising each token is to the policy:

    A_{i,t} = sign(r_i - mean of the scorable rewards of i's group) * (1 - pi(o_{i,t} | q, o_{i,<t}))

It trains by name, ``CreditTrainer(args=CreditConfig(credit="surprise"))``, and composes like any credit.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from dataclasses import dataclass, field

import pytest
import torch
from trl import GRPOConfig, GRPOTrainer

from trl_credit.config import CreditConfig
from trl_credit.core.batch import RowBatch
from trl_credit.core.context import BatchContext
from trl_credit.core.logs import zero_nonfinite_groups
from trl_credit.core.registry import part_spec, register_part
from trl_credit.core.setup import resolve_method_args
from trl_credit.core.success import SuccessArguments, total_rewards
from trl_credit.core.trainer import Credit, CreditTrainer
from trl_credit.core.viz import CreditLoggingArguments

from .test_trl_contract import _scan


# ------------------------------------------------------------------------------------- (1) the pure math
def sign_advantages(rewards: torch.Tensor, group_size: int, scale: float) -> torch.Tensor:
    """(N,) rewards of consecutive groups of ``group_size`` -> (N,) advantages ``scale * sign(r_i - group mean)``.
    Unscorable rows (NaN reward) get 0 and stay out of the mean; a group with a ±inf reward gets 0 (no sign)."""
    groups = rewards.double().view(-1, group_size)
    mean = groups.nanmean(dim=1, keepdim=True)
    advantages = scale * torch.sign(groups - mean)
    advantages[~torch.isfinite(advantages) | ~torch.isfinite(mean).expand_as(groups)] = 0.0
    return advantages.flatten()


# ------------------------------------------------------------------------------------- (2) the config
@dataclass
class SignGRPOConfig(CreditLoggingArguments, SuccessArguments, GRPOConfig):
    """GRPOConfig + ``sign_scale``. Mixins first: GRPOConfig's fields keep their positions and defaults."""

    sign_scale: float = field(default=1.0, metadata={"help": "Magnitude of every non-zero advantage (> 0)."})

    def __post_init__(self):
        self._validate_success_arguments()
        super().__post_init__()
        scale = self.sign_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"`sign_scale` must be a finite number > 0, got {scale!r}.")


# ------------------------------------------------------------------------------------- (3) the credit part
class SignCredit(Credit):
    """The credit: sign advantages over the batch record's groups (TRL's groups here: GRPO's rollouts)."""

    name = "sign"

    def __init__(self, scale: float):
        self.scale = scale

    def advantages(self, ctx: BatchContext, batch: RowBatch, inputs, output):
        if batch.group_size is None:
            raise ValueError("SignCredit needs TRL's groups of consecutive rows (GRPO's rollouts).")
        values = sign_advantages(total_rewards(batch.rewards_per_func, ctx.reward_weights), batch.group_size,
                                 self.scale)
        batch.log_advantages(values.tolist())  # TRL's completions table shows ours, not GRPO's
        local = batch.local_rows(values).to(output["advantages"])
        # ±inf rewards: warned once and logged each step (the pure function already gave those groups 0)
        local = zero_nonfinite_groups(ctx, local, batch.rewards_per_func, "sign/nonfinite_reward_rate")
        ctx.metric("sign/frac_zero_advantage", (values == 0).double().mean().item())
        return local


# ------------------------------------------------------------------------------------- (4) the preset
class SignGRPOTrainer(CreditTrainer):
    """GRPOTrainer whose sequence advantages are the sign of the reward against the group mean."""

    _tag_names = ["trl", "grpo", "sign-grpo", "trl_credit"]
    _name = "Sign-GRPO"
    _paper = {"title": "Sign-GRPO (a toy method of trl_credit's tests)", "id": None, "citation": None}

    def __init__(self, model, reward_funcs=None, args: SignGRPOConfig | None = None, **kwargs):
        args = resolve_method_args(args, SignGRPOConfig, model, "SignGRPOTrainer", "Sign-GRPO")
        super().__init__(model, reward_funcs, args=args, credit=SignCredit(args.sign_scale), **kwargs)


# ------------------------------------------------------------------------------------- a token credit: one registration
@register_part("credit", "surprise", help="toy of the tests: the sign advantage spread over tokens by surprise")
class SurpriseCredit(Credit):
    """Per-token advantages (B, T): the sign advantage of (1) times 1 - pi(token) under the policy, from one extra
    no-grad scoring pass over this process's rows (module docstring)."""

    def advantages(self, ctx: BatchContext, batch: RowBatch, inputs, output):
        if batch.group_size is None:
            raise ValueError("SurpriseCredit needs TRL's groups of consecutive rows (GRPO's rollouts).")
        signs = sign_advantages(total_rewards(batch.rewards_per_func, ctx.reward_weights), batch.group_size, 1.0)
        batch.log_advantages(signs.tolist())  # the completions table shows each row's direction
        # one no-grad pass of the policy over this process's rows (TRL's log-prob pass)
        logps, _ = ctx.logprobs(output["prompt_ids"], output["prompt_mask"], output["completion_ids"],
                                output["completion_mask"])
        mask = output["completion_mask"]
        surprise = (1.0 - logps.exp()) * mask
        ctx.metric("surprise/mean_surprise", (surprise.sum() / mask.sum()).item())
        local = batch.local_rows(signs).to(surprise)
        return local[:, None] * surprise


# ------------------------------------------------------------------------------------- tests
def test_sign_advantages_by_hand():
    nan = float("nan")
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0,  # mean 0.5          -> +, -, -, +
                            3.0, 0.0, 0.0, 0.0,  # mean 0.75         -> +, -, -, -
                            2.0, 2.0, 2.0, 2.0,  # no variance       -> 0
                            nan, 1.0, 0.0, 0.5,  # mean of 1, 0, 0.5 = 0.5 -> 0 (unscorable), +, -, 0
                            math.inf, 1.0, 0.0, 0.0])  # ±inf: no sign -> 0
    expected = [2, -2, -2, 2, 2, -2, -2, -2, 0, 0, 0, 0, 0, 2, -2, 0, 0, 0, 0, 0]
    assert sign_advantages(rewards, 4, 2.0).tolist() == expected


def _reference(rewards: list[float], group_size: int, scale: float) -> list[float]:
    """The formula with plain loops, for the training step's rewards."""
    result = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        scored = [r for r in group if not math.isnan(r)]
        mean = sum(scored) / len(scored)
        result += [0.0 if math.isnan(r) else scale * ((r > mean) - (r < mean)) for r in group]
    return result


def test_one_step_gives_the_formulas_advantages(tiny_model_path, tiny_dataset, tmp_path, monkeypatch):
    seen_rewards = []  # (completion ids, reward) in TRL's row order, as the reward function returned them

    def id_sum_reward(completions, completion_ids, **kwargs):
        rewards = [None if ids[0] % 11 == 0 else float(sum(ids) % 3) for ids in completion_ids]
        seen_rewards.extend(zip(map(tuple, completion_ids), rewards, strict=True))
        return rewards

    args = SignGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4,
                          max_completion_length=6, max_steps=1, sign_scale=0.5, report_to="none", logging_steps=1,
                          use_cpu=True, save_strategy="no")
    trainer = SignGRPOTrainer(tiny_model_path, id_sum_reward, args=args, train_dataset=tiny_dataset)

    seen_in_loss = []  # (completion ids, advantage) that reach TRL's loss
    compute_loss = trainer._compute_loss

    def record(model, inputs):
        for ids, mask, advantage in zip(inputs["completion_ids"], inputs["completion_mask"], inputs["advantages"]):
            seen_in_loss.append((tuple(ids[mask.bool()].tolist()), advantage.item()))
        return compute_loss(model, inputs)

    monkeypatch.setattr(trainer, "_compute_loss", record)
    trainer.train()

    assert len(seen_rewards) == 8
    rewards = [float("nan") if r is None else r for _, r in seen_rewards]
    expected = _reference(rewards, 4, 0.5)
    assert any(expected), f"rewards {rewards} gave no signal: the check would be vacuous"
    assert Counter(seen_in_loss) == Counter(zip((ids for ids, _ in seen_rewards), expected))
    log = next(entry for entry in trainer.state.log_history if "sign/frac_zero_advantage" in entry)
    assert log["sign/frac_zero_advantage"] == pytest.approx(expected.count(0.0) / 8)
    assert log["sign/nonfinite_reward_rate"] == 0.0


def test_the_toy_passes_the_trl_contract_scan():
    source = "\n".join(inspect.getsource(obj)
                       for obj in (sign_advantages, SignGRPOConfig, SignCredit, SignGRPOTrainer))
    assert _scan([("test_fifth_method.py", source)]) == []
    # the toy overrides no GRPOTrainer method but its constructor: the credit core owns every TRL hook
    hooks = {name for name, value in vars(SignGRPOTrainer).items() if callable(value) and hasattr(GRPOTrainer, name)}
    assert hooks == {"__init__"}
    # the scan is what the checklist's "register a new hook" step answers to: an unregistered one is reported
    extra = source + "\n    def _get_train_sampler(self, dataset=None):\n        return None\n"
    assert "private TRL name _get_train_sampler" in "\n".join(_scan([("test_fifth_method.py", extra)]))


def test_the_config_keeps_grpo_configs_defaults_and_validates_its_field():
    grpo, config = GRPOConfig("my_run", use_cpu=True), SignGRPOConfig("my_run", use_cpu=True)
    assert config.output_dir == "my_run"  # positional output_dir, as with GRPOConfig
    values = {name: getattr(grpo, name) for name in grpo.__dataclass_fields__}
    assert {name: getattr(config, name) for name in values} == values
    assert (config.sign_scale, config.success_reward, config.log_credit_rows) == (1.0, None, 0)
    for bad in (0, -1.0, float("inf"), True, "1"):
        with pytest.raises(ValueError, match="`sign_scale` must be a finite number > 0"):
            SignGRPOConfig("my_run", use_cpu=True, sign_scale=bad)


def test_a_plain_grpo_config_is_refused(tiny_dataset):
    with pytest.raises(TypeError, match="SignGRPOTrainer needs `args` to be a SignGRPOConfig"):
        SignGRPOTrainer("not/loaded", lambda completions, **kw: [0.0] * len(completions),
                        args=GRPOConfig("my_run", use_cpu=True), train_dataset=tiny_dataset)


def test_the_token_credit_is_one_registration_and_trains_by_name(tiny_model_path, tiny_dataset, tmp_path,
                                                                  monkeypatch):
    # The whole addition is the registered class above: CreditConfig accepts the name (it reads the registry) and
    # CreditTrainer builds the part from it.
    assert part_spec("credit", "surprise").cls is SurpriseCredit and SurpriseCredit.name == "surprise"
    seen_rewards = {}  # completion ids -> reward, as the reward function returned them

    def id_sum_reward(completions, completion_ids, **kwargs):
        rewards = [None if ids[0] % 11 == 0 else float(sum(ids) % 3) for ids in completion_ids]
        seen_rewards.update(zip(map(tuple, completion_ids), rewards, strict=True))
        return rewards

    args = CreditConfig(output_dir=str(tmp_path), credit="surprise", per_device_train_batch_size=8,
                        num_generations=4, max_completion_length=6, max_steps=2, report_to="none", logging_steps=1,
                        use_cpu=True, save_strategy="no")
    trainer = CreditTrainer(tiny_model_path, id_sum_reward, args=args, train_dataset=tiny_dataset)
    assert type(trainer.credit) is SurpriseCredit

    checked = []  # per step: (rows, tokens) compared with the reference
    compute_loss = trainer._compute_loss

    def check(model, inputs):
        # The reference, independently: a plain forward of the policy on the same rows (no TRL helper), then the
        # formula with plain loops. The loss of a step runs before its optimizer step, so the policy is the one
        # that scored the rows (one generation per step, one iteration).
        batch = {key: inputs[key] for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
        with torch.no_grad():
            logits = trainer.model(input_ids=torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
                                   attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
                                   ).logits.double()
        start = batch["prompt_ids"].size(1)
        rows = [tuple(ids[mask.bool()].tolist())
                for ids, mask in zip(batch["completion_ids"], batch["completion_mask"])]
        tokens = 0
        for b, completion in enumerate(rows):
            sign = expected_sign[completion]
            for t in range(batch["completion_ids"].size(1)):
                if not batch["completion_mask"][b, t]:
                    assert inputs["advantages"][b, t].item() == 0.0
                    continue
                probs = logits[b, start + t - 1].softmax(-1)  # position start+t-1 predicts completion token t
                expected = sign * (1.0 - probs[batch["completion_ids"][b, t]].item())
                assert inputs["advantages"][b, t].item() == pytest.approx(expected, abs=1e-5), (b, t)
                tokens += 1
        checked.append((len(rows), tokens))
        return compute_loss(model, inputs)

    expected_sign = {}

    def signs_of_the_batch(step):  # each generation batch, before its loss (on_credit)
        output = step.output
        # the step's signs by (1)'s reference loops, from the rewards the reward function returned, by completion
        ids = [tuple(i[m.bool()].tolist()) for i, m in zip(output["completion_ids"], output["completion_mask"])]
        rewards = [float("nan") if seen_rewards[c] is None else seen_rewards[c] for c in ids]
        assert len(set(ids)) == len(ids), "two rows with one completion: the check could not tell them apart"
        expected_sign.update(zip(ids, _reference(rewards, 4, 1.0), strict=True))

    trainer.add_credit_callback(signs_of_the_batch)
    # Kept as a wrap: the check is on what each micro-batch hands TRL's loss, which on_credit does not see.
    monkeypatch.setattr(trainer, "_compute_loss", check)
    trainer.train()

    assert trainer.state.global_step == 2
    assert [rows for rows, _ in checked] == [8, 8] and all(tokens > 0 for _, tokens in checked)
    assert any(expected_sign.values()), "every sign was 0: the check would be vacuous"
    logged = [entry["surprise/mean_surprise"] for entry in trainer.state.log_history
              if "surprise/mean_surprise" in entry]
    assert len(logged) == 2 and all(0.0 < value < 1.0 for value in logged)
    assert trainer._name == "groups x surprise"  # the model card names the combination


def test_the_token_credit_passes_the_contract_scan_and_composes():
    assert _scan([("test_fifth_method.py", inspect.getsource(SurpriseCredit))]) == []
    config = CreditConfig("my_run", use_cpu=True, rollout="resets", credit="surprise", modifiers=["cue"])
    assert (config.rollout, config.credit, config.modifiers) == ("resets", "surprise", ["cue"])
    with pytest.raises(ValueError, match=r"rollout='trees' with credit='surprise': rollout='trees' needs "
                                         r"credit='blocks'"):
        CreditConfig("my_run", use_cpu=True, rollout="trees", credit="surprise")
