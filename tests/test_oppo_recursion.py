"""OPPO's recursion and normalization (trl_credit/oppo/recursion.py) against docs/oppo.md worked by hand."""

import math

import pytest
import torch

from trl_credit.oppo.recursion import (
    evidence_ranking,
    bayesian_token_advantages,
    bayesian_value_recursion,
    group_moments,
    normalize_per_group,
    normalize_with_group_moments,
    prior_log_odds,
    row_token_moments,
    sequence_anchor_signs,
)

LN3 = math.log(3.0)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def hand_example():
    """Two completions of one group (G = 2, k = 1: row 0 correct, row 1 not), T = 3, row 1 has one padding token.

    o_t − s_t: row 0 = [ln 3, 0, ln 3]; row 1 = [−ln 3, 5, (padding: 7)].
    Prior (docs/oppo.md#prior): ℓ_0 = log((1 + 1)/(2 − 1 + 1)) = log 1 = 0.
    """
    student = torch.tensor([[-2.0, -1.0, -3.0], [-1.0, -4.0, -9.0]], dtype=torch.float64)
    diff = torch.tensor([[LN3, 0.0, LN3], [-LN3, 5.0, 7.0]], dtype=torch.float64)
    oracle = student + diff
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    seq_adv = torch.tensor([1.0, -1.0], dtype=torch.float64)  # A^seq: correct +, incorrect −
    num_correct = torch.tensor([1, 1])
    return oracle, student, mask, seq_adv, num_correct


# Row 0: ℓ = [0, ln 3, ln 3], ℓ_4 = ln 9.  V = [1/2, 3/4, 3/4].
#        A^raw = [σ(ln 3) − σ(0), σ(ln 3) − σ(ln 3), σ(ln 9) − σ(ln 3)] = [3/4 − 1/2, 0, 9/10 − 3/4] = [1/4, 0, 3/20].
# Row 1: log λ = [−ln 3, clip(5) = 3, 0 (padding)].  ℓ = [0, −ln 3, 3 − ln 3].  V = [1/2, 1/4, 0 (padding)].
#        A^raw = [1/4 − 1/2, σ(3 − ln 3) − 1/4, 0] with σ(3 − ln 3) = 1/(1 + 3e^{−3}) = 0.8700...
SIG_3_MINUS_LN3 = 1.0 / (1.0 + 3.0 * math.exp(-3.0))
HAND_VALUES = [[0.5, 0.75, 0.75], [0.5, 0.25, 0.0]]
HAND_RAW = [[0.25, 0.0, 0.15], [-0.25, SIG_3_MINUS_LN3 - 0.25, 0.0]]
# Anchoring (docs/oppo.md#direction-anchoring): row 0 sign +1 → |A^raw|; row 1 sign −1 → −|A^raw|.
HAND_ANCHORED = [[0.25, 0.0, 0.15], [-0.25, -(SIG_3_MINUS_LN3 - 0.25), 0.0]]


def test_recursion_matches_hand_worked_example():
    oracle, student, mask, seq_adv, k = hand_example()
    credit = bayesian_value_recursion(oracle, student, mask, seq_adv, k, group_size=2)
    torch.testing.assert_close(credit.values, torch.tensor(HAND_VALUES, dtype=torch.float64))
    torch.testing.assert_close(credit.advantages, torch.tensor(HAND_ANCHORED, dtype=torch.float64))
    torch.testing.assert_close(credit.log_lambda, torch.tensor([[LN3, 0.0, LN3], [-LN3, 3.0, 0.0]], dtype=torch.float64))
    assert credit.evidence_clipped.tolist() == [[False, False, False], [False, True, False]]  # 7 is padding
    torch.testing.assert_close(credit.prior_values, torch.tensor([0.5, 0.5], dtype=torch.float64))
    # The raw (unanchored) advantages are the "remove anchoring" ablation.
    raw = bayesian_token_advantages(oracle, student, mask, seq_adv, k, 2, anchoring=False)
    torch.testing.assert_close(raw, torch.tensor(HAND_RAW, dtype=torch.float64))


