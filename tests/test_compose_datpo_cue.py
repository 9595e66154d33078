"""DATPO's trees x Cue-GRPO's rarity weights. Within a tree, P = the correct, scorable leaves above the tree's mean leaf
reward m (in a tree whose leaf rewards vary), partitioned and weighted as Cue-GRPO's positive set.
``cue_tree_credit="rows"`` (default, Cue-GRPO's rule): DATPO's block advantages from the rewards as they are, then the
positive advantages of the blocks each leaf of P's row trains are multiplied by its weight w_l; nothing else moves.
``cue_tree_credit="leaves"``: each l in P gets r'_l = m + w_l (r_l - m) before the block Monte Carlo aggregation, the
others keep r_l, and DATPO's block advantages are computed from r' (so shared blocks move too)."""

import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer

from trl_credit.config import CreditConfig
from trl_credit.core.context import BatchContext
from trl_credit.core.trainer import CreditTrainer
from trl_credit.cue_grpo.parts import (
    RarityWeights, leaf_advantages, positive_sets, reweighted_leaves, reweighted_rows,
)
from trl_credit.cue_grpo.weights import compute_rarity_weights
from trl_credit.datpo.parts import Trees
from trl_credit.datpo.tree import ROOT, block_advantages

# RecordingBlocks: BlockCredit keeping each batch's trees (what the independent computations start from);
# length_partition: a callable partition, the completion's length mod 3
from tests.mp_scripts.datpo_cue_two_processes import RecordingBlocks, length_partition

# ---------------------------------------------------------------------------------------------------- by hand


def _reweight(rewards, correct, groups, partitions, **weighting):
    """The leaf re-weighting as RarityWeights.leaf_outcomes composes it: P, the partition's weights, r'."""
    rewards = torch.tensor(rewards, dtype=torch.float64)
    advantages, varied = leaf_advantages(rewards, groups)
    in_loss = torch.ones(len(rewards), dtype=torch.bool)
    positives, _ = positive_sets(advantages, torch.tensor(correct), in_loss, varied, groups)
    weights = torch.ones(len(rewards), dtype=torch.float64)
    for group, members in positives.items():
        result = compute_rarity_weights(partitions[group], None, **weighting)
        weights[members] = torch.tensor(result.weights, dtype=torch.float64)
    return positives, reweighted_leaves(rewards, advantages, weights)


