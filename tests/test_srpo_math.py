"""Pure pieces of SRPO/RRPO: localization parsing, prompts, sub-group advantages, seeds, resets, masked rows."""

import math
import random

import pytest
import torch

from trl_credit.srpo.advantages import grouped_advantages, normalize_then_sum_advantages, srpo_group_ids
from trl_credit.srpo.prompts import (
    LOCALIZATION_TEMPLATE,
    THOUGHT_MDP_ROLLOUT_TEMPLATE,
    localization_prompt,
    parse_reset_step,
    question_of,
    resolve_rollout_template,
    wrap_prompt,
)
from trl_credit.srpo.resets import (
    choose_reset_step,
    ROW_BASE,
    ROW_FALLBACK,
    ROW_SUFFIX,
    fallback_row,
    incorrect_indices,
    prompt_rows,
    random_reset_step,
    suffix_row,
)


# ---------------------------------------------------------------- localization parsing (docs/srpo.md#reset-index)


@pytest.mark.parametrize(
    "text, num_steps, ended_with_eos, expected",
    [
        ("\\boxed{3}", 5, False, 3),  # the asked-for form parses even when stopped right after the box
        ("Step 2 looks wrong.\n\\boxed{2}", 5, True, 2),
        ("first \\boxed{1} then I changed my mind \\boxed{4}", 5, True, 4),  # the last box decides
        ("\\boxed{Step 3}", 5, False, 3),
        ("\\boxed{ 5 }", 5, False, 5),
        ("3", 3, True, 3),  # a bare integer answer that ended with EOS
        ("Step 2.", 4, True, 2),
        ("3", 3, False, None),  # the same text cut at the token cap: not a pick
        ("The first erroneous step is step 2.", 4, True, None),  # a number in prose is not a pick
        ("This step is wrong because 2", 5, True, None),
        ("This step is wrong because 2", 5, False, None),  # cut at the cap mid-sentence
        ("\\boxed{7}", 5, True, None),  # out of range
        ("\\boxed{0}", 5, True, None),  # steps are 1-indexed
        ("7", 5, True, None),
        ("\\boxed{-1}", 5, True, None),
        ("\\boxed{two}", 5, True, None),
        ("\\boxed{2} is my answer, then 3", 5, True, 2),  # a box decides over a bare number elsewhere
        ("\\boxed{2.5}", 5, True, None),
        ("the answer is 3.5", 5, True, None),
        ("I cannot tell which step is wrong.", 5, True, None),
        ("", 5, True, None),
        ("\\boxed{1", 5, False, None),  # unbalanced (truncated) box
        ("\\boxed{1", 5, True, None),
    ],
)
def test_parse_reset_step(text, num_steps, ended_with_eos, expected):
    assert parse_reset_step(text, num_steps, ended_with_eos=ended_with_eos) == expected


def test_localization_stop_strings():
    from trl_credit.srpo.prompts import stop_strings

    assert stop_strings(3) == ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}"]


# ---------------------------------------------------------------- prompts (Appendix D)


