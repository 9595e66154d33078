"""What each block of a DATPO forest is credited with (docs/datpo.md#block-advantages): A_base per tree (Eq. 3), the
sibling-diversity bonus from embeddings of the blocks' texts (Eq. 4, 8), and, with ``mask_truncated_completions``,
the forks whose value rests on a finished leaf. Collective calls (embeddings and truncation flags are gathered)."""

from __future__ import annotations

import math

import torch

from trl_credit.core.steps import model_turns_text
from trl_credit.tasks.rewards import completion_text
from .diversity import POSITIVE_TOLERANCE, bonus_gate, sibling_diversity
from .embedding import BlockEmbedder
from .forest import ForestCredit, LeafOutcomes, TreeBatch, is_truncated
from .tree import ROOT

__all__ = ["block_credit", "embedded_sibling_diversity", "grounded_forks", "tree_leaves"]


def block_credit(ctx, trees: TreeBatch, alpha: float, embedder=None, rewards=None) -> ForestCredit:
    """A_base and the gated bonus of every block (``embedder`` embeds the blocks' texts with ``use_diversity``). The
    bonus is kept apart from A_base: α is applied per optimizer step in the loss (``parts.BlockCredit.loss``: the
    schedule runs over optimizer steps, also when a generation batch serves several of them: num_iterations > 1 or
    steps_per_generation > gradient_accumulation_steps). ``rewards`` (one per block, as ``Forest.rewards``; default
    the leaf rewards) are the leaf outcomes A_base aggregates, e.g. re-weighted by a modifier."""
    args = ctx.args
    forest = trees.forest
    rewards = forest.rewards() if rewards is None else rewards
    base = forest.block_advantages(args.value_estimate, rewards)
    scale = max([1.0] + [abs(r) for r in rewards if r is not None and math.isfinite(r)])
    gate = bonus_gate(base, on_all_blocks=args.diversity_on_all_blocks, tolerance=POSITIVE_TOLERANCE * scale)
    # An unscorable block keeps advantage 0, and so does every block of a tree with a ±inf leaf reward.
    infinite = {block.group for block in forest.blocks if block.reward is not None and math.isinf(block.reward)}
    no_bonus = [block.unscorable or block.group in infinite for block in forest.blocks]
    gate[torch.tensor(no_bonus, dtype=torch.bool)] = 0.0
    diversity = torch.zeros_like(base)
    has_siblings = torch.zeros(len(base), dtype=torch.bool)
    if args.use_diversity:
        # diversity_embedding="gated": only the sibling groups where some block gets the bonus need embeddings (a
        # block's Div reads its whole group); the others' Div is multiplied by a zero gate
        groups = None
        if args.diversity_embedding == "gated":
            groups = {forest.blocks[b].sibling_key for b in gate.nonzero().flatten().tolist()}
        diversity, has_siblings = embedded_sibling_diversity(ctx, trees, embedder, groups)
    grounded = grounded_forks(ctx, trees) if ctx.rows.mask_truncated_completions else None
    return ForestCredit(base, gate * diversity, alpha, diversity, has_siblings, grounded)