def test_hand_worked_forest():
    # Tree 0: base rollout a forks at f into branch b; base rollout c does not fork. Leaf rewards (verifier + a
    # format reward) a = 1.5 (correct), b = 1.0 (correct), c = 0.5 (wrong): m = 1.0, so P = {a} (b is correct but
    # not above the mean). Tree 1: base rollout d forks at g into branches e1, e2; base rollout h. d, e1, e2 correct
    # (1.0), h wrong (0.0): m = 0.75, P = {d, e1, e2}, partitioned {d} | {e1, e2}. Tree 2: two correct leaves with
    # equal rewards: no variance, no P.
    # Leaves in order: a b c | d e1 e2 h | i j
    rewards = [1.5, 1.0, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    correct = [True, True, False, True, True, True, False, True, True]
    groups = {0: [0, 1, 2], 1: [3, 4, 5, 6], 2: [7, 8]}
    partitions = {0: [0], 1: [0, 1, 1]}
    # CR weights (alpha 1, tau 1.2): tree 0, one positive: omega = 1, floor shift 1.2 - 1 = 0.2 -> w_a = 1.2.
    # Tree 1: |C|^-1 = 1, 1/2, 1/2, mean 2/3 -> omega = 1.5, 0.75, 0.75 (inside [0.3, 3]); shift 1.2 - 0.75 = 0.45
    # -> w = 1.95, 1.2, 1.2.
    positives, reweighted = _reweight(rewards, correct, groups, partitions, alpha=1.0, gamma_min=0.3, gamma_max=3.0,
                                      tau=1.2, mode="cr")
    assert positives == {0: [0], 1: [3, 4, 5]}
    # r'_a = 1 + 1.2 * 0.5 = 1.6;  r'_d = 0.75 + 1.95 * 0.25 = 1.2375, r'_e = 0.75 + 1.2 * 0.25 = 1.05
    expected_leaves = [1.6, 1.0, 0.5, 1.2375, 1.05, 1.05, 0.0, 1.0, 1.0]
    assert reweighted.tolist() == pytest.approx(expected_leaves, abs=1e-12)
    assert reweighted[[1, 2, 6, 7, 8]].tolist() == [1.0, 0.5, 0.0, 1.0, 1.0]  # outside P: exactly r

    # Block advantages (subtree values) from r'. Tree 0: V(root) = (1.6 + 1.0 + 0.5) / 3, V(f) = (1.6 + 1.0) / 2.
    f, g = ("a", 0), ("d", 0)
    v_root, v_f = 3.1 / 3, 1.3
    tree0 = block_advantages([ROOT, f, f, ROOT], [f, None, None, None], [None, *reweighted[[0, 1, 2]].tolist()])
    assert tree0.tolist() == pytest.approx([v_f - v_root, 1.6 - v_f, 1.0 - v_f, 0.5 - v_root], abs=1e-12)
    assert tree0.tolist() == pytest.approx([0.26666666666666666, 0.3, -0.3, -0.5333333333333333], abs=1e-12)
    # Tree 1: V(root) = 3.3375 / 4 = 0.834375, V(g) = 3.3375 / 3 = 1.1125: the rare d gains, the common branches
    # e1, e2 (correct, but a strategy the tree holds twice) fall below their fork's value.
    tree1 = block_advantages([ROOT, g, g, g, ROOT], [g, None, None, None, None],
                             [None, *reweighted[[3, 4, 5, 6]].tolist()])
    assert tree1.tolist() == pytest.approx([0.278125, 0.125, -0.0625, -0.0625, -0.834375], abs=1e-12)
    # DATPO alone (r unchanged) for comparison: V(root) = 1.0, V(f) = 1.25; V(root) = 0.75, V(g) = 1.0.
    plain0 = block_advantages([ROOT, f, f, ROOT], [f, None, None, None], [None, 1.5, 1.0, 0.5])
    assert plain0.tolist() == pytest.approx([0.25, 0.25, -0.25, -0.5])
    plain1 = block_advantages([ROOT, g, g, g, ROOT], [g, None, None, None, None], [None, 1.0, 1.0, 1.0, 0.0])
    assert plain1.tolist() == pytest.approx([0.25, 0.0, 0.0, 0.0, -0.75])


def test_hand_worked_forest_under_cue_grpos_rule():
    # cue_tree_credit="rows": the trees of test_hand_worked_forest, DATPO's block advantages from the rewards as they
    # are, then Cue-GRPO's rule per training row: a row whose leaf is in P (weight w) gets w x each of its positive
    # block advantages; every other advantage is DATPO's, bit for bit.
    # Tree 0, blocks root->f (row a), f->a (row a), f->b (row b), root->c (row c); DATPO alone 0.25, 0.25, -0.25, -0.5
    # (V(root) = 1, V(f) = 1.25). P = {a}, w_a = 1.2: 0.25 * 1.2 = 0.3 on both of a's blocks; b (correct, not above
    # m) and c (wrong) keep theirs.
    tree0 = reweighted_rows(torch.tensor([0.25, 0.25, -0.25, -0.5], dtype=torch.float64),
                            ["a", "a", "b", "c"], {"a": 1.2})
    assert tree0.tolist() == pytest.approx([0.3, 0.3, -0.25, -0.5], abs=1e-12)
    assert tree0[[2, 3]].tolist() == [-0.25, -0.5]
    # Tree 1, blocks root->g (row d), g->d (row d), g->e1, g->e2, root->h; DATPO alone 0.25, 0, 0, 0, -0.75
    # (V(root) = 0.75, V(g) = 1). P = {d, e1, e2}, w = 1.95, 1.2, 1.2: d's root->g block 0.25 * 1.95 = 0.4875; its
    # leaf block and e1's, e2's are 0, not positive, so they stay 0; the wrong h keeps -0.75 (under "leaves" it falls
    # to -0.834375 and e1, e2 to -0.0625: test_hand_worked_forest).
    tree1 = reweighted_rows(torch.tensor([0.25, 0.0, 0.0, 0.0, -0.75], dtype=torch.float64),
                            ["d", "d", "e1", "e2", "h"], {"d": 1.95, "e1": 1.2, "e2": 1.2})
    assert tree1.tolist() == pytest.approx([0.4875, 0.0, 0.0, 0.0, -0.75], abs=1e-12)
    assert tree1[4].item() == -0.75
    # a weight below 1 (a common strategy under 'uarl') shrinks positive credit the same way, negatives untouched
    assert reweighted_rows(torch.tensor([0.5, -0.5], dtype=torch.float64), ["x", "x"], {"x": 0.5}).tolist() == [
        0.25, -0.5]


def test_leaf_advantages_leave_out_unscorable_and_nonfinite_trees():
    nan, inf = math.nan, math.inf
    rewards = torch.tensor([1.0, nan, 0.0, 1.0, inf, 2.0, 2.0], dtype=torch.float64)
    advantages, varied = leaf_advantages(rewards, {0: [0, 1, 2], 1: [3, 4], 2: [5, 6]})
    assert advantages[[0, 2]].tolist() == [0.5, -0.5] and math.isnan(advantages[1])  # m over scorable leaves
    assert varied == {0: True, 1: False, 2: False}
    # a weight of 1 keeps the reward to the bit; NaN leaves stay NaN
    weights = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    kept = reweighted_leaves(rewards, advantages, weights)
    assert kept[[0, 2, 3, 4, 5, 6]].tolist() == rewards[[0, 2, 3, 4, 5, 6]].tolist() and math.isnan(kept[1])


# ---------------------------------------------------------------------------------------------------- one step


def parity_accuracy_reward(completions, answer, **kwargs):
    """The verifier (first reward function): 1.0 when the completion's length has the parity of the answer."""
    from trl_credit.tasks.rewards import completion_text

    return [float(len(completion_text(c)) % 2 == int(a) % 2) for c, a in zip(completions, answer)]


def short_format_reward(completions, **kwargs):
    from trl_credit.tasks.rewards import completion_text

    return [0.5 * float(len(completion_text(c)) < 16) for c in completions]


def _composed(tmp_path, model, partition_fn=length_partition, peft_config=None, reward_funcs=None,
              dataset=None, modifier=None, **settings):
    from trl_credit.tasks.data import make_arithmetic_dataset

    config = dict(
        output_dir=str(tmp_path), rollout="trees", credit="blocks", modifiers=["cue"], per_device_train_batch_size=8,
        num_generations=4, max_completion_length=8, max_steps=1, learning_rate=1e-3, report_to="none", use_cpu=True,
        save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, max_forks=2, max_branches=2,
        difficulty_adaptive=False, fork_method="fixed_seg", use_diversity=False, rows_per_forward=1000,
        mask_truncated_completions=False, cue_partition="callable", cue_weighting="cr", cue_alpha=1.0, cue_tau=1.2,
    )
    config.update(settings)
    credit = RecordingBlocks()
    trainer = CreditTrainer(
        model, reward_funcs or [parity_accuracy_reward, short_format_reward], args=CreditConfig(**config),
        train_dataset=dataset or make_arithmetic_dataset(num_train=8, num_test=2, seed=0)["train"],
        rollout=Trees(), credit=credit, modifiers=[modifier or RarityWeights(partition_fn=partition_fn)],
        peft_config=peft_config,
    )
    return trainer, credit


def _expected_leaves(trees, tokenizer, partition_fn, alpha, tau, gamma_min=0.3, gamma_max=3.0, exclude=(),
                     with_weights=False):
    """(kind, index) -> r' of every leaf ("base", row) / ("branch", n), and the leaves (tree, kind, index, reward,
    correct, response ids) (``with_weights``: instead of the leaves, (kind, index) -> w of P's leaves), computed from
    the trees' reward matrices (one process, reward weights 1, verifier = the first function, CR weights),
    independently of the trainer's code. ``exclude``: leaves kept out of P."""
    leaves, all_weights = [], {}
    for i, ids in enumerate(trees.completion_ids):
        r = trees.rewards_per_func[i].double()
        leaves.append((i // 4, "base", i, float(r.sum()), bool(r[0] >= 1.0), list(ids)))
    for n, ids in enumerate(trees.branch_ids):
        i, j = trees.branch_meta[n]
        r = trees.branch_rewards_per_func[n].double()
        response = list(trees.completion_ids[i][: trees.forks[i][j]]) + list(ids)
        leaves.append((i // 4, "branch", n, float(r.sum()), bool(r[0] >= 1.0), response))
    reweighted = {}
    for tree in range(len(trees.completion_ids) // 4):
        members = [leaf for leaf in leaves if leaf[0] == tree]
        rewards = [leaf[3] for leaf in members]
        mean = sum(rewards) / len(rewards)
        positive = [leaf for leaf in members if leaf[4] and leaf[3] > mean and (leaf[1], leaf[2]) not in exclude]
        positive = positive if len(set(rewards)) > 1 else []
        weights = {}
        if positive:
            texts = [tokenizer.decode(leaf[5], skip_special_tokens=True) for leaf in positive]
            labels = partition_fn(texts, None)
            sizes = Counter(labels)
            raw = [sizes[c] ** -alpha for c in labels]
            omega = [min(max(x / (sum(raw) / len(raw)), gamma_min), gamma_max) for x in raw]
            shift = max(0.0, tau - min(omega))
            weights = {(leaf[1], leaf[2]): w + shift for leaf, w in zip(positive, omega)}
        all_weights.update(weights)
        for leaf in members:
            reweighted[(leaf[1], leaf[2])] = mean + weights.get((leaf[1], leaf[2]), 1.0) * (leaf[3] - mean)
    return (reweighted, all_weights) if with_weights else (reweighted, leaves)


def _expected_rows(trees, tokenizer, partition_fn, alpha, tau, rule="rows"):
    """(prompt ids, completion ids) -> expected per-token advantages, sorted, and how many leaves the weights
    changed (one process). ``rule="leaves"``: the subtree values of r'. ``rule="rows"``: the subtree values of r, and
    each row whose leaf has weight w gets w x its positive block advantages."""
    n_base = len(trees.completion_ids)
    reweighted, leaves = _expected_leaves(trees, tokenizer, partition_fn, alpha, tau)
    weights_changed = sum(reweighted[(leaf[1], leaf[2])] != leaf[3] for leaf in leaves)
    _, row_weight = _expected_leaves(trees, tokenizer, partition_fn, alpha, tau, with_weights=True)
    if rule == "rows":
        reweighted = {(leaf[1], leaf[2]): leaf[3] for leaf in leaves}  # DATPO's values: the rewards as they are
    else:
        row_weight = {}

    def weighted(advantage, row):
        return advantage * row_weight[row] if row in row_weight and advantage > 0 else advantage

    def value(i, j):
        """V(fork j of base row i) (subtree): row i's own leaf and the branches of its forks j' >= j."""
        under = [reweighted[("base", i)]] + [
            reweighted[("branch", n)] for n, (row, fork) in enumerate(trees.branch_meta) if row == i and fork >= j
        ]
        return sum(under) / len(under)

    roots = {}  # V(root): every leaf of the tree
    for tree in range(n_base // 4):
        values = [reweighted[(leaf[1], leaf[2])] for leaf in leaves if leaf[0] == tree]
        roots[tree] = sum(values) / len(values)
    rows = []
    for i, ids in enumerate(trees.completion_ids):
        forks = trees.forks[i]
        cuts = [0, *forks, len(ids)]
        advantages = []
        for k in range(len(cuts) - 1):
            start = roots[i // 4] if k == 0 else value(i, k - 1)
            end = reweighted[("base", i)] if k == len(forks) else value(i, k)
            advantages += [weighted(end - start, ("base", i))] * (cuts[k + 1] - cuts[k])
        rows.append(((tuple(trees.prompt_ids[i]), tuple(ids)), advantages))
    for n, ids in enumerate(trees.branch_ids):
        i, j = trees.branch_meta[n]
        prompt = tuple(trees.prompt_ids[i]) + tuple(trees.completion_ids[i][: trees.forks[i][j]])
        rows.append(((prompt, tuple(ids)), [weighted(reweighted[("branch", n)] - value(i, j), ("branch", n))] * len(ids)))
    return sorted(rows), weights_changed


def _leaf_keys(trees, tokenizer):
    """(prompt ids, completion ids) of each training row -> whether the leaf it ends in is correct."""
    _, leaves = _expected_leaves(trees, tokenizer, length_partition, 1.0, 1.2)
    correct = {(leaf[1], leaf[2]): leaf[4] for leaf in leaves}
    keys = {(tuple(trees.prompt_ids[i]), tuple(ids)): correct[("base", i)] for i, ids in enumerate(trees.completion_ids)}
    for n, ids in enumerate(trees.branch_ids):
        i, j = trees.branch_meta[n]
        prompt = tuple(trees.prompt_ids[i]) + tuple(trees.completion_ids[i][: trees.forks[i][j]])
        keys[(prompt, tuple(ids))] = correct[("branch", n)]
    return keys


def _record_loss_rows(monkeypatch):
    rows = []
    compute_loss = GRPOTrainer._compute_loss

    def recording(self, model, inputs):
        for r in range(inputs["completion_ids"].size(0)):
            mask = inputs["completion_mask"][r].bool()
            if mask.any():
                prompt = inputs["prompt_ids"][r][inputs["prompt_mask"][r].bool()].tolist()
                rows.append(((tuple(prompt), tuple(inputs["completion_ids"][r][mask].tolist())),
                             inputs["advantages"][r][mask].tolist()))
        return compute_loss(self, model, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", recording)
    return rows


@pytest.mark.parametrize("rule", ["rows", "leaves"])
def test_one_step_trains_the_reweighted_block_advantages(rule, tiny_model_path, tiny_tokenizer, tmp_path, monkeypatch):
    calls = []

    def partition_fn(texts, prompt):
        calls.append(list(texts))
        return length_partition(texts, prompt)

    loss_rows = _record_loss_rows(monkeypatch)
    settings = {} if rule == "rows" else {"cue_tree_credit": rule}  # "rows" is the default
    trainer, credit = _composed(tmp_path, tiny_model_path, partition_fn=partition_fn, **settings)
    trainer.train()
    (trees,) = credit.trees
    expected, changed = _expected_rows(trees, tiny_tokenizer, length_partition, alpha=1.0, tau=1.2, rule=rule)
    assert changed > 0, "no leaf was re-weighted: the scenario does not exercise the composition"
    if rule == "rows":  # Cue-GRPO's rule: the rows of incorrect leaves train DATPO's own advantages
        datpo, _ = _expected_rows(trees, tiny_tokenizer, lambda texts, prompt: [0] * len(texts), alpha=1.0, tau=1.0,
                                  rule="rows")  # one cluster, tau 1: every weight 1, DATPO alone
        correct = {key for key, leaf_correct in _leaf_keys(trees, tiny_tokenizer).items() if leaf_correct}
        moved = [key for (key, a), (_, b) in zip(expected, datpo) if a != b]
        assert moved and all(key in correct for key in moved)
    assert len(trees.branch_ids) > 0 and calls  # branches grew, and the partition saw P's full completions
    got = sorted(loss_rows)
    assert [key for key, _ in got] == [key for key, _ in expected]
    for (key, advantages), (_, reference) in zip(got, expected):
        assert advantages == pytest.approx(reference, abs=1e-5), key
    log = next(entry for entry in trainer.state.log_history if "cue/frac_groups_redistributed" in entry)
    assert log["cue/frac_groups_redistributed"] > 0
    for name in ("cue/clusters_per_group", "cue/weight_spread", "cue/frac_groups_nonuniform",
                 "cue/frac_positive_advantage_excluded"):
        assert name in log and math.isfinite(log[name]), name
    assert len(trainer.modifiers[0].overhead_seconds) == 1


def test_rarity_weights_on_trees_need_the_block_credit_to_ask():
    # The weights act on the leaves; apply() alone on the blocks' credit (a credit that never asked) must not pass
    # silently.
    credit = SimpleNamespace(base=torch.zeros(2))
    with pytest.raises(RuntimeError, match="leaf outcomes, but the rollout declared none"):
        RarityWeights(partition_fn=length_partition).apply(BatchContext(args=None), SimpleNamespace(outcomes=None), None, {}, credit)


def test_cue_tree_credit_is_checked_and_refused_where_there_are_no_trees():
    from trl_credit.cue_grpo import CueGRPOConfig

    common = dict(output_dir="out", use_cpu=True, report_to="none")
    with pytest.raises(ValueError, match="cue_tree_credit='blocks'; accepted"):
        CreditConfig(rollout="trees", credit="blocks", modifiers=["cue"], cue_tree_credit="blocks", **common)
    with pytest.raises(ValueError, match="applies only to DATPO's trees, but rollout='groups'"):
        CreditConfig(modifiers=["cue"], cue_tree_credit="leaves", **common)
    with pytest.raises(ValueError, match="CueGRPOTrainer has none"):
        CueGRPOConfig(cue_tree_credit="leaves", **common)
    assert CreditConfig(rollout="trees", credit="blocks", modifiers=["cue"], **common).cue_tree_credit == "rows"


def test_composed_trainer_refuses_a_partition_fn_the_config_ignores(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="partition_fn was given but cue_partition='cue'"):
        _composed(tmp_path, tiny_model_path, cue_partition="cue", cue_weighting="cr", cue_alpha=1.0)


def test_truncated_leaves_stay_out_of_p_under_mask_truncated_completions(tiny_model_path, tiny_tokenizer, tmp_path):
    # A truncated leaf's last block is masked out of the loss: as Cue-GRPO keeps loss-masked completions out of P,
    # it is not re-weighted (but still counts in its tree's mean). P is the same under both rules; the "leaves" rule
    # shows it in the outcomes leaf_outcomes returns.
    seen = []

    class RecordingWeights(RarityWeights):
        def leaf_outcomes(self, ctx, batch, leaves):
            rewards = super().leaf_outcomes(ctx, batch, leaves)
            seen.append((leaves, rewards))
            return rewards

    trainer, credit = _composed(tmp_path, tiny_model_path, mask_truncated_completions=True, cue_tree_credit="leaves",
                                modifier=RecordingWeights(partition_fn=length_partition))
    trainer.train()
    (trees,), ((leaves, rewards),) = credit.trees, seen
    eos_and_pad = (tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id)
    unmasked, all_leaves = _expected_leaves(trees, tiny_tokenizer, length_partition, 1.0, 1.2)
    truncated = {(leaf[1], leaf[2]) for leaf in all_leaves if leaf[5][-1] not in eos_and_pad}
    reweighted, _ = _expected_leaves(trees, tiny_tokenizer, length_partition, 1.0, 1.2, exclude=truncated)
    assert reweighted != unmasked, "no truncated leaf was a positive: the scenario does not test the exclusion"
    keys = []
    for b in leaves.blocks:
        rollout = trees.forest.blocks[b].rollout
        keys.append(("base", rollout[1]) if rollout[0] == "base" else ("branch", rollout[2]))
    assert leaves.in_loss.tolist() == [key not in truncated for key in keys]
    assert rewards.tolist() == pytest.approx([reweighted[key] for key in keys], abs=1e-12)


# ---------------------------------------------------------------------------------------------------- SmolLM2


def mentions_answer_reward(completions, answer, **kwargs):
    """A lenient verifier SmolLM2-135M passes now and then: the reference answer appears in the completion."""
    from trl_credit.tasks.rewards import completion_text

    return [float(str(a) in completion_text(c)) for c, a in zip(completions, answer)]


def boxed_format_reward(completions, **kwargs):
    from trl_credit.tasks.rewards import completion_text

    return [0.5 * float("\\boxed{" in completion_text(c)) for c in completions]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type, partition", [("grpo", "callable"), ("dapo", "cue")])
def test_smollm2_lora_two_steps(loss_type, partition, tmp_path, monkeypatch):
    # Real model, LoRA, 2 optimizer steps. With the callable partition, the advantages reaching TRL's loss equal the
    # independent computation from each step's trees; with Strategy-Cue partitions the run trains and logs cue/.
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from trl_credit.models import default_model_path
    from trl_credit.tasks.data import make_arithmetic_dataset

    torch.set_num_threads(1)  # shared CPUs
    steps = []  # the loss rows of each step (one loss call per step: steps_per_generation 1, one forward)
    compute_loss = GRPOTrainer._compute_loss

    def recording(self, model, inputs):
        steps.append([])
        for r in range(inputs["completion_ids"].size(0)):
            mask = inputs["completion_mask"][r].bool()
            if mask.any():
                prompt = inputs["prompt_ids"][r][inputs["prompt_mask"][r].bool()].tolist()
                steps[-1].append(((tuple(prompt), tuple(inputs["completion_ids"][r][mask].tolist())),
                                  inputs["advantages"][r][mask].tolist()))
        return compute_loss(self, model, inputs)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", recording)
    trainer, credit = _composed(
        tmp_path, default_model_path(), partition_fn=length_partition if partition == "callable" else None,
        peft_config=LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM"),
        reward_funcs=[mentions_answer_reward, boxed_format_reward],
        dataset=make_arithmetic_dataset(num_train=16, num_test=2, digits=1, num_operands=2, seed=0)["train"],
        per_device_train_batch_size=4, max_completion_length=32, max_steps=2, learning_rate=1e-4,
        loss_type=loss_type, max_forks=1, max_branches=2, cue_partition=partition, cue_weighting="cr",
        cue_alpha=1.0, cue_tau=1.2,
    )
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    trainer.train()
    assert trainer.state.global_step == 2 and len(credit.trees) == 2 and len(steps) == 2
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert all("cue/frac_groups_redistributed" in entry for entry in logs)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    if partition == "callable":
        tokenizer = AutoTokenizer.from_pretrained(default_model_path())
        for trees, rows in zip(credit.trees, steps):
            expected, _ = _expected_rows(trees, tokenizer, length_partition, alpha=1.0, tau=1.2)
            got = sorted(rows)
            assert [key for key, _ in got] == [key for key, _ in expected]
            for (key, advantages), (_, reference) in zip(got, expected):
                assert advantages == pytest.approx(reference, abs=1e-5), key
    if any(entry["grad_norm"] > 0 for entry in logs):  # LoRA B starts at 0: it moves with any non-zero advantage
        assert any(not torch.equal(lora_before[n], p.detach()) for n, p in trainer.model.named_parameters()
                   if n in lora_before)


# ---------------------------------------------------------------------------------------------------- two processes


@pytest.mark.multiprocess
def test_two_processes_match_one_process_and_the_independent_computation(tiny_model_path, tiny_tokenizer, tmp_path):
    # The trees, their leaves' texts and the callable partitions are spread over two processes (a tree spanning
    # both; two trees, one per process); the rows and their advantages must equal a 1-process run's, which must
    # equal the independent computation from its trees.
    import json

    from tests.mp import run_torchrun
    from tests.mp_scripts.datpo_cue_two_processes import run

    out = tmp_path / "two"
    out.mkdir()
    run_torchrun("tests/mp_scripts/datpo_cue_two_processes.py", tiny_model_path, str(out), nproc=2, timeout=300)
    two = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for name, per_device, prompts in (("spanning", 4, 1), ("two_trees", 8, 2)):
        trainer, credit = run(name, tiny_model_path, str(tmp_path / "one"), per_device, prompts, 1, return_trainer=True)
        expected, changed = _expected_rows(credit.trees[0], tiny_tokenizer, length_partition, alpha=1.0, tau=1.2)
        assert changed > 0, name
        one = sorted(((tuple(p), tuple(c)), a) for p, c, a in trainer.rows[0])
        assert [key for key, _ in one] == [key for key, _ in expected]
        for (key, advantages), (_, reference) in zip(one, expected):
            assert advantages == pytest.approx(reference, abs=1e-5), (name, key)
        got = sorted(((tuple(p), tuple(c)), a) for report in two for p, c, a in report[name]["rows"][0])
        assert [key for key, _ in got] == [key for key, _ in one], name
        for (key, advantages), (_, reference) in zip(got, one):
            assert advantages == pytest.approx(reference, abs=1e-5), (name, key)
        metrics = {k: v for entry in trainer.state.log_history for k, v in entry.items() if k.startswith("cue/")}
        assert metrics["cue/frac_groups_redistributed"] > 0
        for report in two:
            assert report[name]["steps"] == 1
            assert report[name]["cue"] == pytest.approx(metrics), name