def test_telescoping_and_lipschitz_bound():
    torch.manual_seed(0)
    B, T, C = 6, 9, 3.0
    student = -torch.rand(B, T, dtype=torch.float64) * 4
    oracle = student + torch.randn(B, T, dtype=torch.float64) * 3  # some |o − s| > C, so clipping is active
    lengths = torch.tensor([9, 7, 5, 1, 9, 3])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    k = torch.tensor([0, 1, 2, 3, 4, 2])
    raw = bayesian_token_advantages(oracle, student, mask, torch.ones(B), k, 4, C, 1.0, anchoring=False)
    for i in range(B):
        n = int(lengths[i])
        l0 = math.log((k[i].item() + 1) / (4 - k[i].item() + 1))
        log_lambdas = [max(-C, min(C, (oracle[i, t] - student[i, t]).item())) for t in range(n)]
        # App. B.4: Σ_t A_t = σ(ℓ_{T+1}) − σ(ℓ_0), ℓ_{T+1} = ℓ_0 + Σ_t log λ_t.
        assert raw[i, :n].sum().item() == pytest.approx(sigmoid(l0 + sum(log_lambdas)) - sigmoid(l0), abs=1e-12)
        # App. B.5: |A_t| ≤ |log λ_t| / 4.
        for t in range(n):
            assert abs(raw[i, t].item()) <= abs(log_lambdas[t]) / 4 + 1e-12
        assert raw[i, n:].abs().sum().item() == 0.0


def test_evidence_clipping_at_plus_minus_C():
    # o − s = [5, −7, 2.5, −3] with C = 3 → log λ = [3, −3, 2.5, −3]; only the first two exceed C (−3 is not > 3).
    student = torch.zeros(1, 4, dtype=torch.float64)
    oracle = torch.tensor([[5.0, -7.0, 2.5, -3.0]], dtype=torch.float64)
    credit = bayesian_value_recursion(oracle, student, torch.ones(1, 4), torch.ones(1), torch.tensor([1]), 2, evidence_clip=3.0)
    assert credit.log_lambda.tolist() == [[3.0, -3.0, 2.5, -3.0]]
    assert credit.evidence_clipped.tolist() == [[True, True, False, False]]
    # ℓ_0 = 0; ℓ = [0, 3, 0, 2.5]: A^raw_1 = σ(3) − 1/2 (positive sign kept by A^seq = +1).
    assert credit.advantages[0, 0].item() == pytest.approx(sigmoid(3.0) - 0.5)
    # C = 1: 2.5 is now clipped too.
    credit = bayesian_value_recursion(oracle, student, torch.ones(1, 4), torch.ones(1), torch.tensor([1]), 2, evidence_clip=1.0)
    assert credit.log_lambda.tolist() == [[1.0, -1.0, 1.0, -1.0]]


@pytest.mark.parametrize(
    "k, G, alpha, v0",
    [
        (0, 4, 1.0, 1 / 6),  # (0 + 1)/(4 + 2)
        (4, 4, 1.0, 5 / 6),  # (4 + 1)/(4 + 2)
        (1, 4, 1.0, 2 / 6),  # (1 + 1)/(4 + 2)
        (2, 4, 1.0, 3 / 6),  # (2 + 1)/(4 + 2) → ℓ_0 = 0
        (0, 8, 2.0, 2 / 12),  # (0 + 2)/(8 + 4)
        (8, 8, 0.5, 8.5 / 9),  # (8 + 0.5)/(8 + 1)
    ],
)
def test_prior_for_all_correct_none_correct_and_between(k, G, alpha, v0):
    # docs/oppo.md#prior: ℓ_0 = log((k + α)/(G − k + α)), so σ(ℓ_0) = (k + α)/(G + 2α).
    l0 = prior_log_odds(torch.tensor([k]), G, alpha)
    assert l0.item() == pytest.approx(math.log((k + alpha) / (G - k + alpha)))
    credit = bayesian_value_recursion(
        torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1), torch.tensor([k]), G, prior_strength=alpha
    )
    assert credit.prior_values.item() == pytest.approx(v0)
    assert credit.values[0].tolist() == pytest.approx([v0, v0])  # no evidence: V_t stays at V_0
    # One token of evidence ln 3 from V_0: A = 3V_0/(3V_0 + 1 − V_0) − V_0 (App. B.3 with λ = 3).
    credit = bayesian_value_recursion(
        torch.tensor([[LN3]], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1), torch.ones(1), torch.tensor([k]), G, prior_strength=alpha
    )
    assert credit.advantages.item() == pytest.approx(3 * v0 / (3 * v0 + 1 - v0) - v0)


