"""DATPO's training batch: one row per base rollout and per branch, every token with its block's advantage
(docs/datpo.md#training-rows). What any rollout that builds rows needs (filler rows, padding, the old/ref log-probs and
vLLM importance ratios of rows TRL did not score) is the core's, through the batch context
(trl_credit/core/built_rows.py); this module keeps DATPO's decisions: block advantages per token, and which blocks of a
truncated leaf keep their loss. Collective calls: every process runs the same scoring passes and ends with the same
row count."""

from __future__ import annotations

import torch

from trl_credit.core.built_rows import sampling_logprobs_rows
from trl_credit.core.row_count import NUM_ROWS
from .forest import ForestCredit, TreeBatch, is_truncated

__all__ = ["training_rows"]


def training_rows(ctx, base: dict, trees: TreeBatch, credit: ForestCredit) -> dict:
    """This process's rows of the training batch: its base rollouts (TRL's rows, TRL's old/ref/sampling values)
    then its branches (prompt + prefix, branch), every token with its block's advantage (docs/datpo.md#training-rows),
    then empty rows up to the largest row count of any process."""
    prompt_ids_list, completion_ids_list = trees.prompt_ids, trees.completion_ids
    branch_prefixes, branch_ids, branch_logprobs = trees.branch_prefixes, trees.branch_ids, trees.branch_logprobs
    device = ctx.device
    n_base, n_branch = len(completion_ids_list), len(branch_ids)
    # TRL's _compute_loss gathers per-row tensors (clip-ratio metrics), so every process needs the same row
    # count: the core appends filler rows outside the loss mask (`ctx.pad_built_rows`). They add nothing to the loss
    # (see `parts.Trees.loss` for the loss types that average over rows) or to num_items_in_batch.
    completion_rows = completion_ids_list + branch_ids
    p_ids, p_mask, c_ids, c_mask, row_counts = ctx.pad_built_rows(prompt_ids_list + branch_prefixes, completion_rows)
    n_rows = c_ids.size(0)
    width = c_ids.size(1)
    # every generated token gets the advantage of the one block it belongs to (docs/datpo.md#block-advantages, docs/datpo.md#training-rows)
    token_base = torch.zeros(n_rows, width, dtype=torch.float32)
    token_bonus = torch.zeros(n_rows, width, dtype=torch.float32)
    for b in trees.forest.by_process[ctx.process_index]:
        kind, row, start, end = trees.forest.blocks[b].source
        r = row if kind == "base" else n_base + row
        token_base[r, start:end] = float(credit.base[b])
        token_bonus[r, start:end] = float(credit.bonus[b])
    tool_mask = None
    if trees.episodes is not None:
        # multi-turn (docs/datpo.md#multi-turn-rollouts): TRL's tool_mask of every row, base rows' TRL's own, branch
        # rows' from the resumed tool loop (filler rows 1, as TRL pads it); a tool result gets no advantage
        tool_mask = torch.ones(n_rows, width, dtype=torch.long)
        for r, mask in enumerate([e.model_mask for e in trees.episodes] + list(trees.branch_model_masks)):
            tool_mask[r, : len(mask)] = torch.tensor(mask, dtype=torch.long)
        token_base = token_base * tool_mask
        token_bonus = token_bonus * tool_mask
    restored = []  # (base row, tokens): leading blocks of a truncated base rollout that keep their loss
    settings = ctx.rows
    if settings.mask_truncated_completions:
        # A truncated leaf has no final answer of its own: its last block is masked, and a branch (one block)
        # whole. The earlier blocks of a truncated base rollout are valued by the leaves under their end fork;
        # they keep their loss while those values rest on a finished leaf (`grounded`), as a run from the start
        # of the row (a masked block in the middle would also hide its tokens from the attention of the later
        # ones). With every leaf truncated nothing is trained, as in GRPO.
        eos_and_pad = [*settings.eos_token_ids, settings.pad_token_id]
        for r, ids in enumerate(completion_rows):
            if not is_truncated(ids, eos_and_pad):
                continue
            keep = 0
            if r < n_base:
                for j, fork in enumerate(trees.forks[r]):
                    if (trees.first_row + r, j) not in credit.grounded:
                        break
                    keep = fork
            c_mask[r, keep:] = 0
            if keep:
                restored.append((r, keep))
    output = {
        "prompt_ids": p_ids,
        "prompt_mask": p_mask,
        "completion_ids": c_ids,
        "completion_mask": c_mask,
        # A_base + α·bonus at this step (what TRL's completion table and callers see); the loss
        # (`parts.BlockCredit.loss`) recomputes it with α of the optimizer step it trains
        "advantages": (token_base + credit.alpha * token_bonus).to(device),
        "datpo_base_advantages": token_base.to(device),
        "datpo_diversity_bonus": token_bonus.to(device),
        # real rows of the generation batch on all processes, for the loss types that average over rows
        NUM_ROWS: torch.tensor(sum(row_counts), device=device),
    }
    loss_mask = c_mask
    if tool_mask is not None:
        output["tool_mask"] = tool_mask.to(device)
        loss_mask = c_mask * output["tool_mask"]  # what TRL's loss and its importance ratio mask (trl 1.16)

    def merge(base_values: torch.Tensor, branch_values: torch.Tensor | None, fill: float = 0.0):
        # base rows keep TRL's values (completion right-padded, so positions line up); branch rows get theirs
        cols = width if base_values.size(1) != 1 else 1
        merged = torch.full((n_rows, cols), fill, dtype=base_values.dtype, device=device)
        take = min(cols, base_values.size(1))
        merged[:n_base, :take] = base_values[:, :take]
        if branch_values is not None and n_branch:
            take = min(cols, branch_values.size(1))
            merged[n_base : n_base + n_branch, :take] = branch_values[:, :take].to(base_values.dtype)
        return merged

    # Rows scored here: the branches, and the kept blocks of truncated base rollouts, for which TRL's old/ref
    # log-probs were computed with the whole completion masked out of attention. Each is scored on prompt +
    # its kept tokens, the context the loss sees them in.
    scored_prompts = branch_prefixes + [prompt_ids_list[r] for r, _ in restored]
    scored_completions = branch_ids + [completion_ids_list[r][:keep] for r, keep in restored]

    def merge_scored(base_values: torch.Tensor, scored: torch.Tensor | None):
        merged = merge(base_values, None if scored is None else scored[:n_branch])
        for k, (r, keep) in enumerate(restored):
            merged[r, :keep] = scored[n_branch + k, :keep].to(merged.dtype)
        return merged

    branch_mask = loss_mask[n_base : n_base + n_branch]
    need_old = "old_per_token_logps" in base
    if need_old:
        old = ctx.score_rows("policy", scored_prompts, scored_completions)
        output["old_per_token_logps"] = merge_scored(base["old_per_token_logps"], old)
    if "ref_per_token_logps" in base:
        ref = ctx.score_rows("reference", scored_prompts, scored_completions)
        output["ref_per_token_logps"] = merge_scored(base["ref_per_token_logps"], ref)
    sampling = None
    if "sampling_per_token_logps" in base:
        if branch_logprobs is not None and n_branch:
            # vLLM's sampling log-probs of the branch tokens; None (unscorable) -> NaN, as TRL does
            sampling = sampling_logprobs_rows(branch_logprobs, width, device)
        output["sampling_per_token_logps"] = merge(base["sampling_per_token_logps"], sampling)
    if "importance_sampling_ratio" in base:
        branch_ratio = None
        if n_branch:
            if sampling is None or not need_old:
                raise RuntimeError("vLLM importance sampling needs sampling log-probs for the branch rollouts")
            branch_ratio = ctx.importance_sampling_ratio(
                output["old_per_token_logps"][n_base : n_base + n_branch], sampling, branch_mask
            )
        ratio = merge(base["importance_sampling_ratio"], branch_ratio, fill=1.0)
        if restored:  # TRL's ratio of a masked row is 1; the kept blocks get theirs from the new old log-probs
            rows = torch.tensor([r for r, _ in restored], device=device)
            ratio[rows] = ctx.importance_sampling_ratio(
                output["old_per_token_logps"][rows], output["sampling_per_token_logps"][rows], loss_mask[rows]
            )[:, : ratio.size(1)].to(ratio.dtype)
        output["importance_sampling_ratio"] = ratio
    output["num_items_in_batch"] = ctx.gather(loss_mask.sum()).sum()
    return output

