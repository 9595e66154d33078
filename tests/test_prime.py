"""credit="implicit_prm": PRIME's math (Cui et al. 2025; docs/process.md, "Implicit process rewards") against the
paper's equations worked by hand (the arithmetic in the comments) and against an independent slow reference (plain
Python loops over lists), the config fields and the composition's refusals. Trainer tests: tests/test_prime_trainer.py.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from trl_credit.prime.advantages import (
    batch_max_normalized,
    classification_accuracy,
    cross_entropy_loss,
    has_baseline,
    largest_return,
    leave_one_out_means,
    outcome_advantages,
    pairwise_accuracy,
    prime_advantages,
    process_returns,
    token_rewards,
    whitened,
)


# ------------------------------------------------------------------------------------------- by hand
def test_token_rewards_are_beta_times_the_log_ratio_on_the_mask():
    # beta 0.1: (-1.0 - -1.5) * 0.1 = 0.05; (-2 - -2) * 0.1 = 0; the masked token 0 whatever its log-ratio.
    prm = torch.tensor([[-1.0, -2.0, -0.5]])
    ref = torch.tensor([[-1.5, -2.0, -3.0]])
    assert token_rewards(prm, ref, torch.tensor([[1, 1, 0]]), 0.1).tolist()[0] == pytest.approx([0.05, 0.0, 0.0])


def test_cross_entropy_by_hand():
    # Row 1: r_phi(y) = 0, label 1: -log sigma(0) = ln 2. Row 2: r_phi(y) = ln 3, label 0: -log(1 - 3/4) = ln 4.
    # Sum ln 8 = 2.0794415.
    loss = cross_entropy_loss(torch.tensor([0.0, math.log(3.0)], dtype=torch.float64), torch.tensor([1.0, 0.0]))
    assert float(loss) == pytest.approx(math.log(8.0)) == pytest.approx(2.0794415)


def test_accuracies_by_hand():
    scores = torch.tensor([0.3, -0.1, 0.0, 0.5])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    # sign right, right, 0 exactly (sigma = 1/2: half), wrong
    assert classification_accuracy(scores, labels).tolist() == [1.0, 1.0, 0.5, 0.0]
    # One group, labels 1 0 0 1. Pairs with different labels: (0,1) 0.4 > 0 agrees; (0,2) 0.1 > 0 agrees; (1,3) and
    # (2,3) r_3 is higher and y_3 = 1: both agree: 4 / 4. With r_2 = 0.4, (0,2) disagrees: 3 / 4.
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert pairwise_accuracy(torch.tensor([0.3, -0.1, 0.2, 0.5]), labels, [0, 0, 0, 0]) == 1.0
    assert pairwise_accuracy(torch.tensor([0.3, -0.1, 0.4, 0.5]), labels, [0, 0, 0, 0]) == 0.75
    # Two groups of two, the second with equal labels (no pair): only the first counts. None without any pair.
    assert pairwise_accuracy(torch.tensor([0.1, 0.2, 5.0, -5.0]), labels[[0, 1, 0, 0]], [0, 0, 1, 1]) == 0.0
    assert pairwise_accuracy(torch.tensor([0.1, 0.2]), torch.tensor([1.0, 1.0]), [0, 0]) is None


def test_leave_one_out_means_and_outcome_advantages_by_hand():
    # Group 0 = rows 0-2 (values 1, 2, 3): row 0 (2 + 3) / 2 = 2.5, row 1 2, row 2 1.5; row 3 alone in group 1: 0;
    # row 4 invalid: 0 and out of its group's means.
    values = torch.tensor([1.0, 2.0, 3.0, 10.0, 100.0])
    groups = torch.tensor([0, 0, 0, 1, 0])
    valid = torch.tensor([True, True, True, True, False])
    assert leave_one_out_means(values, groups, valid).tolist() == [2.5, 2.0, 1.5, 0.0, 0.0]
    # RLOO with outcome rewards 1 0 0 1 in one group: 1 - 1/3 = 2/3, 0 - 2/3, 0 - 2/3, 2/3.
    advantages = outcome_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long),
                                    torch.ones(4, dtype=torch.bool))
    assert advantages.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # A lone valid row has no baseline: 0, not its reward.
    assert outcome_advantages(torch.tensor([1.0, 5.0]), torch.tensor([0, 0]), torch.tensor([True, False])
                              ).tolist() == [0.0, 0.0]


def test_process_returns_by_hand():
    # r = 0.2, -0.1 (and a masked token), baseline 0.05: centred 0.15, -0.15. gamma 1: returns 0.0, -0.15, 0.
    # gamma 0.5: token 1 -0.15, token 0 0.15 + 0.5 * -0.15 = 0.075.
    rewards, mask, baseline = torch.tensor([[0.2, -0.1, 0.3]]), torch.tensor([[1, 1, 0]]), torch.tensor([0.05])
    assert process_returns(rewards, mask, baseline).tolist()[0] == pytest.approx([0.0, -0.15, 0.0])
    assert process_returns(rewards, mask, baseline, gamma=0.5).tolist()[0] == pytest.approx([0.075, -0.15, 0.0])


def test_a_group_of_three_by_hand():
    # The paper's advantage (§3.3), no scaling. Token rewards a [0.1, 0.3], b [-0.2, 0.0, -0.1], c [0.2]; outcomes
    # 1, 0, 1. Mean token rewards 0.2, -0.1, 0.2. Process baselines (leave-one-out means of the others' means):
    # a (-0.1 + 0.2) / 2 = 0.05, b (0.2 + 0.2) / 2 = 0.2, c (0.2 - 0.1) / 2 = 0.05. Returns of r - b:
    # a [0.05 + 0.25, 0.25] = [0.30, 0.25]; b [-0.4 - 0.2 - 0.3, -0.2 - 0.3, -0.3] = [-0.9, -0.5, -0.3]; c [0.15].
    # Outcome RLOO: a 1 - (0 + 1) / 2 = 0.5, b 0 - 1 = -1, c 0.5. A = returns + outcome:
    # a [0.8, 0.75], b [-1.9, -1.5, -1.3], c [0.65].
    rewards = torch.tensor([[0.1, 0.3, 0.0], [-0.2, 0.0, -0.1], [0.2, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    groups, valid = torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool)
    means = rewards.sum(dim=1) / mask.sum(dim=1)
    baselines = leave_one_out_means(means, groups, valid)
    assert baselines.tolist() == pytest.approx([0.05, 0.2, 0.05])
    advantages = prime_advantages(process_returns(rewards, mask, baselines),
                                  outcome_advantages(torch.tensor([1.0, 0.0, 1.0]), groups, valid), mask,
                                  has_baseline(groups, valid))
    expected = [[0.8, 0.75, 0.0], [-1.9, -1.5, -1.3], [0.65, 0.0, 0.0]]
    assert advantages.tolist() == [pytest.approx(row) for row in expected]


def test_batch_max_normalization_and_whitening_by_hand():
    # Reverse cumulative sums: a [0.4, 0.3], b [-0.3, -0.1, -0.1]: the largest |return| is 0.4.
    rewards = torch.tensor([[0.1, 0.3, 0.0], [-0.2, 0.0, -0.1]], dtype=torch.float64)
    assert largest_return(rewards) == pytest.approx(0.4)
    assert batch_max_normalized(rewards, 0.4).tolist()[0] == pytest.approx([0.1 / 0.400001, 0.3 / 0.400001, 0.0])
    # Values 1, 2, 3 (and a masked 7): mean 2, unbiased variance 1: (x - 2) / sqrt(1 + 1e-8).
    values, mask = torch.tensor([1.0, 2.0, 3.0, 7.0]), torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert whitened(values, mask, 6.0, 14.0, 3.0).tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0])
    assert whitened(values, mask, 1.0, 1.0, 1.0).tolist() == values.mul(mask).tolist()  # one value: unscaled


def test_the_prompt_filter_by_hand():
    from trl_credit.prime.filter import kept_rows, truncated_rows

    # Groups of 5 (so that 0.2 and 0.8 are reachable). Group 0: 1 of 5 correct, accuracy 0.2: not strictly above the
    # lower bound, dropped. Group 1: 3 of 5, 0.6: kept. Group 2: 4 of 5, 0.8: dropped. Group 3: 2 of 4 credited
    # rows (its last row unscorable), 0.5: kept, unless a truncated row (the unscorable one counts too) drops it.
    success = torch.tensor([1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1, 0, 0], dtype=torch.bool)
    groups = torch.arange(20) // 5
    credited = torch.ones(20, dtype=torch.bool)
    credited[19] = False
    truncated = torch.zeros(20, dtype=torch.bool)
    kept, groups_seen, dropped = kept_rows(groups, credited, success, truncated, 0.2, 0.8, True)
    assert kept.tolist() == [False] * 5 + [True] * 5 + [False] * 5 + [True] * 4 + [False]
    assert (groups_seen, dropped) == (4, 2)
    truncated[19] = True  # group 3's unscorable row is truncated: the group goes too (verl: any row's length)
    kept, _, dropped = kept_rows(groups, credited, success, truncated, 0.2, 0.8, True)
    assert kept.tolist() == [False] * 5 + [True] * 5 + [False] * 10 and dropped == 3
    kept, _, dropped = kept_rows(groups, credited, success, truncated, 0.2, 0.8, False)  # truncation ignored
    assert dropped == 2 and kept[15:19].all()
    # Wider bounds [0, 1): only all-correct groups go; a group with no credited row is not counted.
    credited[5:10] = False
    kept, groups_seen, dropped = kept_rows(groups, credited, success, truncated, 0.0, 1.0, False)
    assert (groups_seen, dropped) == (3, 0) and kept.sum() == 14
    # TRL's truncation: the last generated token neither EOS (2) nor padding (0); no token at all is truncated.
    assert truncated_rows([2, 0, 7, None], [2, 0]) == [False, False, True, True]


# ------------------------------------------------------------------------------------------- slow reference
def reference_advantages(prm, ref, lengths, groups, valid, outcomes, beta, gamma, norm, whiten, process_coef,
                         outcome_coef):
    """The whole PRIME advantage with plain loops over lists: the paper's §3.3 plus the released recipe's scalings."""
    n = len(prm)
    r = [[beta * (prm[i][t] - ref[i][t]) if valid[i] else 0.0 for t in range(lengths[i])] for i in range(n)]
    if norm:
        biggest = 0.0
        for i in range(n):
            for t in range(lengths[i]):
                biggest = max(biggest, abs(sum(r[i][t:])))
        r = [[x / (biggest + 1e-6) for x in row] for row in r]
    A = [[0.0] * lengths[i] for i in range(n)]
    for i in range(n):
        if not valid[i]:
            continue
        others = [j for j in range(n) if j != i and valid[j] and groups[j] == groups[i]]
        if not others:
            continue
        b = sum(sum(r[j]) / lengths[j] for j in others) / len(others)
        outcome = outcomes[i] - sum(outcomes[j] for j in others) / len(others)
        for t in range(lengths[i]):
            ret = sum(gamma ** (s - t) * (r[i][s] - b) for s in range(t, lengths[i]))
            A[i][t] = process_coef * ret + outcome_coef * outcome
    if whiten:  # over the rows with a baseline only: a row alone in its group keeps 0 and is out of the moments
        compared = [valid[i] and any(j != i and valid[j] and groups[j] == groups[i] for j in range(n))
                    for i in range(n)]
        pool = [A[i][t] for i in range(n) if compared[i] for t in range(lengths[i])]
        mean = sum(pool) / len(pool)
        var = sum((x - mean) ** 2 for x in pool) / (len(pool) - 1)
        A = [[(x - mean) / math.sqrt(var + 1e-8) if compared[i] else 0.0 for x in A[i]] for i in range(n)]
    return A


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("norm,whiten,gamma", [(False, False, 1.0), (True, True, 1.0), (True, False, 0.9)])
def test_the_functions_equal_the_slow_reference(seed, norm, whiten, gamma):
    rng = random.Random(seed)
    n, T, beta = 12, 7, 0.05
    lengths = [rng.randint(1, T) for _ in range(n)]
    groups = [i // 4 for i in range(n)]
    valid = [rng.random() > 0.15 for _ in range(n)]
    outcomes = [float(rng.random() < 0.5) + rng.choice([0.0, 1.0]) for _ in range(n)]  # accuracy + format
    prm = [[rng.gauss(-2, 1) for _ in range(T)] for _ in range(n)]
    ref = [[x + rng.gauss(0, 0.5) for x in row] for row in prm]
    expected = reference_advantages(prm, ref, lengths, groups, valid, outcomes, beta, gamma, norm, whiten, 1.0, 0.7)

    mask = torch.tensor([[1.0 if t < lengths[i] else 0.0 for t in range(T)] for i in range(n)], dtype=torch.float64)
    valid_t, groups_t = torch.tensor(valid), torch.tensor(groups)
    rewards = token_rewards(torch.tensor(prm, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64),
                            mask * valid_t[:, None], beta)
    if norm:
        rewards = batch_max_normalized(rewards, largest_return(rewards))
    baselines = leave_one_out_means(rewards.sum(dim=1) / mask.sum(dim=1), groups_t, valid_t)
    values = prime_advantages(process_returns(rewards, mask, baselines, gamma),
                              outcome_advantages(torch.tensor(outcomes), groups_t, valid_t), mask,
                              has_baseline(groups_t, valid_t), 1.0, 0.7)
    assert any(v and sum(valid[j] for j in range(n) if groups[j] == groups[i]) == 1 for i, v in enumerate(valid)) \
        or seed != 0  # seed 0 holds a valid row alone in its group (no baseline: 0)
    if whiten:
        trained = mask * has_baseline(groups_t, valid_t)[:, None]
        values = whitened(values, trained, float((values * trained).sum()), float((values ** 2 * trained).sum()),
                          float(trained.sum()))
    for i in range(n):
        assert values[i, :lengths[i]].tolist() == pytest.approx(expected[i], abs=1e-9), i
        assert values[i, lengths[i]:].abs().sum() == 0


# ------------------------------------------------------------------------------------------- config
def test_config_fields_defaults_and_checks():
    from trl_credit import CreditConfig

    config = CreditConfig("out", credit="implicit_prm", use_cpu=True)
    assert (config.prime_beta, config.prime_learning_rate, config.prime_update, config.prime_updates_per_batch,
            config.prime_process_coef, config.prime_outcome_coef, config.prime_gamma, config.prime_process_norm,
            config.prime_whiten, config.prime_grad_clip) == (0.05, 1e-6, "before", 1, 1.0, 1.0, 1.0, "batch_max", True,
                                                             10.0)
    assert (config.prime_prompt_filter, config.prime_filter_accuracy_lower, config.prime_filter_accuracy_upper,
            config.prime_filter_truncated) == (True, 0.2, 0.8, True)  # Algorithm 1's bounds, the codes' truncation
    for field, value, message in [
        ("prime_beta", 0.0, "prime_beta must be a finite number > 0"),
        ("prime_learning_rate", float("nan"), "prime_learning_rate must be a finite number > 0"),
        ("prime_update", "during", "prime_update must be one of 'before'"),
        ("prime_process_norm", "max", "prime_process_norm must be one of 'batch_max'"),
        ("prime_gamma", 1.5, r"prime_gamma must be a number in \[0, 1\]"),
        ("prime_updates_per_batch", -1, "prime_updates_per_batch must be an integer >= 0"),
        ("prime_outcome_coef", -1.0, "prime_outcome_coef must be a finite number >= 0"),
        ("prime_whiten", "yes", "prime_whiten must be True or False"),
        ("prime_grad_clip", 0.0, "prime_grad_clip must be a finite number > 0"),
        ("prime_prompt_filter", 1, "prime_prompt_filter must be True or False"),
        ("prime_filter_truncated", "no", "prime_filter_truncated must be True or False"),
        ("prime_filter_accuracy_lower", -0.1, r"prime_filter_accuracy_lower must be a number in \[0, 1\]"),
        ("prime_filter_accuracy_upper", 0.1, "prime_filter_accuracy_lower .* must be below"),
    ]:
        with pytest.raises(ValueError, match=message):
            CreditConfig("out", credit="implicit_prm", use_cpu=True, **{field: value})
    with pytest.raises(ValueError, match="both 0"):
        CreditConfig("out", credit="implicit_prm", use_cpu=True, prime_process_coef=0.0, prime_outcome_coef=0.0)
    # A PRIME field without the credit is refused, as every part's.
    with pytest.raises(ValueError, match="prime_beta"):
        CreditConfig("out", use_cpu=True, prime_beta=0.1)


def test_help_texts_and_command_line():
    from trl_credit import CreditConfig
    from trl_credit.prime.config import PrimeFields

    for name, spec in PrimeFields.__dataclass_fields__.items():
        assert len(spec.metadata.get("help", "")) > 30, name
    from transformers import HfArgumentParser

    (config,) = HfArgumentParser(CreditConfig).parse_args_into_dataclasses(
        ["--output_dir", "out", "--use_cpu", "--credit", "implicit_prm", "--prime_beta", "0.1", "--prime_update",
         "after", "--prime_whiten", "false"])
    assert (config.prime_beta, config.prime_update, config.prime_whiten) == (0.1, "after", False)


@pytest.mark.parametrize("rollout", ["resets", "trees"])
def test_rollouts_other_than_groups_are_refused_by_name(rollout):
    from trl_credit import CreditConfig

    extra = {"credit": "implicit_prm", "rollout": rollout}
    with pytest.raises(ValueError, match=f"credit='implicit_prm' with rollout='{rollout}'.*needs rollout='groups'|"
                                         f"rollout='{rollout}'.*implicit_prm"):
        CreditConfig("out", use_cpu=True, **extra)


@pytest.mark.parametrize("stage,fsdp,refused", [(0, True, "FSDP"), (2, False, None), (3, False, None)])
def test_fsdp_is_refused_and_deepspeed_is_not(stage, fsdp, refused):
    """FSDP shards the weights the PRM's own optimizer steps on: refused by name, before anything is built. DeepSpeed
    ZeRO-2 and ZeRO-3 run (tests/engines/test_deepspeed.py trains both PRM kinds under each, against DDP): setup goes
    on here to its next check."""
    from types import SimpleNamespace

    from trl_credit.prime.parts import ImplicitPRMCredit

    trainer = SimpleNamespace(is_deepspeed_enabled=stage > 0, is_fsdp_enabled=fsdp, args=SimpleNamespace(),
                              accelerator=SimpleNamespace(state=SimpleNamespace(
                                  deepspeed_plugin=SimpleNamespace(zero_stage=stage) if stage else None)))
    expected = (f"does not run under {refused}: it shards the model's weights" if refused
                else "learns from the verifier's verdicts: use CreditConfig")  # past the engine check
    with pytest.raises(ValueError, match=expected):
        ImplicitPRMCredit().setup(trainer)