def test_prior_strength_must_be_positive():
    with pytest.raises(ValueError, match="prior_strength"):
        prior_log_odds(torch.tensor([0]), 4, 0.0)


def test_anchoring_takes_the_sign_of_the_sequence_advantage():
    # Row 0: positive evidence, negative A^seq → negative advantage; row 1: negative evidence, positive A^seq →
    # positive; row 2: positive evidence, positive A^seq → positive.
    diff = torch.tensor([[1.0], [-1.0], [1.0]], dtype=torch.float64)
    seq = torch.tensor([-0.7, 2.0, 0.3], dtype=torch.float64)
    adv = bayesian_token_advantages(diff, torch.zeros_like(diff), torch.ones(3, 1), seq, torch.tensor([1, 1, 1]), 2)
    magnitude = sigmoid(1.0) - 0.5  # ℓ_0 = 0 (k = 1, G = 2); |σ(±1) − 1/2| = σ(1) − 1/2
    assert adv[:, 0].tolist() == pytest.approx([-magnitude, magnitude, magnitude])


def test_zero_variance_group_gives_exactly_zero():
    oracle, student, mask, _, k = hand_example()
    adv = bayesian_token_advantages(oracle, student, mask, torch.zeros(2, dtype=torch.float64), k, 2)
    assert torch.equal(adv, torch.zeros_like(adv))
    normalized = normalize_per_group(adv, mask, torch.tensor([0, 0]))
    assert torch.equal(normalized, torch.zeros_like(normalized))


def test_padding_tokens_give_zero_whatever_their_log_probs():
    oracle, student, mask, seq, k = hand_example()
    oracle = oracle.clone()
    student = student.clone()
    oracle[1, 2], student[1, 2] = 1e4, -1e4  # garbage at the padding position
    credit = bayesian_value_recursion(oracle, student, mask, seq, k, 2)
    assert credit.advantages[1, 2].item() == 0.0 and credit.values[1, 2].item() == 0.0
    assert not credit.evidence_clipped[1, 2]
    torch.testing.assert_close(credit.advantages, torch.tensor(HAND_ANCHORED, dtype=torch.float64))
    normalized = normalize_per_group(credit.advantages, mask, torch.tensor([0, 0]))
    assert normalized[1, 2].item() == 0.0


# ------------------------------------------------------------------------------------------- ablations (§2.8)
def _ablation(**switches):
    oracle, student, mask, seq, k = hand_example()
    return bayesian_value_recursion(oracle, student, mask, seq, k, 2, **switches)


def test_no_anchoring_keeps_the_sign_of_log_lambda():
    full, ablated = _ablation(), _ablation(anchoring=False)
    torch.testing.assert_close(ablated.advantages, torch.tensor(HAND_RAW, dtype=torch.float64))
    # Row 1 token 2 (evidence +3 in an incorrect completion) flips from − to +; nothing else changes.
    assert full.advantages[1, 1] < 0 < ablated.advantages[1, 1]
    torch.testing.assert_close(ablated.advantages.abs(), full.advantages.abs())
    torch.testing.assert_close(ablated.values, full.values)


def test_no_tracking_uses_log_lambda_over_four():
    ablated = _ablation(state_tracking=False)
    # A_t = sign(A^seq)|log λ_t|/4: row 0 = [ln3/4, 0, ln3/4]; row 1 = −[ln3/4, 3/4, 0] (clipping still on).
    expected = [[LN3 / 4, 0.0, LN3 / 4], [-LN3 / 4, -0.75, 0.0]]
    torch.testing.assert_close(ablated.advantages, torch.tensor(expected, dtype=torch.float64))


