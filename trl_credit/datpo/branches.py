"""DATPO's phase 2: the branches of every fork, generated through TRL's ``_generate_single_turn`` (every backend),
shared out across processes, and their rewards through TRL's reward path. Collective calls."""

from __future__ import annotations

import math

import torch

from trl_credit.core.collectives import fill_rows
from trl_credit.generation.hooks import runs_hf_generate
from .forest import TreeBatch, sampled_length

__all__ = ["generate_branches", "budget_bands", "branch_rewards"]


def generate_branches(ctx, fork_requests: list[tuple[list[int], int, int]]):
    """B̂ continuations of every local fork ``(prompt + prefix ids, B̂, new-token budget)``, in fork order; returns
    ``(completion ids, sampling log-probs or None)`` with B̂ consecutive rows per fork, each at most its fork's
    budget long.

    A collective call. The forks of all processes are gathered and shared out across processes, so the process
    that holds an unsolved prompt's tree does not generate all of it while the others wait; the results go back
    to the process that owns the fork (it trains those rows). The B̂ branches of one fork are consecutive rows of
    one ``_generate_single_turn(..., num_generations=B̂)`` call, as TRL lays out its N rollouts per prompt: vLLM
    server mode then samples them as ``n = B̂`` of one prompt and vLLM's prefix cache reuses the fork's prefill.
    Every process makes the same calls with the same row count (vLLM server mode slices its answer by process),
    padding with one-token filler forks.

    Budgets: one generation call takes one ``max_new_tokens``. The forks of each B̂ are sorted by budget and dealt
    out round-robin, in bands where the budget at most halves (one or more calls per band), so the forks of one
    call (on every process) have neighbouring budgets; the call runs with the largest of them (the same on every
    process, as vLLM server mode needs one sampling setting per call) and each branch is cut to its own fork's
    budget afterwards. With HF ``generate`` each row also stops at its own budget, the B̂ copies of a fork are
    prefilled once and finished rows are dropped from the call once fewer than half are running
    (``hf_generate_hooks``), so nothing is generated past a budget, a fork's prefix is read once, as vLLM's
    prefix cache reads it, and a call's tail does not compute rows that ended long before, as vLLM's scheduler
    does not.
    """
    num_processes, process = ctx.num_processes, ctx.process_index
    counts = ctx.gather_counts(len(fork_requests))
    if sum(counts) == 0:
        return [], None
    all_forks = ctx.gather_rows(
        [(list(map(int, prefix)), int(b_hat), int(budget)) for prefix, b_hat, budget in fork_requests]
    )
    chunk = ctx.args.branch_chunk_size
    done: list[tuple[int, list[int], list | None]] = []  # (global fork index, B̂ completions, log-probs)
    any_logprobs = True
    generated = kept = 0  # tokens this process generated for real forks, and kept after the cut to their budget
    groups = budget_bands(all_forks)
    dealt = 0  # forks dealt so far: each group's deal starts at the next process, so the odd ones even out
    # HF generate pads the rows that stopped at their own budget to the call's length (TRL cuts only after an
    # EOS): that padding was never generated. vLLM and continuous batching return only sampled tokens.
    pads_rows = runs_hf_generate(ctx.sampling)
    pad_id = ctx.rows.pad_token_id
    for b_hat, forks in groups:
        mine = forks[(process - dealt) % num_processes :: num_processes]
        dealt += len(forks)
        most = math.ceil(len(forks) / num_processes)
        per_call = most if not chunk else max(1, min(most, chunk // b_hat))
        filler = all_forks[forks[0]][0][:1]
        for call in range(math.ceil(most / per_call)):
            call_forks = mine[call * per_call : (call + 1) * per_call]
            # the call's forks on all processes are forks[call·per_call·P : (call+1)·per_call·P] (the first
            # exists: it is the call's first fork on the process the deal started at) and the first has the
            # largest budget
            call_budget = all_forks[forks[call * per_call * num_processes]][2]
            rows = fill_rows([all_forks[k][0] for k in call_forks for _ in range(b_hat)], per_call * b_hat, filler)
            # HF generate: each row stops at its own fork's budget (filler rows after one token), the B̂
            # copies of a fork share one prefill, and once fewer than half of the rows are running the call goes
            # on with those alone (branches end with EOS anywhere in their budget)
            row_budgets = fill_rows([all_forks[k][2] for k in call_forks for _ in range(b_hat)], len(rows), 1)
            completion_ids, logprobs = ctx.generate_call(rows, b_hat, max_new_tokens=call_budget,
                                                         row_budgets=row_budgets, compact_rows=True)
            any_logprobs = any_logprobs and logprobs is not None
            for n, k in enumerate(call_forks):
                piece = slice(n * b_hat, (n + 1) * b_hat)
                budget = all_forks[k][2]
                generated += sum(sampled_length(ids, budget, pad_id if pads_rows else None)
                                 for ids in completion_ids[piece])
                kept += sum(min(len(ids), budget) for ids in completion_ids[piece])
                done.append((
                    k,
                    [list(map(int, ids))[:budget] for ids in completion_ids[piece]],
                    [list(lp)[:budget] for lp in logprobs[piece]] if logprobs is not None else None,
                ))
    # generated past a fork's budget because a call runs with the largest budget of its forks (waste)
    ctx.metric("datpo/branch_tokens_past_budget", (generated - kept) / max(generated, 1))
    results = {k: (ids, lps) for k, ids, lps in ctx.gather_rows(done)}
    first = sum(counts[:process])
    branch_ids: list[list[int]] = []
    branch_logprobs: list[list[float]] | None = [] if any_logprobs else None
    for k in range(first, first + counts[process]):
        ids, lps = results[k]
        branch_ids.extend(ids)
        if branch_logprobs is not None:
            if lps is None:
                branch_logprobs = None
            else:
                branch_logprobs.extend(lps)
    return branch_ids, branch_logprobs


def budget_bands(all_forks: list[tuple[list[int], int, int]]) -> list[tuple[int, list[int]]]:
    """The forks (indices into ``all_forks``: (prefix, B̂, budget)) grouped for generation calls: per B̂, longest
    budget first (ties keep fork order), in bands where the budget at most halves. A call runs as many steps as its
    longest budget, so forks of very different budgets in one call would generate (and, with HF generate, compute)
    far past the short ones' budgets; at most log2(max_completion_length) bands per B̂."""
    groups = []
    for b_hat in sorted({b for _, b, _ in all_forks}):
        ordered = sorted((k for k, (_, b, _) in enumerate(all_forks) if b == b_hat), key=lambda k: -all_forks[k][2])
        band = [ordered[0]]
        for k in ordered[1:]:
            if 2 * all_forks[k][2] < all_forks[band[0]][2]:
                groups.append((b_hat, band))
                band = []
            band.append(k)
        groups.append((b_hat, band))
    return groups


def branch_rewards(ctx, trees: TreeBatch) -> torch.Tensor:
    """``rewards_per_func`` of every branch of every process (process order), scored on prompt + prefix + branch
    (the whole response: docs/datpo.md#branches) by TRL's reward path (``ctx.score``: ``rewards_of_extra_rows``; a process without
    branches pads with its first base row). Multi-turn leaves pass their messages and environments
    (docs/datpo.md#multi-turn-rollouts)."""
    if max(trees.branch_counts) == 0:
        return torch.zeros(0, len(ctx.reward_func_names), device=ctx.device)
    rows = [i for i, _ in trees.branch_meta]
    responses = [
        trees.completion_ids[i][: trees.forks[i][j]] + ids for (i, j), ids in zip(trees.branch_meta, trees.branch_ids)
    ]
    prompts, filler, turns = trees.prompts, (trees.inputs[0], trees.prompts[0], trees.prompt_ids[0],
                                             trees.completion_ids[0]), {}
    if trees.episodes is not None:
        # multi-turn (datpo/multiturn.py): each leaf's messages (the prefix's, then the branch's) and, with an
        # environment_factory, the branch's own environment (get_reward reads it); the prompts are TRL's (with the
        # environment's reset() observation)
        environments = ctx.environments
        filler = (trees.inputs[0], prompts[0], trees.prompt_ids[0], trees.completion_ids[0],
                  trees.episodes[0].messages, None if environments is None else environments[0])
        if ctx.sampling.tool_loop:
            turns["completions"] = trees.branch_messages
        if environments is not None:
            turns["environments"] = trees.branch_environments
    per_process = ctx.score(
        [trees.inputs[i] for i in rows],
        [prompts[i] for i in rows],
        [trees.prompt_ids[i] for i in rows],
        responses,
        filler=filler,
        counts=trees.branch_counts,
        **turns,
    )
    return torch.cat(per_process)