def embedded_sibling_diversity(ctx, trees: TreeBatch, embedder, groups: set | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Embed this process's blocks that have structural siblings (``embedder``: a :class:`~.embedding.BlockEmbedder`,
    or a model with ``encode`` that one wraps for this call), gather the embeddings, compute Div; returns
    (Div, has siblings) per block. Unscorable blocks are no one's siblings (they are left out of every statistic).
    ``groups``: the sibling keys to embed (None: all); a block of another group gets Div 0 and no siblings."""
    args = ctx.args
    forest = trees.forest
    keys = [None if block.unscorable else block.sibling_key for block in forest.blocks]
    if groups is not None:
        keys = [key if key in groups else None for key in keys]
    if not args.diversity_root_siblings:
        keys = [None if forest.blocks[b].start == ROOT else key for b, key in enumerate(keys)]
    sizes: dict = {}
    for key in keys:
        if key is not None:
            sizes[key] = sizes.get(key, 0) + 1
    local = [b for b in forest.by_process[ctx.process_index] if keys[b] is not None and sizes[keys[b]] > 1]
    texts = []
    tokenizer = ctx.tokenizer if local else None
    for b in local:
        kind, row, start, end = forest.blocks[b].source
        tokens = trees.completion_ids[row][start:end] if kind == "base" else trees.branch_ids[row][start:end]
        if trees.episodes is not None:  # multi-turn: the model's text only, its turns joined by newlines
            mask = trees.episodes[row].model_mask if kind == "base" else trees.branch_model_masks[row]
            texts.append(model_turns_text(tokenizer, tokens, mask[start:end]))
            continue
        texts.append(tokenizer.decode(tokens, skip_special_tokens=True))
    keep = [b for b, text in zip(local, texts) if text.strip()]
    keep_texts = [text for text in texts if text.strip()]
    local_embeddings = []
    if keep_texts:
        # each distinct text once, cached texts and pads skipped (BlockEmbedder, docs/datpo.md#sibling-diversity)
        if not isinstance(embedder, BlockEmbedder):
            embedder = BlockEmbedder(embedder, args.embedding_batch_size)
        encoded = embedder.embed(keep_texts)
        local_embeddings = [(b, vector.tolist()) for b, vector in zip(keep, encoded)]
    gathered = ctx.gather_rows(local_embeddings)
    if not gathered:
        return torch.zeros(len(keys), dtype=torch.float64), torch.zeros(len(keys), dtype=torch.bool)
    dim = len(gathered[0][1])
    embeddings = torch.zeros(len(keys), dim, dtype=torch.float64)
    embedded = torch.zeros(len(keys), dtype=torch.bool)
    for b, vector in gathered:
        embeddings[b] = torch.tensor(vector, dtype=torch.float64)
        embedded[b] = True
    # blocks without text (or not embedded) neither get nor give diversity
    final_keys = [key if embedded[b] else None for b, key in enumerate(keys)]
    diversity = sibling_diversity(embeddings, final_keys)
    counts: dict = {}
    for key in final_keys:
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    has_siblings = torch.tensor([key is not None and counts[key] > 1 for key in final_keys], dtype=torch.bool)
    return diversity, has_siblings


def grounded_forks(ctx, trees: TreeBatch) -> set:
    """With ``mask_truncated_completions``: the forks whose value V (``value_estimate``) averages over at least one
    finished (not truncated) scorable leaf. A block ending at any other fork would learn only from truncated
    leaves. A collective call (the truncation flags of every process's leaves are gathered)."""
    base_truncated, branch_truncated = _truncated_leaves(ctx, trees)
    offsets = _branch_offsets(trees)
    # V of these leaf values is the share of finished leaves among those V averages over (unscorable leaves stay
    # NaN: they count in no value), so a fork is grounded when it is > 0
    finished = []
    for block in trees.forest.blocks:
        reward, rollout = block.reward, block.rollout
        if reward is None or math.isnan(reward):
            finished.append(reward)
            continue
        if rollout[0] == "base":
            truncated = base_truncated[rollout[1]]
        else:
            truncated = branch_truncated[offsets[rollout[1]] + rollout[2]]
        finished.append(0.0 if truncated else 1.0)
    return trees.forest.grounded_forks(finished, ctx.args.value_estimate)


def _truncated_leaves(ctx, trees: TreeBatch) -> tuple[list[bool], list[bool]]:
    """Whether each base rollout and each branch (global, process order) ends without EOS (TRL's truncation test).
    A collective call."""
    settings = ctx.rows
    eos_and_pad = [*settings.eos_token_ids, settings.pad_token_id]
    base_truncated = ctx.gather_rows([is_truncated(ids, eos_and_pad) for ids in trees.completion_ids])
    branch_truncated = ctx.gather_rows([is_truncated(ids, eos_and_pad) for ids in trees.branch_ids])
    return base_truncated, branch_truncated


def _branch_offsets(trees: TreeBatch) -> list[int]:
    """The global index of each process's first branch."""
    counts = trees.branch_counts
    return [sum(counts[:q]) for q in range(len(counts))]


def tree_leaves(ctx, trees: TreeBatch) -> LeafOutcomes:
    """Every leaf of the forest with its reward, the verifier's verdict, whether its last block reaches the loss
    (``mask_truncated_completions`` masks a truncated leaf's) and, for this process's leaves, the full completion
    (a branch: prefix + branch) decoded as TRL decodes completions for the reward functions, with its prompt. A
    collective call with ``mask_truncated_completions`` (the truncation flags are gathered)."""
    forest = trees.forest
    offsets = _branch_offsets(trees)
    masked = ctx.rows.mask_truncated_completions
    base_truncated, branch_truncated = _truncated_leaves(ctx, trees) if masked else (None, None)
    blocks, groups, rewards, correct, in_loss = [], {}, [], [], []
    for b, block in enumerate(forest.blocks):
        if block.end is not None:
            continue
        if block.rollout[0] == "base":
            row = block.rollout[1]
            success, truncated = trees.success[row], masked and base_truncated[row]
        else:
            _, q, n = block.rollout
            success, truncated = trees.branch_success[offsets[q] + n], masked and branch_truncated[offsets[q] + n]
        groups.setdefault(block.group, []).append(len(blocks))
        blocks.append(b)
        rewards.append(block.reward)
        correct.append(bool(success))
        in_loss.append(not truncated)
    leaf_of = {b: leaf for leaf, b in enumerate(blocks)}
    local, responses, rows, turns = [], [], [], []
    for b in forest.by_process[ctx.process_index]:
        if b not in leaf_of:
            continue
        kind, index, _, _ = forest.blocks[b].source
        if kind == "base":
            row, response = index, trees.completion_ids[index]
        else:
            row, fork = trees.branch_meta[index]
            response = trees.completion_ids[row][: trees.forks[row][fork]] + trees.branch_ids[index]
        if trees.episodes is not None:  # multi-turn: the leaf's messages and model mask (prefix + branch)
            episode = trees.episodes[row]
            turns.append((episode.messages, episode.model_mask) if kind == "base" else (
                trees.branch_messages[index],
                episode.model_mask[: trees.forks[row][fork]] + trees.branch_model_masks[index]))
        local.append(leaf_of[b])
        responses.append(response)
        rows.append(row)
    texts = []
    if local and trees.episodes is not None:
        # multi-turn: the model's text only (Cue-GRPO's cues, docs/multiturn.md#cue-grpo): the assistant turns of the
        # leaf's messages, or without TRL's messages its model turns decoded, joined by newlines
        texts = [completion_text(messages) if messages else model_turns_text(ctx.tokenizer, response, mask)
                 for (messages, mask), response in zip(turns, responses)]
    elif local:
        prompts = [trees.prompts[row] for row in rows]
        completions = ctx.decode_completions(prompts, [trees.prompt_ids[row] for row in rows], responses)
        texts = [completion_text(c) for c in completions]
    return LeafOutcomes(
        blocks=blocks,
        groups=groups,
        rewards=torch.tensor(rewards, dtype=torch.float64),
        correct=torch.tensor(correct, dtype=torch.bool),
        in_loss=torch.tensor(in_loss, dtype=torch.bool),
        local_texts={leaf: (text, trees.prompts[row]) for leaf, text, row in zip(local, texts, rows)},
        rows=[forest.blocks[b].rollout for b in blocks],
        unit_rows=[block.rollout for block in forest.blocks],
    )