def test_no_clipping_uses_raw_evidence():
    full, ablated = _ablation(), _ablation(clipping=False)
    # Row 1 token 2: log λ = 5 (not 3): A^raw = σ(5 − ln 3) − 1/4 = 1/(1 + 3e^{−5}) − 1/4.
    assert ablated.log_lambda[1, 1].item() == 5.0
    assert ablated.advantages[1, 1].item() == pytest.approx(-(1 / (1 + 3 * math.exp(-5.0)) - 0.25))
    # Everything not clipped is unchanged; the clip flag still reports the token.
    torch.testing.assert_close(ablated.advantages[0], full.advantages[0])
    assert ablated.advantages[1, 0] == full.advantages[1, 0]
    assert ablated.evidence_clipped.tolist() == full.evidence_clipped.tolist()


def test_no_prior_starts_from_one_half():
    oracle, student, mask, seq, _ = hand_example()
    k = torch.tensor([0, 0])  # prior V_0 = (0 + 1)/(2 + 2) = 1/4 with the prior
    with_prior = bayesian_value_recursion(oracle, student, mask, seq, k, 2)
    without = bayesian_value_recursion(oracle, student, mask, seq, k, 2, use_prior=False)
    assert with_prior.values[0, 0].item() == pytest.approx(0.25)
    # ℓ_0 = 0: the hand example again (its k = 1 prior was ℓ_0 = 0 too).
    torch.testing.assert_close(without.advantages, torch.tensor(HAND_ANCHORED, dtype=torch.float64))
    torch.testing.assert_close(without.log_lambda, with_prior.log_lambda)


def test_log_lambda_only_is_anchored_raw_evidence():
    ablated = _ablation(log_lambda_only=True)
    # sign(A^seq)|o − s|, unclipped, no /4: row 0 = [ln3, 0, ln3]; row 1 = −[ln3, 5, 0 (padding)].
    expected = [[LN3, 0.0, LN3], [-LN3, -5.0, 0.0]]
    torch.testing.assert_close(ablated.advantages, torch.tensor(expected, dtype=torch.float64))


# ------------------------------------------------------------------------------------------- normalization (§2.7)
def test_normalization_of_hand_example():
    oracle, student, mask, seq, k = hand_example()
    adv = bayesian_token_advantages(oracle, student, mask, seq, k, 2)
    normalized = normalize_per_group(adv, mask, torch.tensor([0, 0]), eps=1e-6)
    # Valid tokens of the group: [1/4, 0, 3/20, −1/4, −(σ(3 − ln3) − 1/4)], n = 5.
    tokens = [0.25, 0.0, 0.15, -0.25, -(SIG_3_MINUS_LN3 - 0.25)]
    mean = sum(tokens) / 5
    std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / 5)  # population std
    expected = [[(x - mean) / (std + 1e-6) for x in tokens[:3]], [(x - mean) / (std + 1e-6) for x in tokens[3:]] + [0.0]]
    torch.testing.assert_close(normalized, torch.tensor(expected, dtype=torch.float64))


def test_normalization_can_make_a_wrong_answers_token_positive():
    # docs/oppo.md#group-normalization: anchoring fixes the sign of Â, not of Ã. One correct answer Â = [0.2, 0.2]
    # (padded) and three wrong ones Â = [−0.01, −0.01, −0.4]: mean = (0.4 − 0.06 − 1.2)/11 = −0.86/11.
    adv = torch.tensor([[0.2, 0.2, 0.0]] + [[-0.01, -0.01, -0.4]] * 3, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]] + [[1, 1, 1]] * 3)
    normalized = normalize_per_group(adv, mask, torch.zeros(4, dtype=torch.long), eps=0.0)
    tokens = [0.2, 0.2] + [-0.01, -0.01, -0.4] * 3
    mean = -0.86 / 11
    std = math.sqrt(sum((x - mean) ** 2 for x in tokens) / 11)
    assert normalized[1, 0].item() == pytest.approx((-0.01 - mean) / std) and normalized[1, 0] > 0
    assert normalized[1, 0].item() == pytest.approx(0.322, abs=1e-3)  # the value docs/oppo.md quotes
    assert normalized[1, 2].item() == pytest.approx(-1.520, abs=1e-3)
    assert normalized[0, 0].item() == pytest.approx(1.314, abs=1e-3)
    wrong = normalized[1:][mask[1:].bool()]
    assert int((wrong > 0).sum()) == 6  # 6 of the wrong answers' 9 tokens end positive
    assert wrong.max() < normalized[0, :2].min()  # the order survives: wrong tokens stay below correct ones


