"""OPPO's credit composed (issue 22): over any groups of the record (pure functions, hand-worked), with Cue-GRPO's
rarity weights on GRPO's rollouts (a), and on SRPO's reset sub-groups (b). Expected numbers are worked by hand or
come from plain-loop references in this file and tests/trainers/test_oppo_trainer.py, never from the code under
test."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.mp import run_torchrun
from tests.trainers.test_oppo_trainer import _row_logps, parity_row, reference_advantages
from trl_credit.config import CreditConfig
from trl_credit.core.batch import NO_GROUP, ROW_BASE, RowBatch
from trl_credit.core.context import BatchContext
from trl_credit.core.trainer import CreditTrainer
from trl_credit.cue_grpo.parts import RarityWeights
from trl_credit.oppo.parts import ValueRecursion
from trl_credit.oppo.recursion import (
    bayesian_token_advantages,
    group_index,
    group_success_counts,
    normalize_per_group,
    sequence_anchor_signs,
)
from trl_credit.tasks.rewards import completion_text

NAN = float("nan")
TEMPLATE = "Q: {question}"  # SRPO's rollout template in the tiny runs: the oracle must see the wrapped prompt


# ------------------------------------------------------------------------------------------- pure functions
def test_signs_and_counts_follow_group_ids_with_unequal_groups_and_no_group_rows():
    # Verifier rewards (column 0 decides k). Group 0 = rows {0, 1, 2, 9} (row 9 unscorable), group 1 = {3, 4, 7}
    # (not contiguous), group 2 = {6, 8}, group 3 = {10} (one row); row 5 is in no group.
    rewards = torch.tensor([[1.0], [0.0], [0.0], [1.0], [1.0], [0.0], [0.5], [0.0], [0.0], [NAN], [1.0]])
    ids = torch.tensor([0, 0, 0, 1, 1, NO_GROUP, 2, 1, 2, 0, 3])
    signs = sequence_anchor_signs(rewards, torch.ones(1), ids, 0)
    # group 0: mean of {1, 0, 0} = 1/3 -> +, -, -; group 1: mean of {1, 1, 0} = 2/3 -> +, +, -;
    # group 2: mean of {0.5, 0} = 1/4 -> +, -; a group of one ties itself; no group and unscorable rows: 0.
    assert signs.tolist() == [1.0, -1.0, -1.0, 1.0, 1.0, 0.0, 1.0, -1.0, -1.0, 0.0, 0.0]
    correct = rewards[:, 0] >= 1.0
    scorable = ~torch.isnan(rewards[:, 0])
    k, g = group_success_counts(correct, scorable, ids)
    # k: group 0 row 0; group 1 rows 3, 4; group 2 none; group 3 row 10. G: scorable rows of each group; row 5
    # (correct=False, but also a row 5 with a 1 would count nowhere) and the unscorable row 9 are no trial.
    assert k.tolist() == [1, 2, 0, 1] and g.tolist() == [3, 3, 2, 1]
    k_no_group, _ = group_success_counts(torch.ones(11, dtype=torch.bool), scorable, ids)
    assert k_no_group.tolist() == [3, 3, 2, 1]  # a correct row of no group adds to no k


def test_a_group_size_is_the_contiguous_group_ids():
    assert group_index(4, 8).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    rewards = torch.tensor([[0.7], [1.0], [0.4], [0.7], [1.0], [0.0], [1.0], [1.0]])
    by_size = sequence_anchor_signs(rewards, torch.ones(1), 4, 0)
    by_ids = sequence_anchor_signs(rewards, torch.ones(1), torch.arange(8) // 4, 0)
    assert by_size.tolist() == by_ids.tolist() == [0.0, 1.0, -1.0, 0.0, 1.0, -1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="groups of 3"):
        group_index(3, 8)
    with pytest.raises(ValueError, match="integer group ids"):
        group_index(torch.zeros(8), 8)


def test_token_moments_per_group_id_and_zero_for_rows_of_no_group():
    advantages = torch.tensor([[0.3, 0.1], [0.2, 0.4], [-0.1, 0.5], [1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    normalized = normalize_per_group(advantages, mask, torch.tensor([0, 1, 0, NO_GROUP]))
    # group 0 = rows 0 and 2: tokens 0.3, 0.1, -0.1, 0.5, mean 0.2, population variance 0.05; group 1 = one token
    # (std 0: (0.2 - 0.2) / eps = 0); the row of no group: 0, and out of every group's moments.
    std = math.sqrt(0.05)
    expected = [[0.1 / std, -0.1 / std], [0.0, 0.0], [-0.3 / std, 0.3 / std], [0.0, 0.0]]
    torch.testing.assert_close(normalized, torch.tensor(expected, dtype=torch.float64), atol=1e-5, rtol=0)


def srpo_layout():
    """Six rows of two tokens, SRPO's kind: base group 0 = rows 0, 1 (rewards 1, 0); reset group 1 = rows 2, 3, 5
    (rewards 1, 0, 0), whose first token is the shared prefix (trained mask 0); row 4 a fallback row (no group)."""
    rewards = torch.tensor([[1.0], [0.0], [1.0], [0.0], [0.0], [0.0]])
    ids = torch.tensor([0, 0, 1, 1, NO_GROUP, 1])
    completion_mask = torch.ones(6, 2)
    trained = torch.tensor([[1, 1], [1, 1], [0, 1], [0, 1], [0, 0], [0, 1]], dtype=torch.float32)
    return rewards, ids, completion_mask, trained


def srpo_oppo_credit(rewards, ids, completion_mask, trained, log_lambda: float, moments_over_trained=True):
    """OPPO's credit on SRPO's rows from the pure functions: the recursion over the whole completion of each row
    in a group, the group moments over the trained tokens."""
    signs = sequence_anchor_signs(rewards, torch.ones(1), ids, 0)
    k, g = group_success_counts(rewards[:, 0] >= 1.0, torch.ones(6, dtype=torch.bool), ids)
    credit_mask = completion_mask * (ids != NO_GROUP).unsqueeze(1)
    oracle = torch.full((6, 2), log_lambda, dtype=torch.float64)
    anchored = bayesian_token_advantages(oracle, torch.zeros(6, 2, dtype=torch.float64), credit_mask, signs,
                                         k[ids.clamp(min=0)], g[ids.clamp(min=0)])
    statistics = trained if moments_over_trained else None
    return signs, k, g, anchored, normalize_per_group(anchored, credit_mask, ids, statistics_mask=statistics)


def test_srpo_sub_groups_keep_their_own_statistics_hand_worked():
    rewards, ids, completion_mask, trained = srpo_layout()
    signs, k, g, anchored, normalized = srpo_oppo_credit(rewards, ids, completion_mask, trained, math.log(2.0))
    assert signs.tolist() == [1.0, -1.0, 1.0, -1.0, 0.0, -1.0]
    assert k.tolist() == [1, 1] and g.tolist() == [2, 3]
    # log λ = ln 2 on every token. Base group: ℓ_0 = ln(2/2) = 0, V = 1/2 -> 2/3 -> 4/5, so |A^raw| = 1/6, 2/15.
    # Reset group: ℓ_0 = ln(2/3), V = 2/5 -> 4/7 -> 8/11, so |A^raw| = 6/35, 12/77 (the prefix token included: the
    # recursion runs over the whole completion, which the oracle scores).
    base, reset = [1 / 6, 2 / 15], [6 / 35, 12 / 77]
    expected_anchored = [base, [-a for a in base], reset, [-a for a in reset], [0.0, 0.0], [-a for a in reset]]
    torch.testing.assert_close(anchored, torch.tensor(expected_anchored, dtype=torch.float64))
    # Moments over the trained tokens. Base group: mean 0, variance (1/36 + 4/225) / 2. Reset group: its suffix
    # tokens 12/77, -12/77, -12/77: mean -4/77, variance 128/77², std 8√2/77; the prefix tokens are normalized with
    # the same moments (TRL's tool_mask keeps them out of the loss).
    std_base = math.sqrt((1 / 36 + 4 / 225) / 2) + 1e-6  # + eps
    std_reset = 8 * math.sqrt(2) / 77 + 1e-6
    up = [(6 / 35 + 4 / 77) / std_reset, (12 / 77 + 4 / 77) / std_reset]
    down = [(-6 / 35 + 4 / 77) / std_reset, (-12 / 77 + 4 / 77) / std_reset]
    expected = [[a / std_base for a in base], [-a / std_base for a in base], up, down, [0.0, 0.0], down]
    torch.testing.assert_close(normalized, torch.tensor(expected, dtype=torch.float64))
    assert up[1] == pytest.approx(math.sqrt(2), abs=1e-4) and down[1] == pytest.approx(-1 / math.sqrt(2), abs=1e-4)
    # Moments over every completion token (prefix included) would give the trained tokens other numbers.
    *_, over_all = srpo_oppo_credit(rewards, ids, completion_mask, trained, math.log(2.0), moments_over_trained=False)
    assert (over_all - normalized)[trained.bool()].abs().max() > 0.04


# ------------------------------------------------------------------------------------------- (a): Cue on (B, T)
class _Accelerator:
    num_processes, process_index, is_main_process = 1, 0, True

    def gather(self, tensor):
        return tensor


def _fake_trainer(tmp_path, texts, rewards):
    args = CreditConfig(output_dir=str(tmp_path), credit="oppo", modifiers=["cue"], cue_partition="callable",
                        cue_alpha=1.0, report_to="none", use_cpu=True)
    # what RarityWeights.setup reads at construction
    return SimpleNamespace(args=args, accelerator=_Accelerator(), reward_weights=torch.ones(rewards.size(1)),
                           reward_func_names=["verifier"])


def test_rarity_weights_scale_the_positive_tokens_of_p_rows_hand_worked(tmp_path):
    # Group 0 = rows 0-3 (rewards 1, 1, 1, 0), group 1 = rows 4, 5 (1, 0), row 6 in no group. OPPO's sign anchors
    # give P = {0, 1, 2} and {4}. partition_fn clusters rows 0, 1 ("a") apart from row 2 ("b").
    rewards = torch.tensor([[1.0], [1.0], [1.0], [0.0], [1.0], [0.0], [1.0]])
    texts = ["a", "a", "b", "c", "d", "e", "f"]
    calls = []

    def partition_fn(completions, prompt):
        calls.append(list(completions))
        return completions  # the text is the cluster label

    batch = RowBatch(rewards_per_func=rewards, group_ids=torch.tensor([0, 0, 0, 0, 1, 1, NO_GROUP]),
                     row_kinds=torch.full((7,), ROW_BASE), success=rewards[:, 0] >= 1.0,
                     scorable=torch.ones(7, dtype=torch.bool), num_local=7, process_index=0,
                     sequence_signs=torch.tensor([1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 0.0], dtype=torch.float64),
                     completions=texts, loss_mask=torch.tensor([[1, 1, 0]] + [[1, 1, 1]] * 6))
    advantages = torch.tensor([[0.5, -0.2, 0.0], [0.4, 0.1, 0.3], [-0.1, 0.6, 0.2], [-0.5, -0.3, 0.2],
                               [0.3, -0.4, 0.7], [-0.3, 0.2, -0.1], [0.9, 0.9, 0.9]])
    output = {"completion_mask": torch.tensor([[1, 1, 0]] + [[1, 1, 1]] * 6)}
    modifier = RarityWeights(partition_fn=partition_fn)
    trainer = _fake_trainer(tmp_path, texts, rewards)
    modifier.setup(trainer)
    inputs = [{"prompt": "p"}] * 7
    # the batch as the modifier sees it: a context over the captured texts, no trainer
    ctx = BatchContext(args=trainer.args, capture=SimpleNamespace(generated=(None, None, None, texts)),
                       reward_weights=trainer.reward_weights, reward_func_names=["verifier"], success_index=0)
    result = modifier.apply(ctx, batch, inputs, output, advantages)
    # CR with α = 1 over P = {0, 1, 2}, clusters {0, 1} and {2}: |C|^-1 = 1/2, 1/2, 1, mean 2/3 -> 3/4, 3/4, 3/2;
    # inside [0.3, 3]; floor shift τ - min = 1.05 - 3/4 = 0.3 -> 1.05, 1.05, 1.8. P = {4}: one cluster, 1 -> 1.05.
    expected = torch.tensor([[0.5 * 1.05, -0.2, 0.0], [0.4 * 1.05, 0.1 * 1.05, 0.3 * 1.05], [-0.1, 0.6 * 1.8, 0.2 * 1.8],
                             [-0.5, -0.3, 0.2], [0.3 * 1.05, -0.4, 0.7 * 1.05], [-0.3, 0.2, -0.1], [0.9, 0.9, 0.9]])
    torch.testing.assert_close(result, expected)
    assert calls == [["a", "a", "b"]]  # only groups with |P| > 1 are partitioned


def cr_weights(labels, alpha, gamma_min=0.3, gamma_max=3.0, tau=1.05):
    """Cue-GRPO's CR weights (paper Eq. 3 and 8), restated: |C_i|^-α normalized to mean 1, clipped, floor-shifted."""
    sizes = Counter(labels)
    raw = [sizes[label] ** -alpha for label in labels]
    clipped = [min(max(r / (sum(raw) / len(raw)), gamma_min), gamma_max) for r in raw]
    shift = max(0.0, tau - min(clipped))
    return [w + shift for w in clipped]


