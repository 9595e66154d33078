"""The trees of one DATPO generation batch as data: every block of every tree (:class:`Block`), in process order,
and what the trainer computes over them per tree (:class:`Forest`). Pure: no trainer, no collective call.

A base rollout with forks f1 < f2 is three blocks ``root→f1, f1→f2, f2→leaf``; a branch from f is one block
``f→leaf`` (:mod:`.tree` has the advantage math). Node ids: ``ROOT`` (0) and ``(row, j)`` for fork j of global base
row ``row``; rollout ids: ``("base", row)``, ``("branch", q, n)`` for branch n of process q.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence

import torch

from trl_credit.core.batch import Outcomes
from .tree import ROOT, block_advantages, node_values

__all__ = [
    "Block", "Skeletons", "Forest", "TreeBatch", "ForestCredit", "LeafOutcomes", "build_forest", "is_truncated",
    "sampled_length",
]


@dataclasses.dataclass(frozen=True)
class Block:
    group: int  # the tree (prompt): global base row // num_generations
    start: Hashable  # the node it starts at
    end: Hashable | None  # the node it ends at; None: a terminal block, ending in a leaf
    reward: float | None  # a terminal block's leaf reward (NaN: unscorable); None for the others
    rollout: tuple  # the generated sequence its tokens belong to
    source: tuple  # where its tokens are on their process: ("base", local row, first, end) / ("branch", n, 0, end)

    @property
    def kind(self) -> str:
        return self.source[0]

    @property
    def sibling_key(self) -> tuple:
        return (self.group, self.start)

    @property
    def unscorable(self) -> bool:
        return self.reward is not None and math.isnan(self.reward)


@dataclasses.dataclass
class Skeletons:
    """The gathered shape of every tree (small: forks and lengths per row), from which every process builds them."""

    records: list[tuple[int, list[int], int]]  # (global base row, forks, completion length), process order
    branch_counts: list[int]  # branches per process
    branch_lengths: list[int]  # tokens per branch, process order


@dataclasses.dataclass
class Forest:
    blocks: list[Block] = dataclasses.field(default_factory=list)
    by_group: dict[int, list[int]] = dataclasses.field(default_factory=dict)  # block indices per tree
    by_process: list[list[int]] = dataclasses.field(default_factory=list)  # block indices per process
    branch_response_lengths: list[int] = dataclasses.field(default_factory=list)  # prefix + branch, per branch

    def add(self, block: Block) -> int:
        self.blocks.append(block)
        index = len(self.blocks) - 1
        self.by_group.setdefault(block.group, []).append(index)
        return index

    def rewards(self) -> list[float | None]:
        return [block.reward for block in self.blocks]

    def block_advantages(self, value_estimate: str, rewards: Sequence[float | None] | None = None) -> torch.Tensor:
        """A_base of every block (paper Eq. 3), tree by tree, float64; ``rewards`` (one per block, as
        :meth:`rewards`) replaces the blocks' leaf rewards (the leaf outcomes a modifier re-weighted)."""
        advantages = torch.zeros(len(self.blocks), dtype=torch.float64)
        for members in self.by_group.values():
            advantages[torch.tensor(members)] = block_advantages(
                *self._tree(members, rewards), value_estimate=value_estimate,
                block_rollout=[self.blocks[b].rollout for b in members],
            )
        return advantages

    def grounded_forks(self, finished: Sequence[float | None], value_estimate: str) -> set:
        """The forks whose value V over ``finished`` (a leaf value per terminal block: 1 finished, 0 truncated,
        NaN unscorable) is > 0: V rests on at least one finished scorable leaf."""
        grounded = set()
        for members in self.by_group.values():
            starts, ends, _ = self._tree(members)
            share = node_values(
                starts, ends, [finished[b] for b in members], value_estimate=value_estimate,
                block_rollout=[self.blocks[b].rollout for b in members],
            )
            grounded.update(node for node, value in share.items() if node != ROOT and value > 0)
        return grounded

    def rollout_mean_advantages(self, advantages: torch.Tensor, records, model_masks=None) -> list[float]:
        """Per base rollout (``records`` order), its tokens' mean advantage (blocks weighted by their tokens). With
        ``model_masks`` (every base rollout's, ``records`` order: multi-turn) the model's tokens only."""
        sums = {row: 0.0 for row, _, _ in records}
        masks = {row: mask for (row, _, _), mask in zip(records, model_masks)} if model_masks is not None else None
        for b, block in enumerate(self.blocks):
            kind, _, start, end = block.source
            if kind == "base":
                row = block.rollout[1]
                tokens = end - start if masks is None else sum(masks[row][start:end])
                sums[row] += float(advantages[b]) * tokens
        lengths = {row: length if masks is None else sum(masks[row]) for row, _, length in records}
        return [sums[row] / max(lengths[row], 1) for row, _, _ in records]

    def _tree(self, members: list[int], rewards: Sequence[float | None] | None = None):
        return (
            [self.blocks[b].start for b in members],
            [self.blocks[b].end for b in members],
            [self.blocks[b].reward if rewards is None else rewards[b] for b in members],
        )