def test_wrap_prompt_chat_and_text():
    chat = [{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 2 + 2?"}]
    wrapped = wrap_prompt(chat, "Q: {question} \\boxed{answer}")
    assert wrapped == [{"role": "system", "content": "sys"}, {"role": "user", "content": "Q: What is 2 + 2? \\boxed{answer}"}]
    assert chat[1]["content"] == "What is 2 + 2?"  # the dataset row is not mutated
    assert wrap_prompt("What is 2 + 2?", "Q: {question}") == "Q: What is 2 + 2?"
    assert wrap_prompt(chat, None) is chat
    assert question_of(chat) == "What is 2 + 2?"
    assert THOUGHT_MDP_ROLLOUT_TEMPLATE.endswith("Q: {question}") and "</thought>" in THOUGHT_MDP_ROLLOUT_TEMPLATE


def test_rollout_template_presets_and_validation():
    assert resolve_rollout_template("thought_mdp") == THOUGHT_MDP_ROLLOUT_TEMPLATE
    assert resolve_rollout_template("none") is None
    assert resolve_rollout_template("Solve: {question}") == "Solve: {question}"
    with pytest.raises(ValueError, match="rollout_template"):
        resolve_rollout_template("no placeholder here")


def test_localization_prompt_renders_steps():
    text = localization_prompt("What is 2 + 2?", ["2 + 2 = 5", "so \\boxed{5}"], "P: {question}\n{steps}\n(1 to {num_steps})")
    assert text == "P: What is 2 + 2?\nStep 1: 2 + 2 = 5\nStep 2: so \\boxed{5}\n(1 to 2)"
    full = localization_prompt("Q?", ["a", "b", "c"])
    assert "Step 3: c" in full and "(1 to 3)" in full and full.endswith("after the \\boxed{N}.")
    assert LOCALIZATION_TEMPLATE.count("{question}") == 1


# ---------------------------------------------------------------- sub-group advantages (docs/srpo.md#advantages)


def test_grouped_advantages_two_groups_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    # group 0: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.577350 -> A = +-0.5 / (0.577350 + 1e-4)
    a0 = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # 0.865875
    # group 1: mean 0.75, squares 3 * 0.0625 + 0.5625 = 0.75, var = 0.75 / 3 = 0.25, std = 0.5
    a1_pos, a1_neg = 0.25 / 0.5001, -0.75 / 0.5001  # 0.499900, -1.499700
    expected = torch.tensor([a0, -a0, -a0, a0, a1_pos, a1_pos, a1_pos, a1_neg])
    torch.testing.assert_close(grouped_advantages(rewards, groups), expected, rtol=0, atol=1e-5)
    # Never across groups: pooled, rewards 1 would get (1 - 0.625)/std_all, not these values.
    assert not torch.allclose(grouped_advantages(rewards, [0] * 8), expected, atol=1e-3)


def test_grouped_advantages_zero_std_nan_invalid_and_scales():
    rewards = torch.tensor([0.5, 0.5, 0.5, 1.0, 0.0, float("nan"), 1.0, 0.0])
    groups = [0, 0, 0, 1, 1, 1, 2, 2]
    out = grouped_advantages(rewards, groups)
    assert out[:3].tolist() == [0.0, 0.0, 0.0]  # std 0 -> 0
    assert out[5].item() == 0.0  # NaN reward -> 0, and left out of group 1's stats:
    # group 1 = {1, 0}: mean 0.5, std = sqrt(0.5) = 0.707107 -> +-0.5 / 0.707207
    assert out[3].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4), abs=1e-6)
    # invalid rows (fallback) get 0 and do not count: group 2 keeps one usable row -> 0 everywhere
    out = grouped_advantages(rewards, groups, valid=[True] * 6 + [False, True])
    assert out[6:].tolist() == [0.0, 0.0]
    # scale="none": centred only; group 2 = {1, 0} -> +-0.5
    assert grouped_advantages(rewards, groups, scale="none")[6:].tolist() == [0.5, -0.5]
    # scale="batch": per-group mean, std over all 7 finite rewards {.5,.5,.5,1,0,1,0}:
    # mean 3.5/7 = 0.5, squares 3*0 + 4*0.25 = 1, var = 1/6, std = 0.408248
    batch = grouped_advantages(rewards, groups, scale="batch")
    assert batch[6].item() == pytest.approx(0.5 / (math.sqrt(1 / 6) + 1e-4), abs=1e-6)
    with pytest.raises(ValueError, match="scale"):
        grouped_advantages(rewards, groups, scale="global")


NAN = float("nan")