def test_normalization_uses_group_ids_for_any_layout():
    # Groups interleaved and of different sizes: rows 0, 2 → group 5; rows 1, 3, 4 → group 2.
    adv = torch.tensor([[1.0, 3.0], [2.0, 0.0], [5.0, 0.0], [4.0, 6.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1], [1, 1]])
    normalized = normalize_per_group(adv, mask, torch.tensor([5, 2, 5, 2, 2]), eps=0.0)
    # Group 5 tokens [1, 3, 5]: mean 3, std sqrt(8/3).  Group 2 tokens [2, 4, 6, 0, 0]: mean 12/5 = 2.4,
    # var = (0.16 + 2.56 + 12.96 + 5.76 + 5.76)/5 = 27.2/5 = 5.44.
    s5, s2 = math.sqrt(8 / 3), math.sqrt(5.44)
    expected = [[-2 / s5, 0.0], [-0.4 / s2, 0.0], [2 / s5, 0.0], [1.6 / s2, 3.6 / s2], [-2.4 / s2, -2.4 / s2]]
    torch.testing.assert_close(normalized, torch.tensor(expected, dtype=torch.float64))


def test_normalization_from_gathered_moments_equals_single_batch():
    # A group split across two "processes": moments summed over both halves give the same result.
    torch.manual_seed(1)
    adv = torch.randn(8, 5, dtype=torch.float64)
    mask = (torch.rand(8, 5) > 0.3).long()
    groups = torch.arange(8) // 4  # group 0 = rows 0-3, group 1 = rows 4-7
    whole = normalize_per_group(adv, mask, groups)
    halves = [slice(0, 3), slice(3, 8)]  # group 0 spans both halves
    row_moments = torch.cat([row_token_moments(adv[h], mask[h]) for h in halves])
    moments = group_moments(row_moments, groups)
    for h in halves:
        torch.testing.assert_close(normalize_with_group_moments(adv[h], mask[h], groups[h], moments), whole[h])


def test_all_zero_group_stays_zero_next_to_a_live_group():
    adv = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, -1.0], [2.0, 0.0]])
    mask = torch.ones(4, 2)
    normalized = normalize_per_group(adv, mask, torch.tensor([0, 0, 1, 1]))
    assert torch.equal(normalized[:2], torch.zeros(2, 2))
    assert normalized[2:].abs().sum() > 0


# ------------------------------------------------------------------------------------------- sign(A^seq) from the rewards
NAN = float("nan")


def _signs(rows, aggregation="sum_then_normalize", weights=None):
    rewards = torch.tensor(rows, dtype=torch.float32)  # TRL's rewards_per_func is float32
    weights = torch.ones(rewards.size(1)) if weights is None else torch.tensor(weights)
    return sequence_anchor_signs(rewards, weights, 4, 0, aggregation).tolist()


def test_rows_tying_the_group_mean_get_sign_zero_and_no_credit():
    # Rewards [0.7, 1.0, 0.4, 0.7]: mean 0.7, so rows 0 and 3 tie it (TRL's float32 advantage: -2.4e-7 each).
    assert _signs([[0.7], [1.0], [0.4], [0.7]]) == [0.0, 1.0, -1.0, 0.0]
    assert _signs([[0.7]] * 4) == [0.0] * 4  # zero variance
    # The whole chain by hand, one token per row with log λ = ln 2: k = 1 (only 1.0 >= 1), G = 4, so
    # ℓ_0 = ln(2/4) = -ln 2, V_0 = 1/3 and A^raw = σ(0) - 1/3 = 1/6 on every row; Â = sign · 1/6 = [0, 1/6, -1/6, 0];
    # the group's mean is 0 and its population std sqrt(2 · (1/6)² / 4) = 1/(6√2), so Ã = [0, √2, -√2, 0].
    # With sign -1 on the tied rows (the round-off) Â was [-1/6, 1/6, -1/6, -1/6] and Ã ≈ [-0.58, 1.73, -0.58, -0.58].
    signs = torch.tensor(_signs([[0.7], [1.0], [0.4], [0.7]]), dtype=torch.float64)
    plain = torch.zeros(4, 1, dtype=torch.float64)
    mask = torch.ones(4, 1)
    anchored = bayesian_token_advantages(plain + math.log(2.0), plain, mask, signs, torch.tensor([1, 1, 1, 1]), 4)
    torch.testing.assert_close(anchored[:, 0], torch.tensor([0.0, 1 / 6, -1 / 6, 0.0], dtype=torch.float64))
    normalized = normalize_per_group(anchored, mask, torch.zeros(4, dtype=torch.long), eps=0.0)
    root2 = math.sqrt(2.0)
    torch.testing.assert_close(normalized[:, 0], torch.tensor([0.0, root2, -root2, 0.0], dtype=torch.float64))


