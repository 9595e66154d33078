"""Block advantages on a hand-built tree (paper Eq. 3 and 7, SPEC §3.4).

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
