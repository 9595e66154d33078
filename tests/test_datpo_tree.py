"""Block advantages on a hand-built tree (paper Eq. 3 and 7, docs/datpo.md#block-advantages).

Tree (one prompt): base rollout A (reward 0) with forks a1 < a2, base rollout B (reward 1) without forks;
fork a1 has 3 branches (rewards 1, 0, 1), fork a2 has 2 branches (rewards 1, 1).

    block  start  end   reward  rollout
    0      root   a1    -       A        A's tokens before a1
    1      a1     a2    -       A        A's tokens between the forks
    2      a2     leaf  0       A        A's tail
    3      root   leaf  1       B        all of B
    4-6    a1     leaf  1,0,1   x1-x3    branches of a1
    7-8    a2     leaf  1,1     y1-y2    branches of a2
"""

import pytest
import torch

from trl_credit.datpo import block_advantages, node_values

START = [0, "a1", "a2", 0, "a1", "a1", "a1", "a2", "a2"]
END = ["a1", "a2", None, None, None, None, None, None, None]
REWARD = [None, None, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
ROLLOUT = ["A", "A", "A", "B", "x1", "x2", "x3", "y1", "y2"]


def test_subtree_values_paper_definition():
    values = node_values(START, END, REWARD)
    # V(a2): leaves under a2 = A's leaf 0, branches 1, 1 -> 2/3
    assert values["a2"] == pytest.approx(2 / 3)
    # V(a1): A's leaf 0, a1's branches 1, 0, 1, and the later fork's branches 1, 1 -> 4/6
    assert values["a1"] == pytest.approx(4 / 6)
    # V(root): every leaf: 0 (A) + 1 (B) + 2 (a1) + 2 (a2) = 5 over 7 leaves
    assert values[0] == pytest.approx(5 / 7)


def test_subtree_block_advantages():
    adv = block_advantages(START, END, REWARD)
    expected = [
        2 / 3 - 5 / 7,  # root->a1: 0 + V(a1) − V(root) = 14/21 − 15/21 = −1/21
        2 / 3 - 2 / 3,  # a1->a2: V(a2) − V(a1) = 0
        0 + 0 - 2 / 3,  # A's tail: r = 0, terminal V = 0, − V(a2) = −2/3
        1 + 0 - 5 / 7,  # B: 1 − 5/7 = 2/7
        1 - 2 / 3, 0 - 2 / 3, 1 - 2 / 3,  # a1's branches: ±(r − 2/3) = 1/3, −2/3, 1/3
        1 - 2 / 3, 1 - 2 / 3,  # a2's branches: 1/3, 1/3
    ]
    assert adv.tolist() == pytest.approx(expected)
    assert adv[0].item() == pytest.approx(-1 / 21)


def test_own_branches_values_and_advantages_authors_code():
    values = node_values(START, END, REWARD, value_estimate="own_branches", block_rollout=ROLLOUT)
    # V(root) = the N base rollouts: A (0), B (1) -> 1/2 (the V_root of the budgets)
    assert values[0] == pytest.approx(1 / 2)
    # V(a1) = a1's own branches only: 1, 0, 1 -> 2/3 (not A passing through, not a2's branches)
    assert values["a1"] == pytest.approx(2 / 3)
    # V(a2) = a2's own branches: 1, 1 -> 1
    assert values["a2"] == pytest.approx(1.0)
    adv = block_advantages(START, END, REWARD, value_estimate="own_branches", block_rollout=ROLLOUT)
    expected = [
        2 / 3 - 1 / 2,  # root->a1: V(a1) − V(root) = 1/6
        1 - 2 / 3,  # a1->a2: V(a2) − V(a1) = 1/3
        0 - 1,  # A's tail: r = 0, terminal V = 0, − V(a2) = −1
        1 - 1 / 2,  # B: 1/2
        1 - 2 / 3, 0 - 2 / 3, 1 - 2 / 3,  # a1's branches: 1/3, −2/3, 1/3
        1 - 1, 1 - 1,  # a2's branches: 0, 0
    ]
    assert adv.tolist() == pytest.approx(expected)


def test_terminal_value_is_zero_single_rollout():
    # A lone rollout without forks: V(root) = its reward, so A = r + 0 − r = 0
    assert block_advantages([0], [None], [1.0]).tolist() == [0.0]
    # two rollouts, rewards 1 and 0: V(root) = 1/2, advantages ±1/2 (terminal end contributes V = 0)
    assert block_advantages([0, 0], [None, None], [1.0, 0.0]).tolist() == pytest.approx([0.5, -0.5])


def test_malformed_trees_are_refused():
    with pytest.raises(ValueError, match="two blocks"):
        block_advantages([0, 0, "f"], ["f", "f", None], [None, None, 1.0])
    with pytest.raises(ValueError, match="not connected"):
        block_advantages([0, "g"], [None, None], [1.0, 0.0])
    with pytest.raises(ValueError, match="leaf_reward"):
        block_advantages([0], [None], [None])
    with pytest.raises(ValueError, match="no leaf"):
        block_advantages([0, 0], ["f", None], [None, 1.0])
    with pytest.raises(ValueError, match="block_rollout"):
        block_advantages([0], [None], [1.0], value_estimate="own_branches")
    with pytest.raises(ValueError, match="value_estimate"):
        block_advantages([0], [None], [1.0], value_estimate="mean")
    assert isinstance(block_advantages([0], [None], [1.0]), torch.Tensor)


NAN = float("nan")


def test_unscorable_leaves_are_left_out_of_values_and_get_zero():
    # The tree above with branch x2 (reward 0) unscorable: every reward function returned None.
    reward = list(REWARD)
    reward[5] = NAN
    values = node_values(START, END, reward)
    # V(a1): A's leaf 0, a1's scorable branches 1, 1, a2's branches 1, 1 -> 4/5 (x2 is not a wrong leaf)
    assert values["a1"] == pytest.approx(4 / 5)
    # V(root): 0 (A) + 1 (B) + 2 (a1) + 2 (a2) = 5 over 6 scorable leaves
    assert values[0] == pytest.approx(5 / 6)
    adv = block_advantages(START, END, reward)
    assert adv[5].item() == 0.0  # exactly 0 on the unscorable branch
    assert adv[0].item() == pytest.approx(4 / 5 - 5 / 6)  # root->a1
    assert adv[4].item() == pytest.approx(1 - 4 / 5)


def test_unscorable_everywhere_and_own_branches_fallback():
    # a prompt none of whose rollouts could be scored: every advantage 0, no error
    assert block_advantages([0, 0], [None, None], [NAN, NAN]).tolist() == [0.0, 0.0]
    # own_branches: a2's own branches both unscorable -> V(a2) falls back to its subtree value (A's leaf 0)
    reward = list(REWARD)
    reward[7] = reward[8] = NAN
    values = node_values(START, END, reward, value_estimate="own_branches", block_rollout=ROLLOUT)
    assert values["a2"] == pytest.approx(0.0)
    assert values["a1"] == pytest.approx(2 / 3)  # unchanged: its own branches 1, 0, 1
    adv = block_advantages(START, END, reward, value_estimate="own_branches", block_rollout=ROLLOUT)
    assert adv[7].item() == 0.0 and adv[8].item() == 0.0
    assert adv[1].item() == pytest.approx(0 - 2 / 3)  # a1->a2: V(a2) − V(a1)


def test_leaf_rewards_sum_and_normalize_per_tree():
    import math

    from trl_credit.datpo import leaf_rewards

    # columns: accuracy, format; weights 1, 0.5; trees: rows 0-2 tree "p", rows 3-4 tree "q"
    per_func = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [NAN, NAN], [1.0, NAN]])
    weights = torch.tensor([1.0, 0.5])
    summed = leaf_rewards(per_func, ["p", "p", "p", "q", "q"], weights)
    assert summed[:3].tolist() == pytest.approx([1.5, 0.5, 0.0]) and math.isnan(summed[3]) and summed[4] == 1.0
    normed = leaf_rewards(per_func, ["p", "p", "p", "q", "q"], weights, "normalize_then_sum")
    # tree p, accuracy 1, 0, 0: mean 1/3, std (Bessel) sqrt(((2/3)^2 + 2(1/3)^2)/2) = sqrt(1/3)
    s_acc = math.sqrt(1 / 3) + 1e-4
    s_fmt = math.sqrt(1 / 3) + 1e-4  # format 1, 1, 0: mean 2/3, same spread
    assert normed[:3].tolist() == pytest.approx([
        (2 / 3) / s_acc + 0.5 * (1 / 3) / s_fmt,
        (-1 / 3) / s_acc + 0.5 * (1 / 3) / s_fmt,
        (-1 / 3) / s_acc + 0.5 * (-2 / 3) / s_fmt,
    ])
    # tree q: row 3 unscorable (NaN), row 4 the only scored accuracy: (1 − 1)/(0 + 1e-4) = 0
    assert math.isnan(normed[3]) and normed[4] == 0.0