def test_normalize_then_sum_per_sub_group_by_hand():
    """TRL's normalize_then_sum (z-score each reward function within the group, weighted sum, batch rescale) with a
    base group and a shared-prefix group as the groups; unscorable and fallback rows 0 and outside every statistic."""
    #          accuracy  format
    rewards = torch.tensor([
        [1.0, 1.0],  # 0 base
        [0.0, 1.0],  # 1 base
        [0.0, 0.0],  # 2 base
        [NAN, NAN],  # 3 base, unscorable
        [1.0, 1.0],  # 4 suffix
        [0.0, 1.0],  # 5 suffix
        [1.0, NAN],  # 6 suffix, format returned None
        [0.0, 0.0],  # 7 fallback (second reset group, no seed)
        [1.0, 1.0],  # 8 fallback
    ])
    groups = [0, 0, 0, 0, 1, 1, 1, 2, 2]
    valid = [True] * 7 + [False, False]
    weights = [1.0, 0.5]
    # Base group (rows 0-2; row 3 is out): accuracy {1, 0, 0}: mean 1/3, unbiased var (4/9 + 1/9 + 1/9) / 2 = 1/3,
    # std = 0.577350; with a = (1/3) / (0.577350 + 1e-4) = 0.577250: z_acc = [2a, -a, -a]. Format {1, 1, 0}: the
    # same std, z_fmt = [a, a, -2a]. s = z_acc + 0.5 z_fmt = [2.5a, -0.5a, -2a].
    # Suffix group (rows 4-6): accuracy {1, 0, 1}: z_acc = [a, -2a, a]; format scored on rows 4, 5 only: {1, 1},
    # std 0 -> contributes 0; row 6's None contributes 0. s = [a, -2a, a].
    # Batch over the 6 usable rows: s = a * [2.5, -0.5, -2, 1, -2, 1], mean 0, squares 16.5 a^2, unbiased var
    # 16.5 a^2 / 5 = 3.3 a^2, std = 1.816590 a = 1.048637 -> A = s / (1.048637 + 1e-4) = multiples * 0.550429.
    a = (1 / 3) / (math.sqrt(1 / 3) + 1e-4)
    factor = a / (a * math.sqrt(3.3) + 1e-4)  # 0.550429
    multiples = [2.5, -0.5, -2.0, 0.0, 1.0, -2.0, 1.0, 0.0, 0.0]  # rows 3, 7, 8: 0
    expected = torch.tensor([m * factor for m in multiples])  # [1.376073, -0.275215, -1.100859, 0, 0.550429, ...]
    out = normalize_then_sum_advantages(rewards, groups, weights, valid=valid)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    assert out[0].item() == pytest.approx(1.376073, abs=1e-5)
    # Fallback rows are outside every statistic: changing their rewards changes nothing.
    changed = rewards.clone()
    changed[7:] = torch.tensor([[5.0, -3.0], [0.2, 9.0]])
    torch.testing.assert_close(normalize_then_sum_advantages(changed, groups, weights, valid=valid), out)
    # Never across groups (paper §4.3): pooling the base and suffix rows into one group gives other values.
    pooled = normalize_then_sum_advantages(rewards, [0] * 7 + [2, 2], weights, valid=valid)
    assert not torch.allclose(pooled, out, atol=1e-3)
    # Not the same as normalizing the weighted totals (sum_then_normalize): base totals {1.5, 0.5, 0}, mean 2/3,
    # std 0.763763 -> row 0 gets (1.5 - 2/3) / 0.763863 = 1.090947, not 1.376073.
    totals = torch.tensor([1.5, 0.5, 0.0, NAN, 1.5, 0.5, 1.0, 0.0, 1.5])
    assert not torch.allclose(grouped_advantages(totals, groups, valid=valid), out, atol=1e-3)


def test_normalize_then_sum_edges():
    # Fewer than two usable rows: 0 everywhere. A group of one scored row: no signal from it.
    assert normalize_then_sum_advantages(torch.tensor([[1.0], [NAN]]), [0, 0], [1.0]).tolist() == [0.0, 0.0]
    # Group 0 = {1, 0} (z = +-0.5 / (0.707107 + 1e-4) = +-0.707007), group 1 = one row (z = 0). Batch s = {0.707007,
    # -0.707007, 0}: mean 0, unbiased var 2 * 0.707007^2 / 2 = 0.707007^2 -> A = s / (0.707007 + 1e-4) = +-0.999859.
    out = normalize_then_sum_advantages(torch.tensor([[1.0], [0.0], [1.0]]), [0, 0, 1], [1.0])
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(out, torch.tensor([z / (z + 1e-4), -z / (z + 1e-4), 0.0]), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="weights"):
        normalize_then_sum_advantages(torch.zeros(2, 2), [0, 0], [1.0])
    with pytest.raises(ValueError, match="group_ids"):
        normalize_then_sum_advantages(torch.zeros(2, 1), [0], [1.0])


def test_srpo_group_ids_layout():
    # 1x4 with base 4, two prompts: [b b b b s s s s] per prompt; ids p*(R+1) + (0 base | j reset group)
    assert srpo_group_ids(2, 4, 1, 4) == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    # 2x4 without base group (paper's compute-matched 2x4)
    assert srpo_group_ids(1, 0, 2, 4) == [1] * 4 + [2] * 4


# ---------------------------------------------------------------- seeds and resets (docs/srpo.md#seeds, docs/srpo.md#reset-index)