def three_way_label(completions, prompt):
    return [len(text) % 3 for text in completions]


def _recording(trainer, reference):
    """Each generation batch's output with ``reference(trainer, inputs, output)`` computed before any update (the
    public ``on_credit`` callback), and every batch reaching TRL's loss."""
    trainer.records, trainer.loss_inputs = [], []
    trainer.add_credit_callback(
        lambda step: trainer.records.append((step.inputs, step.output, reference(trainer, step.inputs, step.output))))
    # Kept as a wrap: the test checks what TRL's loss receives after its shuffle and split into micro-batches, which
    # on_credit (one call per generation batch, before the split) does not see.
    loss = trainer._compute_loss

    def recording_loss(model, inputs):
        trainer.loss_inputs.append({k: v.clone() for k, v in inputs.items() if torch.is_tensor(v)})
        return loss(model, inputs)

    trainer._compute_loss = recording_loss
    return trainer


def parity_reward(completions, **kwargs):
    return [float(len(completion_text(c)) % 2) for c in completions]


def oppo_cue_reference(trainer, inputs, output):
    """OPPO's advantages (plain-loop reference) with each P row's positive tokens times its CR weight."""
    G = trainer.num_generations
    scorer = trainer.accelerator.unwrap_model(trainer.model)
    oppo = reference_advantages(scorer, trainer._tokenizer, inputs, output, G, reward_row=parity_row)
    B = len(oppo)
    texts = [trainer._tokenizer.decode(output["completion_ids"][i][output["completion_mask"][i].bool()],
                                       skip_special_tokens=True) for i in range(B)]
    rewards = [len(text) % 2 for text in texts]
    weights = [1.0] * B
    for start in range(0, B, G):
        rows = range(start, start + G)
        mean = sum(rewards[i] for i in rows) / G
        positives = [i for i in rows if rewards[i] == 1 and rewards[i] > mean]  # correct, A^seq > 0
        for i, w in zip(positives, cr_weights(three_way_label([texts[i] for i in positives], None), 1.0)):
            weights[i] = w
    return [[a * weights[i] if a > 0 else a for a in row] for i, row in enumerate(oppo)], weights