@dataclasses.dataclass
class TreeBatch:
    """One generation batch while the :class:`~trl_credit.datpo.parts.Trees` rollout grows its trees, filled step by step: phase 1 (this
    process's base rollouts; verdicts of all processes), the budgets, the forks, phase 2 (this process's branches)
    and the forest. Lists named per process hold this process's rows; the others are global, in process order."""

    inputs: list
    prompts: list
    prompt_ids: list[list[int]]  # per process: the base rollouts' prompts
    completion_ids: list[list[int]]  # per process: the base rollouts
    rewards_per_func: torch.Tensor  # global
    first_row: int  # this process's first global base row
    unscorable: list[bool] = dataclasses.field(default_factory=list)  # global, per base rollout
    success: list[bool] = dataclasses.field(default_factory=list)  # global: the verifier's verdicts
    budgets: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (K̂, B̂) per tree
    v_root: list[float] = dataclasses.field(default_factory=list)  # per tree (NaN: no scorable base rollout)
    forks: list[list[int]] = dataclasses.field(default_factory=list)  # per process: fork positions per base row
    branch_meta: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # per process: (base row, fork)
    branch_prefixes: list[list[int]] = dataclasses.field(default_factory=list)  # per process: prompt + prefix
    branch_ids: list[list[int]] = dataclasses.field(default_factory=list)  # per process
    branch_logprobs: list[list[float]] | None = None  # per process: the sampler's (vLLM), else None
    branch_counts: list[int] = dataclasses.field(default_factory=list)  # branches per process
    branch_rewards_per_func: torch.Tensor | None = None  # global
    branch_success: list[bool] = dataclasses.field(default_factory=list)  # global
    base_rewards: list[float] = dataclasses.field(default_factory=list)  # global leaf rewards (NaN: unscorable)
    branch_rewards: list[float] = dataclasses.field(default_factory=list)  # global leaf rewards
    skeletons: Skeletons | None = None
    forest: Forest | None = None
    # multi-turn rollouts (TRL's tool loop or environments; datpo/multiturn.py), else None / empty
    episodes: list | None = None  # per process: each base rollout's core.tool_loop.Episode (TRL's tool_mask, messages)
    branch_environments: list = dataclasses.field(default_factory=list)  # per process: each branch's environment
    branch_model_masks: list[list[int]] | None = None  # per process: each branch's model mask (TRL's tool_mask)
    branch_messages: list | None = None  # per process: each leaf's messages (prefix + branch), as rewards read them
    model_tokens: tuple | None = None  # global: model tokens of base rollouts, branches, branch leaves (metrics)

    @property
    def num_local(self) -> int:
        return len(self.completion_ids)