def test_forest_of_a_batch_holds_the_blocks_of_each_tree_in_order():
    # One process, one prompt (N=2): base row 0 forks at tokens 1 and 3 (length 5), base row 1 does not fork; B̂=2
    # branches per fork. Blocks, by hand: root→(0,0), (0,0)→(0,1), (0,1)→leaf, root→leaf, then the branches.
    from trl_credit.datpo.forest import Skeletons, build_forest

    skeletons = Skeletons(records=[(0, [1, 3], 5), (1, [], 4)], branch_counts=[4], branch_lengths=[2, 3, 1, 2])
    forest = build_forest(skeletons, [(2, 2)], [0.0, 1.0], [1.0, 0.0, 1.0, 1.0], num_generations=2)
    assert [(b.start, b.end, b.reward) for b in forest.blocks] == [
        (0, (0, 0), None), ((0, 0), (0, 1), None), ((0, 1), None, 0.0), (0, None, 1.0),
        ((0, 0), None, 1.0), ((0, 0), None, 0.0), ((0, 1), None, 1.0), ((0, 1), None, 1.0),
    ]
    assert [b.source for b in forest.blocks[:4]] == [("base", 0, 0, 1), ("base", 0, 1, 3), ("base", 0, 3, 5),
                                                     ("base", 1, 0, 4)]
    assert forest.by_group == {0: list(range(8))} and forest.by_process == [list(range(8))]
    assert forest.branch_response_lengths == [3, 4, 4, 5]  # fork + branch tokens
    # subtree values: V(root) = 4/6, V((0,0)) = mean(0, 1, 0, 1, 1) = 3/5, V((0,1)) = mean(0, 1, 1) = 2/3
    want = [3 / 5 - 4 / 6, 2 / 3 - 3 / 5, 0 - 2 / 3, 1 - 4 / 6, 1 - 3 / 5, 0 - 3 / 5, 1 - 2 / 3, 1 - 2 / 3]
    assert forest.block_advantages("subtree").tolist() == pytest.approx(want)