def tiny_args(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=16, num_generations=8,
                    max_completion_length=8, max_steps=1, learning_rate=1e-2, report_to="none", logging_steps=1,
                    use_cpu=True, bf16=False, save_strategy="no", seed=0)
    settings.update(overrides)
    return CreditConfig(**settings)


def test_oppo_x_cue_one_step_reaches_trls_loss(tiny_model_path, tiny_dataset, tmp_path):
    args = tiny_args(tmp_path, credit="oppo", modifiers=["cue"], cue_partition="callable", cue_alpha=1.0)
    trainer = CreditTrainer(tiny_model_path, parity_reward, args=args, train_dataset=tiny_dataset,
                            credit=ValueRecursion(), modifiers=[RarityWeights(partition_fn=three_way_label)])
    _recording(trainer, oppo_cue_reference).train()
    (_, output, (expected, weights)), = trainer.records
    assert any(w != 1.0 for w in weights), "no row of P: the check would be vacuous"
    advantages, mask = output["advantages"], output["completion_mask"]
    scaled = 0
    for i, row in enumerate(expected):
        n = int(mask[i].sum())
        assert advantages[i, :n].tolist() == pytest.approx(row, abs=1e-3), i
        assert advantages[i, n:].abs().sum().item() == 0.0
        scaled += weights[i] != 1.0 and any(a > 1e-3 for a in row)
    assert scaled, "no positive token of a P row was scaled"
    # What reaches TRL's loss: the same rows (shuffled by TRL) with these (B, T) advantages and their anchors.
    generated = {(tuple(p.tolist()), tuple(c.tolist())): a
                 for p, c, a in zip(output["prompt_ids"], output["completion_ids"], advantages)}
    for inputs in trainer.loss_inputs:
        assert "sequence_anchors" in inputs
        for p, c, a in zip(inputs["prompt_ids"], inputs["completion_ids"], inputs["advantages"]):
            assert torch.equal(a, generated[(tuple(p.tolist()), tuple(c.tolist()))])
    logs = trainer.state.log_history[0]
    assert "cue/frac_groups_redistributed" in logs and "oppo/value_mean" in logs


