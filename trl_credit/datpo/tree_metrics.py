"""DATPO's per-step metrics (docs/datpo.md#metrics), logged through TRL's metric buffer."""

from __future__ import annotations

import math

from .forest import ForestCredit, TreeBatch

__all__ = ["log_tree_metrics", "log_fork_coverage"]


def log_tree_metrics(ctx, trees: TreeBatch, credit: ForestCredit) -> None:
    """Tree metrics. Pass rates are the verifier's verdicts (any correct leaf per prompt), over the prompts with at
    least one scorable leaf; unscorable leaves count in no rate or mean. Token counts of multi-turn rollouts are the
    model's tokens (``trees.model_tokens``: tool results left out, as TRL's ``completions/mean_length``)."""
    forest, records = trees.forest, trees.skeletons.records
    budgets, base_unscorable, base_success = trees.budgets, trees.unscorable, trees.success
    num_groups = len(budgets)
    N = ctx.group_size
    leaves = [N] * num_groups
    scorable_base = [not all(base_unscorable[g * N : (g + 1) * N]) for g in range(num_groups)]
    base_pass = [any(base_success[g * N : (g + 1) * N]) for g in range(num_groups)]
    correct_any, scorable_any = list(base_pass), list(scorable_base)
    n = 0
    for block in forest.blocks:
        if block.kind == "branch":
            leaves[block.group] += 1
            if not math.isnan(block.reward):
                scorable_any[block.group] = True
            correct_any[block.group] = correct_any[block.group] or bool(trees.branch_success[n])
            n += 1
    num_blocks = [0] * num_groups
    for block in forest.blocks:
        num_blocks[block.group] += 1
    if trees.model_tokens is not None:  # multi-turn: the model's tokens only (tool results are not generated)
        base_lengths, branch_lengths, leaf_lengths = trees.model_tokens
        base_tokens, branch_tokens = sum(base_lengths), sum(branch_lengths)
        leaf_lengths = list(base_lengths) + list(leaf_lengths)
    else:
        base_tokens = sum(length for _, _, length in records)
        branch_tokens = sum(trees.skeletons.branch_lengths)
        leaf_lengths = [length for _, _, length in records] + forest.branch_response_lengths
    total_leaves = sum(leaves)
    defined_v = [v for v in trees.v_root if not math.isnan(v)]
    ctx.metric("datpo/leaves_per_prompt", total_leaves / num_groups)
    ctx.metric("datpo/k_hat", sum(k for k, _ in budgets) / num_groups)
    ctx.metric("datpo/b_hat", sum(b for _, b in budgets) / num_groups)
    if defined_v:
        ctx.metric("datpo/v_root", sum(defined_v) / len(defined_v))
    if any(scorable_any):
        pass_rate = sum(c for c, s in zip(correct_any, scorable_any) if s) / sum(scorable_any)
        ctx.metric("datpo/pass_rate", pass_rate)
    if any(scorable_base):
        base_pass_rate = sum(p for p, s in zip(base_pass, scorable_base) if s) / sum(scorable_base)
        ctx.metric("datpo/base_pass_rate", base_pass_rate)
    unscorable_branches = sum(1 for block in forest.blocks if block.kind == "branch" and math.isnan(block.reward))
    ctx.metric("datpo/unscorable_rate", (sum(base_unscorable) + unscorable_branches) / total_leaves)
    ctx.metric("datpo/blocks_per_prompt", sum(num_blocks) / num_groups)
    ctx.metric("datpo/forks_per_rollout", sum(len(forks) for _, forks, _ in records) / len(records))
    ctx.metric("datpo/tokens_per_leaf", (base_tokens + branch_tokens) / total_leaves)
    ctx.metric("datpo/leaf_length", sum(leaf_lengths) / total_leaves)
    scored_branches = [r for r in trees.branch_rewards if not math.isnan(r)]
    if scored_branches:
        ctx.metric("datpo/branch_reward", sum(scored_branches) / len(scored_branches))
    if ctx.args.use_diversity and bool(credit.has_siblings.any()):
        ctx.metric("datpo/sibling_diversity", float(credit.diversity[credit.has_siblings].mean()))


def log_fork_coverage(ctx, fork_counts) -> None:
    """``datpo/no_fork_rate``: base rollouts the method wants to branch from (scorable, K̂ > 0) that got no
    fork; ``datpo/fork_fallback_rate``: those whose forks came from the token-entropy fallback."""
    args = ctx.args
    wanted = [(has, fallback) for should, has, fallback in fork_counts if should]
    if not wanted:
        return
    no_fork = sum(1 for has, _ in wanted if not has) / len(wanted)
    fallback = sum(1 for _, fb in wanted if fb) / len(wanted)
    ctx.metric("datpo/no_fork_rate", no_fork)
    ctx.metric("datpo/fork_fallback_rate", fallback)
    if no_fork > 0:
        one_sentence = args.fork_method == "sent_entropy" and args.fork_position == "before_token"
        if one_sentence and args.fork_fallback == "none":
            fix = ("with fork_position='before_token' rollouts with a single sentence have no sentence start "
                   "after token 0; set fork_position='after_token' (the paper: fork after the first token) or "
                   "fork_fallback='tok_entropy' (fork them at their highest-entropy tokens)")
        else:
            fix = "rollouts shorter than 2 tokens cannot fork; check max_completion_length and the prompt format"
        ctx.warn(
            "datpo_no_fork",
            f"{ctx.speaker('trees')}: {no_fork:.0%} of the base rollouts that should branch (unsolved prompt, "
            "scorable) got no "
            f"fork, so their prompt grows no tree from them (logged every step as datpo/no_fork_rate): {fix}.",
        )
