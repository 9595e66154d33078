"""Sibling diversity Div(b) = 1 − mean cos to siblings (paper Eq. 8) and the bonus Â = A + 1[A>0]·α·Div (Eq. 4)."""

import pytest
import torch

from trl_credit.datpo import annealed_alpha, block_advantages, diversity_bonus, sibling_diversity
from tests.test_datpo_tree import END, REWARD, START

# Hand-picked 2-D embeddings for the 9 blocks of the tree in tests/test_datpo_tree.py.
EMB = torch.tensor(
    [
        [1.0, 0.0],  # 0 root->a1       (root siblings: 0, 3)
        [1.0, 0.0],  # 1 a1->a2         (a1 siblings: 1, 4, 5, 6)
        [1.0, 1.0],  # 2 A's tail       (a2 siblings: 2, 7, 8)
        [0.0, 1.0],  # 3 B
        [2.0, 0.0],  # 4 x1  (norm does not matter)
        [3.0, 4.0],  # 5 x2  cos with (1,0) = 3/5
        [0.0, 2.0],  # 6 x3  cos with (1,0) = 0, with (3,4) = 4/5
        [1.0, 1.0],  # 7 y1
        [1.0, -1.0],  # 8 y2 cos with (1,1) = 0
    ]
)
DIV = [
    1 - 0,  # 0: one sibling (3), cos((1,0),(0,1)) = 0
    1 - (1 + 0.6 + 0) / 3,  # 1: siblings 4, 5, 6 -> 1 − 1.6/3 = 7/15
    1 - (1 + 0) / 2,  # 2: siblings 7 (cos 1), 8 (cos 0) -> 1/2
    1 - 0,  # 3
    1 - (1 + 0.6 + 0) / 3,  # 4: siblings 1 (1), 5 (0.6), 6 (0) -> 7/15
    1 - (0.6 + 0.6 + 0.8) / 3,  # 5: siblings 1, 4 (0.6 each), 6 (0.8) -> 1/3
    1 - (0 + 0 + 0.8) / 3,  # 6: -> 11/15
    1 - (1 + 0) / 2,  # 7: siblings 2 (1), 8 (0) -> 1/2
    1 - (0 + 0) / 2,  # 8: -> 1
]


def test_sibling_diversity_by_hand():
    assert sibling_diversity(EMB, START).tolist() == pytest.approx(DIV)


def test_blocks_without_siblings_or_key_get_zero():
    # block 0 alone at the root once block 3 is keyed None; block 3 itself gets 0
    keys = list(START)
    keys[3] = None
    div = sibling_diversity(EMB, keys)
    assert div[0].item() == 0.0 and div[3].item() == 0.0
    assert div[1].item() == pytest.approx(7 / 15)  # other groups unchanged


def test_bonus_only_on_positive_blocks():
    base = block_advantages(START, END, REWARD)  # [-1/21, 0, -2/3, 2/7, 1/3, -2/3, 1/3, 1/3, 1/3]
    div = torch.tensor(DIV, dtype=torch.float64)
    out = diversity_bonus(base, div, 0.2)
    expected = [
        -1 / 21,  # negative: unchanged
        0.0,  # A_base = 0 exactly: the indicator is strict, no bonus
        -2 / 3,
        2 / 7 + 0.2 * 1,
        1 / 3 + 0.2 * 7 / 15,
        -2 / 3,
        1 / 3 + 0.2 * 11 / 15,
        1 / 3 + 0.2 * 0.5,
        1 / 3 + 0.2 * 1,
    ]
    assert out.tolist() == pytest.approx(expected)
    everywhere = diversity_bonus(base, div, 0.2, on_all_blocks=True)
    assert everywhere.tolist() == pytest.approx([a + 0.2 * d for a, d in zip(base.tolist(), DIV)])


def test_annealing_endpoints():
    assert annealed_alpha(0, 10) == pytest.approx(0.2)  # first optimizer step
    assert annealed_alpha(9, 10) == pytest.approx(0.0)  # last optimizer step
    assert annealed_alpha(3, 7) == pytest.approx(0.2 - 0.2 * 3 / 6)  # 0.1 halfway
    assert annealed_alpha(50, 10) == pytest.approx(0.0)  # past the end stays at the end
    assert annealed_alpha(9, 10, 0.2, -0.2) == pytest.approx(-0.2)  # paper ablation 0.2 -> -0.2
    assert annealed_alpha(9, 10, schedule="constant") == pytest.approx(0.2)
    assert annealed_alpha(0, 1) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="schedule"):
        annealed_alpha(0, 10, schedule="cosine")