# ------------------------------------------------------------------------------------------- (b): SRPO's resets
def srpo_oppo_reference(trainer, inputs, output, C=3.0, alpha=1.0, eps=1e-6):
    """docs/oppo.md#algorithm over SRPO's sub-groups with Python floats: each prompt's rows are its base rows then
    its reset groups of ``suffixes_per_reset`` rows; a row TRL trains none of (tool_mask all 0) is a fallback row in
    no group. Oracle and plain contexts are the wrapped prompt (``TEMPLATE``), with the answer for the oracle; the
    recursion runs over the whole completion, the moments over the trained tokens (completion_mask * tool_mask)."""
    args, tokenizer = trainer.args, trainer._tokenizer
    scorer = trainer.accelerator.unwrap_model(trainer.model)
    G, base, suffixes = trainer.num_generations, args.num_base_generations, args.suffixes_per_reset
    B = output["completion_ids"].size(0)
    rows = []
    for i in range(B):
        mask = output["completion_mask"][i].bool()
        completion = output["completion_ids"][i][mask].tolist()
        trained = output["tool_mask"][i][mask].tolist()
        messages = [dict(m) for m in inputs[i]["prompt"]]
        messages[-1]["content"] = TEMPLATE.replace("{question}", messages[-1]["content"])
        plain = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        prompt_ids = output["prompt_ids"][i][output["prompt_mask"][i].bool()].tolist()
        assert prompt_ids == plain["input_ids"], "the rows were not generated from the wrapped prompt"
        messages[-1]["content"] += f"\n\nThe correct final answer is {inputs[i]['answer']}."
        oracle = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        j = i % G
        group = None if sum(trained) == 0 else (i // G, "base" if j < base else (j - base) // suffixes)
        reward = len(tokenizer.decode(completion, skip_special_tokens=True)) % 2
        rows.append(dict(completion=completion, trained=trained, oracle=oracle["input_ids"], plain=prompt_ids,
                         group=group, reward=reward))
    groups = defaultdict(list)
    for i, row in enumerate(rows):
        if row["group"] is not None:
            groups[row["group"]].append(i)
    raw = [None] * B
    for members in groups.values():
        k, size = sum(rows[i]["reward"] for i in members), len(members)
        mean = k / size
        for i in members:
            row = rows[i]
            sign = (row["reward"] > mean) - (row["reward"] < mean)
            o = _row_logps(scorer, row["oracle"], row["completion"])
            s = _row_logps(scorer, row["plain"], row["completion"])
            ell, values = math.log((k + alpha) / (size - k + alpha)), []
            for t in range(len(row["completion"])):
                log_lambda = max(-C, min(C, o[t] - s[t]))
                values.append(sign * abs(1 / (1 + math.exp(-(ell + log_lambda))) - 1 / (1 + math.exp(-ell))))
                ell += log_lambda
            raw[i] = values
    expected = [[0.0] * len(row["completion"]) for row in rows]
    for members in groups.values():
        tokens = [a for i in members for a, t in zip(raw[i], rows[i]["trained"]) if t]
        mean = sum(tokens) / len(tokens)
        std = math.sqrt(sum((a - mean) ** 2 for a in tokens) / len(tokens))
        for i in members:
            expected[i] = [(a - mean) / (std + eps) for a in raw[i]]
    return expected, rows


@pytest.mark.parametrize("reset_groups", [1, 2], ids=["base4+reset1x4", "reset2x4"])
def test_resets_x_oppo_one_step_sub_group_statistics(tiny_model_path, tiny_dataset, tmp_path, reset_groups):
    # 2x4 has no base group and its suffix generation call has exactly B rows: s_t recorded during that call would
    # line up with the batch in count but not in content (a suffix row's completion starts with its prefix).
    args = tiny_args(tmp_path, rollout="resets", credit="oppo", per_device_train_batch_size=8, reset="random",
                     reset_groups=reset_groups, suffixes_per_reset=4, seed_candidates_per_round=2, max_seed_rounds=3,
                     max_completion_length=12, thought_delimiter=" ", rollout_template=TEMPLATE)
    trainer = CreditTrainer(tiny_model_path, parity_reward, args=args, train_dataset=tiny_dataset)
    assert type(trainer.credit) is ValueRecursion and type(trainer.rollout).__name__ == "Resets"
    _recording(trainer, srpo_oppo_reference).train()
    (_, output, (expected, rows)), = trainer.records
    assert any(row["group"] is not None and row["group"][1] != "base" for row in rows), "no reset group"
    if reset_groups == 1:
        assert any(row["group"] is not None and row["group"][1] == "base" for row in rows)
    advantages, mask = output["advantages"], output["completion_mask"]
    live = 0
    for i, row in enumerate(expected):
        n = int(mask[i].sum())
        assert advantages[i, :n].tolist() == pytest.approx(row, abs=1e-3), i
        assert advantages[i, n:].abs().sum().item() == 0.0
        live += any(abs(a) > 1e-3 for a, t in zip(row, rows[i]["trained"]) if t)
    assert live, "every trained token has advantage 0: the check would be vacuous"
    for inputs in trainer.loss_inputs:  # TRL's loss masks the shared prefixes with tool_mask
        assert "tool_mask" in inputs and "sequence_anchors" in inputs
    assert any(log.get("oppo/extra_pass_rows") == 2.0 for log in trainer.state.log_history)


def test_resets_x_oppo_x_cue_one_step(tiny_model_path, tiny_dataset, tmp_path):
    # All three parts: SRPO's sub-groups, OPPO's token credit over them, and in each sub-group the positive tokens of
    # its P rows (correct, sign > 0, trained) times the CR weights of P's partition.
    args = tiny_args(tmp_path, rollout="resets", credit="oppo", modifiers=["cue"], per_device_train_batch_size=8,
                     reset="random", reset_groups=1, suffixes_per_reset=4, seed_candidates_per_round=2,
                     max_seed_rounds=3, max_completion_length=12, thought_delimiter=" ", rollout_template=TEMPLATE,
                     cue_partition="callable", cue_alpha=1.0)
    trainer = CreditTrainer(tiny_model_path, parity_reward, args=args, train_dataset=tiny_dataset,
                            modifiers=[RarityWeights(partition_fn=three_way_label)])
    _recording(trainer, srpo_oppo_reference).train()
    (_, output, (expected, rows)), = trainer.records
    groups = defaultdict(list)
    for i, row in enumerate(rows):
        if row["group"] is not None:
            groups[row["group"]].append(i)
    weights = [1.0] * len(rows)
    for members in groups.values():
        mean = sum(rows[i]["reward"] for i in members) / len(members)
        positives = [i for i in members if rows[i]["reward"] == 1 and rows[i]["reward"] > mean]
        texts = [trainer._tokenizer.decode(rows[i]["completion"], skip_special_tokens=True) for i in positives]
        for i, w in zip(positives, cr_weights(three_way_label(texts, None), 1.0)):
            weights[i] = w
    assert any(w != 1.0 for w in weights), "no row of P: the check would be vacuous"
    advantages, mask = output["advantages"], output["completion_mask"]
    for i, row in enumerate(expected):
        n = int(mask[i].sum())
        scaled = [a * weights[i] if a > 0 else a for a in row]
        assert advantages[i, :n].tolist() == pytest.approx(scaled, abs=1e-3), i
    logs = trainer.state.log_history[0]
    assert {"cue/frac_groups_redistributed", "oppo/value_mean", "srpo/fallback_rate"} <= set(logs)


def test_a_user_rollout_func_is_still_refused_by_the_resets(tiny_model_path, tiny_dataset, tmp_path):
    # (OPPO alone credits a user's rollout_func: tests/test_multiturn_credit.py)
    args = tiny_args(tmp_path, credit="oppo", rollout="resets")
    with pytest.raises(ValueError, match=r"\(resets rollout\) does not support a custom `rollout_func`"):
        CreditTrainer(tiny_model_path, parity_reward, args=args, train_dataset=tiny_dataset,
                      rollout_func=lambda prompts, trainer: {})


# ------------------------------------------------------------------------------------------- two processes
MP_SCRIPT = "tests/mp_scripts/compose_oppo_two_processes.py"


def _reports(out_dir, world):
    return [json.loads((Path(out_dir) / f"rank{rank}.json").read_text()) for rank in range(world)]


@pytest.fixture(scope="module")
def two_process_cue(tiny_model_path, tmp_path_factory):
    # 3 prompts x 4 generations = 12 rows per step, 6 per process: the second group (rows 4-7) spans both.
    out = str(tmp_path_factory.mktemp("compose_cue_two"))
    run_torchrun(MP_SCRIPT, tiny_model_path, out, "cue", "6")
    return _reports(out, 2)


@pytest.mark.multiprocess
def test_oppo_x_cue_in_two_processes_gives_the_advantages_of_one(two_process_cue, tiny_model_path, tmp_path):
    for r in two_process_cue:
        assert r["world"] == 2 and r["steps"] == 2 and len(r["losses"]) == 2
        assert all(math.isfinite(loss) for loss in r["losses"])
        assert len([m for m in r["metrics"] if "oppo/value_mean" in m and "cue/frac_groups_redistributed" in m]) == 2
    assert two_process_cue[0]["metrics"] == two_process_cue[1]["metrics"]  # reduced over processes before logging
    run_torchrun(MP_SCRIPT, tiny_model_path, str(tmp_path), "cue", "12", nproc=1)
    (one,) = _reports(tmp_path, 1)
    rows_one = sorted(one["rows"], key=lambda r: r["row"])
    rows_two = sorted([row for r in two_process_cue for row in r["rows"]], key=lambda r: r["row"])
    assert [(r["row"], r["prompt"], r["completion"]) for r in rows_one] == \
        [(r["row"], r["prompt"], r["completion"]) for r in rows_two]
    assert any(m.get("cue/frac_groups_redistributed", 0) > 0 for m in one["metrics"]), "Cue redistributed nothing"
    spanning = [r for r in rows_two if 4 <= r["row"] < 8]
    assert any(abs(a) > 1e-2 for r in spanning for a in r["advantages"]), "the spanning group has zero advantages"
    for a, b in zip(rows_one, rows_two):
        # float32 log-probs of batches padded to other widths differ by ~1e-6; the per-process sign anchors, weights
        # or group moments of a group split across processes would be off by O(0.1-1).
        assert a["advantages"] == pytest.approx(b["advantages"], abs=1e-3)


@pytest.mark.multiprocess
def test_resets_x_oppo_trains_in_two_processes(tiny_model_path, tmp_path):
    # One prompt of 8 rows (4 base + 1 reset group of 4 suffixes) per process and step.
    run_torchrun(MP_SCRIPT, tiny_model_path, str(tmp_path), "resets", "8")
    reports = _reports(tmp_path, 2)
    for r in reports:
        assert r["world"] == 2 and r["steps"] == 2 and all(math.isfinite(loss) for loss in r["losses"])
        logged = [m for m in r["metrics"] if "oppo/value_mean" in m]
        assert len(logged) == 2 and all("srpo/fallback_rate" in m for m in logged)
    assert reports[0]["metrics"] == reports[1]["metrics"]


# ------------------------------------------------------------------------------------------- SmolLM2 (slow)
def _smollm2_run(tmp_path, loss_type, **selection):
    from peft import LoraConfig

    from trl_credit.models import default_model_path
    from trl_credit.tasks.data import make_arithmetic_dataset
    from trl_credit.tasks.rewards import final_number_reward

    torch.set_num_threads(1)  # shared CPUs: oversubscribed threads make generation many times slower
    dataset = make_arithmetic_dataset(num_train=16, num_test=2, digits=2, num_operands=2)["train"]
    args = CreditConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, max_completion_length=32,
                        max_steps=2, learning_rate=5e-5, loss_type=loss_type, report_to="none", use_cpu=True,
                        save_strategy="no", logging_steps=1, credit="oppo", **selection)
    trainer = CreditTrainer(default_model_path(), final_number_reward, args=args, train_dataset=dataset,
                            peft_config=LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM"))
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    assert trainer.state.global_step == 2
    logs = [log for log in trainer.state.log_history if "oppo/value_mean" in log]
    assert len(logs) == 2 and all(math.isfinite(log["loss"]) for log in logs)
    assert all(0.0 < log["oppo/value_mean"] < 1.0 for log in logs)
    # LoRA B starts at zero; it moves when any token has a non-zero advantage.
    if any(log["oppo/advantage_abs_mean"] > 0 for log in logs):
        assert any(not torch.equal(lora_before[n], p.detach()) for n, p in trainer.model.named_parameters()
                   if n in lora_before)
    return trainer, logs


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_smollm2_lora_oppo_x_cue(tmp_path, loss_type):
    trainer, logs = _smollm2_run(tmp_path, loss_type, num_generations=4, modifiers=["cue"])
    assert [type(part).__name__ for part in trainer.parts] == ["GroupRollout", "ValueRecursion", "RarityWeights"]
    assert all("cue/frac_groups_redistributed" in log for log in logs)


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_smollm2_lora_resets_x_oppo(tmp_path, loss_type):
    trainer, logs = _smollm2_run(tmp_path, loss_type, num_generations=8, rollout="resets", reset="random",
                                 max_seed_rounds=2, thought_delimiter="\n", rollout_template="lines")
    assert [type(part).__name__ for part in trainer.parts] == ["Resets", "ValueRecursion"]
    assert all(0.0 <= log["srpo/fallback_rate"] <= 1.0 for log in logs)


def test_a_composed_oppo_credit_checks_the_answer_column_at_construction(tiny_model_path, tiny_dataset, tmp_path):
    # OPPOTrainer refuses a dataset without the answer column before loading; the composed trainer's credit does so
    # while the trainer is built, not at the first step.
    args = tiny_args(tmp_path, credit="oppo")
    with pytest.raises(ValueError, match="answer"):
        CreditTrainer(tiny_model_path, parity_reward, args=args, train_dataset=tiny_dataset.remove_columns("answer"))


def always_correct(completions, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.parametrize("split", [dict(num_generations=3, per_device_train_batch_size=3),
                                   dict(num_generations=8, reset_groups=1, suffixes_per_reset=8,
                                        per_device_train_batch_size=8)], ids=["G3", "1x8"])
def test_resets_x_oppo_with_every_reset_group_falling_back_and_no_base_group(tiny_model_path, tiny_dataset, tmp_path,
                                                                             split):
    # No base group (G = 3: one reset group of 3; the paper's 1x8) and no incorrect seed (every row correct): every
    # row of the batch is a fallback row, in no group, so OPPO has statistics of zero groups. Its credit is 0 for
    # rows of no group (as for every fallback row of a batch with groups), and the step trains finitely.
    args = tiny_args(tmp_path, rollout="resets", credit="oppo", max_completion_length=4, max_seed_rounds=1,
                     rollout_template=TEMPLATE, thought_delimiter=" ", **split)
    trainer = CreditTrainer(tiny_model_path, always_correct, args=args, train_dataset=tiny_dataset)
    outputs = []
    trainer.add_credit_callback(lambda step: outputs.append(step.output))
    trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(trainer.state.log_history[-1]["train_loss"])
    (output,) = outputs
    assert output["advantages"].abs().sum().item() == 0.0  # fallback rows: advantage 0
    log = next(log for log in trainer.state.log_history if "srpo/fallback_rate" in log)
    assert log["srpo/fallback_rate"] == 1.0
