"""Block-level advantages on a DATPO tree (paper §3.2 Eq. 3, App. E.1 Eq. 7; docs/datpo.md#block-advantages).

The tree is plain data: block ``b`` runs from node ``block_start[b]`` to node ``block_end[b]``; nodes are the root
(``0``) and the forks (any other hashable ids); ``block_end[b] is None`` marks a terminal block, which ends in a
leaf whose reward is ``leaf_reward[b]``. A base rollout with forks f1 < f2 is three blocks
``root→f1, f1→f2, f2→leaf``; a branch from f is one block ``f→leaf``.

    A_base(b) = r(b) + V(end(b)) − V(start(b)),    r(b) = leaf reward if b is terminal else 0,  V(terminal) = 0

V(node):
- ``"subtree"`` (paper Eq. 7, default): mean reward of all leaves under the node — for a fork on base rollout i:
  rollout i's own leaf, the fork's branches and the branches of the later forks of rollout i; for the root: every
  leaf of the tree.
- ``"own_branches"`` (docs/datpo.md#block-advantages: "the authors' code uses only the fork's own branches"): for a fork, the mean
  final reward of its own branches only (neither the base rollout that continues through it nor the branches of
  later forks); for the root, the N base rollouts (so V(root) = the V_root of the budgets). Needs
  ``block_rollout`` (which generated sequence each block's tokens belong to) to tell a fork's branches from the
  rollout passing through it.

Unscorable leaves (every reward function returned ``None``; ``leaf_reward`` NaN) are left out of every value: V is
the mean over the *scorable* leaves under the node, and an unscorable terminal block gets advantage exactly 0 (as
TRL gives an unscorable completion advantage 0). A node with no scorable leaf under it has no value; a block that
starts or ends at such a node gets advantage 0 (nothing under it can be scored). With ``own_branches``, a fork
whose own branches are all unscorable falls back to its subtree value (which includes the rollout passing through).
A leaf reward of ±inf leaves no value finite: every block of the tree gets 0, as TRL's GRPO gives a group with a
±inf reward (its mean and std are non-finite, its advantages NaN, which TRL sets to 0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import math

import torch

__all__ = ["VALUE_ESTIMATES", "ROOT", "node_values", "block_advantages", "leaf_rewards"]

VALUE_ESTIMATES = ("subtree", "own_branches")
ROOT = 0


def _check_tree(block_start, block_end, leaf_reward, block_rollout, value_estimate):
    if value_estimate not in VALUE_ESTIMATES:
        raise ValueError(f"value_estimate must be one of {VALUE_ESTIMATES}, got {value_estimate!r}")
    n = len(block_start)
    if len(block_end) != n or len(leaf_reward) != n:
        raise ValueError(
            f"block_start, block_end and leaf_reward must have one entry per block, got lengths "
            f"{n}, {len(block_end)}, {len(leaf_reward)}"
        )
    if value_estimate == "own_branches":
        if block_rollout is None or len(block_rollout) != n:
            raise ValueError("value_estimate='own_branches' needs block_rollout (one rollout id per block)")
    parent: dict[Hashable, Hashable] = {}
    for b in range(n):
        end = block_end[b]
        if end is None:
            if leaf_reward[b] is None:
                raise ValueError(f"terminal block {b} (block_end None) needs a leaf_reward")
            continue
        if end == ROOT:
            raise ValueError(f"block {b} ends at the root (node {ROOT}); no block may enter the root")
        if end in parent:
            raise ValueError(f"node {end!r} is the end of two blocks; every fork has exactly one incoming block")
        parent[end] = block_start[b]
    for start in block_start:
        node, seen = start, set()
        while node != ROOT:
            if node not in parent:
                raise ValueError(f"node {start!r} is not connected to the root {ROOT}")
            if node in seen:
                raise ValueError(f"the blocks form a cycle through node {node!r}")
            seen.add(node)
            node = parent[node]
    return parent


def node_values(
    block_start: Sequence[Hashable],
    block_end: Sequence[Hashable | None],
    leaf_reward: Sequence[float | None],
    *,
    value_estimate: str = "subtree",
    block_rollout: Sequence[Hashable] | None = None,
) -> dict[Hashable, float]:
    """V(node) for the root and every fork of the tree (see the module docstring); terminal ends are not nodes."""
    parent = _check_tree(block_start, block_end, leaf_reward, block_rollout, value_estimate)
    totals: dict[Hashable, list[float]] = defaultdict(lambda: [0.0, 0.0])
    if value_estimate == "subtree":
        # every leaf counts for the node its block starts at and for all that node's ancestors
        for b, end in enumerate(block_end):
            if end is not None:
                continue
            if _unscorable(leaf_reward[b]):
                continue
            node = block_start[b]
            while True:
                totals[node][0] += float(leaf_reward[b])
                totals[node][1] += 1.0
                if node == ROOT:
                    break
                node = parent[node]
    else:
        final_reward = {}
        for b, end in enumerate(block_end):
            if end is None:
                if block_rollout[b] in final_reward:
                    raise ValueError(f"rollout {block_rollout[b]!r} has two terminal blocks")
                final_reward[block_rollout[b]] = float(leaf_reward[b])
        # The rollout entering a fork continues through it; it is not one of that fork's own branches.
        passing_rollout = {end: block_rollout[b] for b, end in enumerate(block_end) if end is not None}
        members: dict[Hashable, set] = defaultdict(set)
        for b, start in enumerate(block_start):
            if block_rollout[b] != passing_rollout.get(start):
                members[start].add(block_rollout[b])
        subtree = None
        for node, rollouts in members.items():
            missing = [r for r in rollouts if r not in final_reward]
            if missing:
                raise ValueError(f"rollouts {missing!r} have no terminal block")
            scored = [final_reward[r] for r in rollouts if not _unscorable(final_reward[r])]
            if scored:
                totals[node] = [sum(scored), float(len(scored))]
            else:  # every own branch unscorable: the subtree value (it holds the rollout passing through the fork)
                if subtree is None:
                    subtree = node_values(block_start, block_end, leaf_reward, value_estimate="subtree")
                totals[node] = [subtree[node], 1.0] if not math.isnan(subtree[node]) else [0.0, 0.0]
    values = {}
    has_leaf = _nodes_with_leaves(block_start, block_end, parent)
    for node in set(block_start) | {e for e in block_end if e is not None}:
        if node not in has_leaf:
            raise ValueError(f"node {node!r} has no leaf below it, so its value is undefined")
        total, count = totals.get(node, (0.0, 0.0))
        values[node] = total / count if count else math.nan  # nan: every leaf below is unscorable
    return values


def _unscorable(reward) -> bool:
    return reward is not None and math.isnan(float(reward))


def _nodes_with_leaves(block_start, block_end, parent) -> set:
    nodes = set()
    for b, end in enumerate(block_end):
        if end is None:
            node = block_start[b]
            while node not in nodes:
                nodes.add(node)
                if node == ROOT:
                    break
                node = parent[node]
    return nodes


def block_advantages(
    block_start: Sequence[Hashable],
    block_end: Sequence[Hashable | None],
    leaf_reward: Sequence[float | None],
    *,
    value_estimate: str = "subtree",
    block_rollout: Sequence[Hashable] | None = None,
) -> torch.Tensor:
    """A_base(b) = r(b) + V(end) − V(start) for every block (paper Eq. 3), shape (num_blocks,), float64.

    V is :func:`node_values` with ``value_estimate``; a terminal end has V = 0 and contributes its leaf reward r(b).
    An unscorable terminal block (leaf reward NaN), and a block touching a node with no scorable leaf below it, get
    exactly 0. A tree with a leaf reward of ±inf gets 0 on every block, as TRL's GRPO gives such a group.
    """
    values = node_values(
        block_start, block_end, leaf_reward, value_estimate=value_estimate, block_rollout=block_rollout
    )
    if any(r is not None and math.isinf(float(r)) for r in leaf_reward):
        # as TRL's GRPO gives a group with a ±inf reward (non-finite mean and std, NaN advantages, then 0)
        return torch.zeros(len(block_start), dtype=torch.float64)
    advantages = []
    for b, (start, end) in enumerate(zip(block_start, block_end)):
        if end is None:
            advantage = float(leaf_reward[b]) + 0.0 - values[start]
        else:
            advantage = 0.0 + values[end] - values[start]
        advantages.append(0.0 if math.isnan(advantage) else advantage)
    return torch.tensor(advantages, dtype=torch.float64)


def leaf_rewards(
    rewards_per_func: torch.Tensor,
    tree_of_leaf: Sequence[Hashable],
    reward_weights: torch.Tensor,
    aggregation: str = "sum_then_normalize",
) -> torch.Tensor:
    """The reward r of every leaf (base rollouts and branches, one row each of ``rewards_per_func``), float64.

    ``sum_then_normalize``: TRL's weighted sum of the reward functions, used raw (DATPO's A = r + V(end) − V(start)
    is already baselined, so TRL's normalization step is not applied). ``normalize_then_sum``: as TRL, each reward
    function is first standardized within the group, here the *tree* (every scorable leaf of the prompt:
    ``(r_k − mean_k) / (std_k + 1e-4)``, std with Bessel's correction, 0 for a lone leaf), then weighted and summed.
    Since V is a mean of leaf rewards, the per-function shift cancels in A, which becomes Σ_k w_k·A_k/(std_k + 1e-4):
    each objective counts in units of its own spread over the tree. A function's ``None`` (NaN) is skipped as in
    TRL; a leaf every function left unscored is NaN (unscorable).
    """
    if aggregation not in ("sum_then_normalize", "normalize_then_sum"):
        raise ValueError(f"aggregation must be 'sum_then_normalize' or 'normalize_then_sum', got {aggregation!r}")
    values = rewards_per_func.double()
    if len(tree_of_leaf) != values.size(0):
        raise ValueError(f"tree_of_leaf needs one entry per row ({values.size(0)}), got {len(tree_of_leaf)}")
    unscorable = torch.isnan(values).all(dim=1)
    if aggregation == "normalize_then_sum":
        values = values.clone()
        members: dict[Hashable, list[int]] = defaultdict(list)
        for row, tree in enumerate(tree_of_leaf):
            members[tree].append(row)
        for rows in members.values():
            block = values[rows]
            mean = torch.nanmean(block, dim=0, keepdim=True)
            count = (~torch.isnan(block)).sum(dim=0, keepdim=True)
            variance = torch.nanmean((block - mean) ** 2, dim=0, keepdim=True) * count / (count - 1).clamp(min=1)
            std = torch.where(count > 1, variance.sqrt(), torch.zeros_like(variance))
            values[rows] = (block - mean) / (std + 1e-4)
    weights = reward_weights.to(device=values.device, dtype=values.dtype).unsqueeze(0)
    rewards = (values * weights).nansum(dim=1)
    rewards[unscorable] = math.nan
    return rewards