def test_incorrect_indices_first_in_order():
    rewards = [1.0, 0.0, float("nan"), 0.5, 0.0]
    assert incorrect_indices(rewards, 1.0, 1) == [1]
    assert incorrect_indices(rewards, 1.0, 2) == [1, 3]  # NaN is unscorable, never a seed
    assert incorrect_indices(rewards, 0.5, 5) == [1, 4]  # 0.5 >= threshold 0.5 is correct
    assert incorrect_indices([1.0, 1.0], 1.0, 1) == []


def test_rrpo_reset_is_uniform_over_thoughts():
    rng = random.Random(1234)
    num_steps, draws = 6, 60_000
    counts = [0] * num_steps
    for _ in range(draws):
        step = random_reset_step(num_steps, rng)
        assert 1 <= step <= num_steps
        counts[step - 1] += 1
    expected = draws / num_steps
    chi_square = sum((c - expected) ** 2 / expected for c in counts)
    # 5 degrees of freedom: P(chi2 > 20.5) ~ 0.001; a biased or off-by-one sampler blows far past it.
    assert chi_square < 20.5, (counts, chi_square)


def test_srpo_uses_the_parsed_step_else_random():
    rng = random.Random(0)
    assert choose_reset_step(2, 5, rng) == (2, True)
    assert choose_reset_step(parse_reset_step("\\boxed{4}", 5), 5, rng) == (4, True)
    step, localized = choose_reset_step(None, 5, rng)
    assert not localized and 1 <= step <= 5
    assert choose_reset_step(9, 5, random.Random(7))[1] is False


# ---------------------------------------------------------------- training rows (docs/srpo.md#suffix-rows)


def test_suffix_row_masks_exactly_the_prefix():
    completion, mask, logprobs = suffix_row([11, 12, 13], [21, 22], None, [-0.1, -0.2, -0.3], [-1.0, -2.0])
    assert completion == [11, 12, 13, 21, 22]
    assert mask == [0, 0, 0, 1, 1]
    assert logprobs == [-0.1, -0.2, -0.3, -1.0, -2.0]
    # cut to the response budget: 3 prefix tokens + at most 4 - 3 = 1 suffix token
    assert suffix_row([11, 12, 13], [21, 22], 4) == ([11, 12, 13, 21], [0, 0, 0, 1], None)
    # h* = 1: empty prefix, everything trains
    assert suffix_row([], [21, 22], 8)[1] == [1, 1]


def test_fallback_row_is_fully_masked():
    completion, mask, logprobs = fallback_row([5, 6, 7], [-0.5, -0.5, -0.5])
    assert completion == [5, 6, 7] and mask == [0, 0, 0] and logprobs == [-0.5, -0.5, -0.5]
    with pytest.raises(ValueError):
        fallback_row([])


def test_prompt_rows_layout():
    base = [([1, 2], None), ([3], None)]
    seeded = ([7, 8], None, [([9, 10], None), ([11], None)])
    rows = prompt_rows(base, [seeded, None], 2, filler=([5, 6, 4], None), max_completion_length=3)
    assert [kind for *_, kind in rows] == [ROW_BASE, ROW_BASE, ROW_SUFFIX, ROW_SUFFIX, ROW_FALLBACK, ROW_FALLBACK]
    assert rows[0][:2] == ([1, 2], [1, 1])
    # prefix [7, 8] + suffix cut to 3 - 2 = 1 token; the prefix is masked
    assert rows[2][:2] == ([7, 8, 9], [0, 0, 1])
    assert rows[3][:2] == ([7, 8, 11], [0, 0, 1])
    # no seed: the filler, fully masked, once per suffix slot
    assert rows[4][:2] == rows[5][:2] == ([5, 6, 4], [0, 0, 0])
    with pytest.raises(ValueError, match="suffixes"):
        prompt_rows(base, [([7], None, [([9], None)])], 2, filler=([5], None))


def test_missing_vllm_logprobs_stay_missing():
    # vLLM reports a NaN log-prob as None (TRL maps it to NaN); the rows must carry it through, not crash on it.
    _, _, logprobs = suffix_row([11, 12], [21], None, [None, -0.2], [-1.0])
    assert logprobs == [None, -0.2, -1.0]
    assert fallback_row([5, 6], [-0.5, None])[2] == [-0.5, None]
