"""Block-level advantages on a DATPO tree (paper §3.2 Eq. 3, App. E.1 Eq. 7; SPEC §3.4).

The tree is plain data: block ``b`` runs from node ``block_start[b]`` to node ``block_end[b]``; nodes are the root
(``0``) and the forks (any other hashable ids); ``block_end[b] is None`` marks a terminal block, which ends in a
leaf whose reward is ``leaf_reward[b]``. A base rollout with forks f1 < f2 is three blocks
``root→f1, f1→f2, f2→leaf``; a branch from f is one block ``f→leaf``.

    A_base(b) = r(b) + V(end(b)) − V(start(b)),    r(b) = leaf reward if b is terminal else 0,  V(terminal) = 0

V(node):
- ``"subtree"`` (paper Eq. 7, default): mean reward of all leaves under the node — for a fork on base rollout i:
  rollout i's own leaf, the fork's branches and the branches of the later forks of rollout i; for the root: every
  leaf of the tree.
- ``"own_branches"`` (SPEC §3.4: "the authors' code uses only the fork's own branches"): for a fork, the mean
  final reward of its own branches only (neither the base rollout that continues through it nor the branches of
  later forks); for the root, the N base rollouts (so V(root) = the V_root of the budgets). Needs
  ``block_rollout`` (which generated sequence each block's tokens belong to) to tell a fork's branches from the
  rollout passing through it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

__all__ = ["VALUE_ESTIMATES", "ROOT", "node_values", "block_advantages"]

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
        for node, rollouts in members.items():
            missing = [r for r in rollouts if r not in final_reward]
            if missing:
                raise ValueError(f"rollouts {missing!r} have no terminal block")
            totals[node] = [sum(final_reward[r] for r in rollouts), float(len(rollouts))]
    nodes = set(block_start) | {e for e in block_end if e is not None}
    values = {}
    for node in nodes:
        total, count = totals.get(node, (0.0, 0.0))
        if count == 0:
            raise ValueError(f"node {node!r} has no leaf below it, so its value is undefined")
        values[node] = total / count
    return values


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
    """
    values = node_values(
        block_start, block_end, leaf_reward, value_estimate=value_estimate, block_rollout=block_rollout
    )
    advantages = []
    for b, (start, end) in enumerate(zip(block_start, block_end)):
        if end is None:
            advantages.append(float(leaf_reward[b]) + 0.0 - values[start])
        else:
            advantages.append(0.0 + values[end] - values[start])
    return torch.tensor(advantages, dtype=torch.float64)