def test_round_off_tolerance_is_relative_to_the_group_scale():
    # Ties at 1000.7 in float32 (1000.70001); a real difference of 1e-4 of the scale still counts.
    assert _signs([[1000.7], [1000.7], [1000.8], [1000.6]]) == [0.0, 0.0, 1.0, -1.0]
    assert _signs([[1e-6], [2e-6], [1e-6], [2e-6]]) == [-1.0, 1.0, -1.0, 1.0]  # small rewards, real differences


def test_unscorable_rows_and_a_verifier_none_under_both_aggregations():
    # Column 0 is the verifier. Row 3 is unscorable (0); row 2's verifier returned None: not correct, reward 0.
    rows = [[1.0, 1.0], [0.0, 1.0], [NAN, 1.0], [NAN, NAN]]
    # sum_then_normalize: totals [2, 1, 1] over the scorable rows, mean 4/3.
    assert _signs(rows) == [1.0, -1.0, -1.0, 0.0]
    # normalize_then_sum: verifier [1, 0, 0] z-scores +, -, -; the format column has no variance (z = 0).
    assert _signs(rows, "normalize_then_sum") == [1.0, -1.0, -1.0, 0.0]
    # normalize_then_sum, verifier [1, 0, None, 0] and format [1, 0, 1, 1]: verifier [1, 0, 0, 0] has deviations
    # [3/4, -1/4, -1/4, -1/4], format [1/4, -3/4, 1/4, 1/4], both with (sample) std 1/2, so the z-score sums are
    # [2, -2, 0, 0] / (1/2 + 1e-4): rows 2 and 3 tie their group. (TRL put row 2 at +0.32 of the batch std.)
    rows = [[1.0, 1.0], [0.0, 0.0], [NAN, 1.0], [0.0, 1.0]]
    assert _signs(rows, "normalize_then_sum") == [1.0, -1.0, 0.0, 0.0]
    # weights: [2, 1] makes the verifier dominate.
    assert _signs(rows, "normalize_then_sum", weights=[2.0, 1.0]) == [1.0, -1.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        _signs(rows, "mean")


def test_evidence_ranking_counts_pairs_within_a_group_by_hand():
    # Group 0: correct rows 0 (total 1.0) and 1 (-0.5) against wrong row 2 (0.0): one win, one loss.
    # Group 1: correct row 3 (2.0) against wrong row 4 (2.0): a tie, half a win; row 5 (wrong, 5.0) is not credited
    # (unscorable). Row 6 is in no group. Across groups nothing is paired: row 0 (1.0) against row 4 (2.0) would be a
    # loss, row 3 against row 2 a win. So 1.5 wins of 3 pairs, AUC 0.5.
    totals = torch.tensor([1.0, -0.5, 0.0, 2.0, 2.0, 5.0, 9.0], dtype=torch.float64)
    correct = torch.tensor([True, True, False, True, False, False, True])
    credited = torch.tensor([True, True, True, True, True, False, True])
    group_ids = torch.tensor([0, 0, 0, 1, 1, 1, -1])
    assert evidence_ranking(totals, correct, credited, group_ids) == (1.5, 3)
    # A scorer that reads the answer: every correct total above every wrong one of its group.
    assert evidence_ranking(torch.tensor([3.0, 2.0, -1.0, 0.5, 0.0, 5.0, 9.0]), correct, credited, group_ids) == (3.0, 3)
    # No group with both a correct and a wrong credited row: no pair.
    assert evidence_ranking(totals, torch.ones(7, dtype=torch.bool), credited, group_ids) == (0.0, 0)