def test_shape_errors():
    with pytest.raises(ValueError, match="num_blocks"):
        sibling_diversity(EMB, START[:3])


def test_rounding_noise_is_not_a_positive_advantage():
    # three base rollouts rewarded 0.7 each: A = 0.7 − mean = 0 exactly, but the float mean makes it +1.1e-16;
    # rewards 0.2, 0.3, 0.1: the first block's A = 0.2 − 0.2 = 0, computed as +2.8e-17
    for rewards, zero in (([0.7, 0.7, 0.7], [0, 1, 2]), ([0.2, 0.3, 0.1], [0])):
        base = block_advantages([0, 0, 0], [None] * 3, rewards)
        assert all(0 < base[b].item() < 1e-15 for b in zero)  # the float artefact this guards against
        out = diversity_bonus(base, torch.ones(3, dtype=torch.float64), 0.2)
        assert all(out[b].item() == pytest.approx(0.0, abs=1e-12) for b in zero)  # no bonus
    # a real positive advantage still gets it: rewards 0.3, 0.2, 0.1 -> A = +0.1 on the first block
    out = diversity_bonus(block_advantages([0, 0, 0], [None] * 3, [0.3, 0.2, 0.1]), torch.ones(3, dtype=torch.float64), 0.2)
    assert out[0].item() == pytest.approx(0.1 + 0.2)


class _CountingEmbedder:
    """Embeds a text as (number of 'a', number of 'b') and records every batch it is given."""

    def __init__(self):
        self.batches = []

    def encode(self, texts, batch_size, convert_to_tensor, show_progress_bar):
        self.batches.append(list(texts))
        return torch.tensor([[float(t.count("a")), float(t.count("b"))] for t in texts])


class _Chars:
    """A tokenizer whose token ids are character codes."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_each_distinct_block_text_is_embedded_once():
    """Two of a fork's three branches are the same text: it is embedded once and both copies get its vector, so Div
    is what embedding every copy gives (worked by hand below)."""
    from types import SimpleNamespace

    from trl_credit.datpo.credit import embedded_sibling_diversity
    from trl_credit.datpo.forest import Skeletons, TreeBatch, build_forest

    ids = lambda text: [ord(c) for c in text]  # noqa: E731
    # one prompt, 2 base rollouts "aaab" (fork after 2 tokens) and "bbbb" (no fork); 3 branches from the fork
    records = [(0, [2], 4), (1, [], 4)]
    branch_texts = ["ab", "ab", "bb"]
    skeletons = Skeletons(records, [3], [2, 2, 2])
    trees = TreeBatch(inputs=[], prompts=[], prompt_ids=[[], []], completion_ids=[ids("aaab"), ids("bbbb")],
                      rewards_per_func=torch.zeros(2, 1), first_row=0)
    trees.branch_ids = [ids(t) for t in branch_texts]
    trees.forest = build_forest(skeletons, [(1, 3)], [0.0, 0.0], [1.0, 1.0, 0.0], num_generations=2)
    ctx = SimpleNamespace(  # the batch context of one process: what embedded_sibling_diversity reads of it
        args=SimpleNamespace(diversity_root_siblings=False, embedding_batch_size=8), process_index=0,
        tokenizer=_Chars(), gather_rows=list,
    )
    embedder = _CountingEmbedder()
    diversity, has_siblings = embedded_sibling_diversity(ctx, trees, embedder)
    # the fork's siblings: the base rollout's tail "ab" and the branches "ab", "ab", "bb": three distinct texts
    assert embedder.batches == [["ab", "bb"]]
    # blocks: 0 root->fork "aa", 1 fork->leaf "ab" (the base tail), 2 "bbbb" (root->leaf; the root is no fork by
    # default), 3-5 the branches; (1,1)·(1,1) has cosine 1, (1,1)·(0,1) 1/√2
    c = 2 ** -0.5
    same = 1 - (1 + 1 + c) / 3
    expected = [0.0, same, 0.0, same, same, 1 - (c + c + c) / 3]
    assert has_siblings.tolist() == [False, True, False, True, True, True]
    assert diversity.tolist() == pytest.approx(expected, abs=1e-12)