@dataclasses.dataclass
class ForestCredit:
    """What each block of the forest is credited with: A_base (Eq. 3) and the gated sibling-diversity bonus, kept
    apart so that the loss applies α of the optimizer step it trains (Eq. 4, 8)."""

    base: torch.Tensor  # A_base per block, float64
    bonus: torch.Tensor  # gate · Div per block
    alpha: float  # α at the step the batch was generated
    diversity: torch.Tensor  # Div per block (0 without siblings)
    has_siblings: torch.Tensor  # bool per block
    grounded: set | None = None  # with mask_truncated_completions: forks whose value rests on a finished leaf

    @property
    def advantages(self) -> torch.Tensor:
        return self.base + self.alpha * self.bonus


@dataclasses.dataclass
class LeafOutcomes(Outcomes):
    """The leaves of every tree of a generation batch as outcomes, for the modifiers that re-weight them before the
    block Monte Carlo aggregation (the core's outcome stage: ``Trees.outcomes``, ``Modifier.leaf_outcomes``).
    Leaf ``l`` is the terminal block ``blocks[l]`` of the forest: a base rollout, or a branch whose completion is the
    full response (prefix + branch). Global (the same on every process) except ``local_texts``."""

    blocks: list[int]  # the forest block of each leaf (rows: its block's rollout; unit_rows: every block's)


def build_forest(skeletons: Skeletons, budgets, base_rewards, branch_rewards, num_generations: int) -> Forest:
    """All blocks of all trees of the generation batch, in process order (each process: its base blocks, then its
    branches). Branches of process q are ordered by base row, fork, branch number, as each process generated them;
    ``budgets`` is (K̂, B̂) per tree, ``base_rewards`` / ``branch_rewards`` the global leaf rewards."""
    records, branch_counts, branch_lengths = skeletons.records, skeletons.branch_counts, skeletons.branch_lengths
    forest = Forest()
    n_local = len(records) // len(branch_counts)
    branch_offset = 0
    for q, count in enumerate(branch_counts):
        local_blocks = []
        q_records = records[q * n_local : (q + 1) * n_local]
        for i, (row, forks, length) in enumerate(q_records):
            group = row // num_generations
            cuts = [0, *forks, length]
            nodes = [ROOT, *[(row, j) for j in range(len(forks))]]
            for j in range(len(nodes)):
                end = nodes[j + 1] if j + 1 < len(nodes) else None
                reward = base_rewards[row] if end is None else None
                source = ("base", i, cuts[j], cuts[j + 1])
                local_blocks.append(forest.add(Block(group, nodes[j], end, reward, ("base", row), source)))
        n = 0
        for row, forks, _ in q_records:
            group = row // num_generations
            _, b_hat = budgets[group]
            for j, fork in enumerate(forks):
                for _ in range(b_hat):
                    length = branch_lengths[branch_offset + n]
                    reward = branch_rewards[branch_offset + n]
                    block = Block(group, (row, j), None, reward, ("branch", q, n), ("branch", n, 0, length))
                    local_blocks.append(forest.add(block))
                    forest.branch_response_lengths.append(fork + length)
                    n += 1
        if n != count:
            raise RuntimeError(f"process {q} reported {count} branches but its forks imply {n}")
        branch_offset += count
        forest.by_process.append(local_blocks)
    return forest


def is_truncated(ids, eos_and_pad) -> bool:
    """TRL's test for ``mask_truncated_completions``: a completion that does not end with EOS (or padding)."""
    return len(ids) > 0 and ids[-1] not in eos_and_pad


def sampled_length(ids, budget: int, pad_id: int | None) -> int:
    """Tokens of a generated branch row that the sampler produced: ``ids`` less the padding (``pad_id``; None: the
    sampler does not pad) that ``generate`` appended past the row's ``budget`` after it stopped there."""
    length = len(ids)
    if pad_id is not None:
        while length > budget and ids[length - 1] == pad_id:
            length -= 1
    return length
