"""DATPO inside multi-turn rollouts (TRL's ``tools`` or ``environment_factory``; docs/datpo.md#multi-turn-rollouts,
docs/multiturn.md#datpo-trees). The paper's trees are single-turn; these rules are ours.

Phase 1's base rollouts are TRL's own, tool loop included: each is an
:class:`~trl_credit.core.tool_loop.Episode` (TRL's token ids, ``tool_mask``, messages and sampling log-probs). Then:

- **Forks lie inside the model's turns** (``forks.select_forks(..., model_mask=)``): a fork replaces one of the
  model's tokens, so its prefix ``τ[:f]`` never ends inside a tool result; the entropy methods' fork token is a model
  token, and sentences are split per model turn (:func:`model_sentence_spans`), so a tool result's tokens, whose
  entropies are not the model's choices, take part in no sentence or token ranking.
- **A branch** is the model's continuation of the prefix (phase 2's one collective generation call per budget band,
  :func:`~.branches.generate_branches`, within the fork's budget), then TRL's tool loop resumed from there
  (:func:`resume_branches`, ``core.tool_loop.continue_tool_loop``): a tool call in the branch is executed, its result
  appended, the model goes on. With ``tools`` the prefix's tool results are reused as recorded; with an
  ``environment_factory`` each branch runs in an environment of its own (``ctx.fresh_environments``), replayed to the
  fork (``reset()``, then the prefix's tool calls in order: :func:`replay_forks`); a fork whose replay gives other
  results than the base rollout recorded is skipped (no branch grows from a wrong prefix state), warned once and
  counted in ``datpo/replay_mismatch_rate`` every step.
- **Rewards** of a branch read its whole completion (the prefix's messages, then the branch's) and, with an
  environment, the branch's own environment (an environment-owned ``get_reward`` included).
- **Rows**: a branch row's completion is the branch, with TRL's ``tool_mask`` (0 on its tool results); base rows keep
  TRL's. Tool-result tokens get no advantage, are left out of the loss and of every count (``rows.training_rows``),
  of the diversity bonus's block texts (``credit``) and of the token metrics (``tree_metrics``).
"""

from __future__ import annotations

from trl_credit.core.steps import model_turn_spans
from trl_credit.core.tool_loop import Episode, Resume
from .forks import sentence_spans, token_char_offsets

__all__ = ["base_episodes", "model_sentence_spans", "replay_forks", "resume_branches", "model_tokens"]


def base_episodes(ctx, generated) -> list[Episode] | None:
    """This process's base rollouts as episodes (``generated``: what TRL's ``_generate`` returned, ``(prompt_ids,
    completion_ids, tool_mask, completions, logprobs, ...)``), when TRL's tool loop ran or an environment was reset for
    them; None for a single-turn batch. ``tool_mask`` is TRL's own (not yet zeroed on truncated rows, as
    ``mask_truncated_completions`` does in TRL's batch: DATPO decides per block which tokens of a truncated rollout
    keep their loss)."""
    if not ctx.sampling.tool_loop and ctx.environments is None:
        return None
    _, completion_ids, tool_mask, completions, logprobs, *_ = generated
    episodes = []
    for i, ids in enumerate(completion_ids):
        mask = [1] * len(ids) if tool_mask is None else [int(v) for v in tool_mask[i]]
        # TRL's messages when its tool loop ran (what a resumed loop continues); else none (the tokens are decoded)
        messages = list(completions[i]) if ctx.sampling.tool_loop and isinstance(completions[i], list) else []
        episodes.append(Episode(list(ids), mask, messages, None if logprobs is None else list(logprobs[i])))
    return episodes


def model_sentence_spans(tokenizer, ids, model_mask) -> list[tuple[int, int]]:
    """The sentences of a multi-turn completion (``forks.sentence_spans``), split inside each model turn: token spans
    over the model's tokens only (a tool result is in no sentence and no sentence spans one)."""
    spans = []
    for start, end in model_turn_spans(model_mask):
        spans += [(start + a, start + b) for a, b in sentence_spans(*token_char_offsets(tokenizer, ids[start:end]))]
    return spans


def replay_forks(ctx, trees) -> None:
    """With an ``environment_factory``: an environment per branch to come (B̂ per fork, ``ctx.fresh_environments``),
    each replayed to its fork (``ctx.replay_environment`` on the prefix's messages). A fork any of whose replays
    differs from the base rollout's recorded results is dropped from ``trees.forks`` (no branch from a wrong prefix
    state). Sets ``trees.branch_environments`` (in branch order) and logs ``datpo/replay_mismatch_rate`` (the share
    of replayed forks skipped, all processes) every step, with a warning once."""
    plans = []  # (row, fork, B̂) per local fork
    for i, forks in enumerate(trees.forks):
        _, b_hat = trees.budgets[(trees.first_row + i) // ctx.group_size]
        plans += [(i, fork, b_hat) for fork in forks]
    environments = ctx.fresh_environments([trees.inputs[i] for i, _, b_hat in plans for _ in range(b_hat)])
    kept, cursor, mismatches = [[] for _ in trees.forks], 0, 0
    trees.branch_environments = []
    for i, fork, b_hat in plans:
        mine = environments[cursor: cursor + b_hat]
        cursor += b_hat
        prefix, _ = trees.episodes[i].prefix(fork)
        if all(ctx.replay_environment(env, trees.inputs[i], prefix.messages) for env in mine):
            kept[i].append(fork)
            trees.branch_environments += mine
        else:
            mismatches += 1
    trees.forks = kept
    replayed, skipped = (sum(column) for column in zip(*ctx.gather_rows([(len(plans), mismatches)])))
    ctx.metric("datpo/replay_mismatch_rate", skipped / replayed if replayed else 0.0)
    if skipped:
        ctx.warn(
            "datpo/replay_mismatch",
            f"{ctx.speaker('trees')}: {skipped} of {replayed} forks were skipped: replaying the base rollout's tool "
            "calls on a fresh environment (reset(), then the same calls in order) gave other results than the "
            "rollout got, so the environment is not deterministic and its state at the fork cannot be rebuilt. Those "
            "forks grow no branches (datpo/replay_mismatch_rate). Make reset() and the tools deterministic in the "
            "row's columns (seed any randomness from them), or train this environment with GRPO's rollouts "
            "(CreditTrainer with rollout='groups').",
        )


def resume_branches(ctx, trees, continuations, logprobs):
    """Each branch to its end (module docstring): its continuation (``continuations[n]``, generated from prompt +
    prefix, log-probs ``logprobs[n]`` or None) handed to TRL's tool loop from the fork's prefix, in the branch's
    environment (``trees.branch_environments``; none with ``tools`` alone). Without a tool loop (an environment with
    no tools) the continuation is the branch. Sets ``trees.branch_model_masks`` and ``trees.branch_messages`` (the
    whole completion's messages, what reward functions get) and returns the branches' ids and log-probs, each after
    its fork."""
    environments = trees.branch_environments or [None] * len(continuations)
    resumes, forks = [], []
    for n, ((i, j), ids) in enumerate(zip(trees.branch_meta, continuations)):
        fork = trees.forks[i][j]
        prefix, turn_start = trees.episodes[i].prefix(fork)
        resumes.append(Resume(row=trees.inputs[i], prompt=trees.prompts[i], prompt_ids=trees.prompt_ids[i],
                              prefix=prefix, turn_start=turn_start, continuation=list(ids),
                              continuation_logprobs=None if logprobs is None else list(logprobs[n]),
                              environment=environments[n]))
        forks.append(fork)
    if ctx.sampling.tool_loop:
        episodes = ctx.continue_tool_loop(resumes)
    else:  # an environment without tools: nothing to resume, the continuation is the whole turn
        # (no messages: rewards and texts decode the tokens, as for a single-turn completion)
        episodes = [Episode(r.prefix.ids + r.continuation, r.prefix.model_mask + [1] * len(r.continuation), [], None)
                    for r in resumes]
    trees.branch_model_masks = [episode.model_mask[fork:] for episode, fork in zip(episodes, forks)]
    trees.branch_messages = [episode.messages for episode in episodes]
    branch_ids = [episode.ids[fork:] for episode, fork in zip(episodes, forks)]
    if logprobs is None or any(episode.logprobs is None for episode in episodes):
        return branch_ids, None
    return branch_ids, [episode.logprobs[fork:] for episode, fork in zip(episodes, forks)]


def model_tokens(ctx, trees) -> tuple[list[int], list[int], list[int]]:
    """The model's tokens (tool results left out) of every base rollout, every branch and every branch's leaf (prefix
    + branch), all processes in process order, for the token metrics. A collective call."""
    base = ctx.gather_rows([sum(episode.model_mask) for episode in trees.episodes])
    branches = ctx.gather_rows([sum(mask) for mask in trees.branch_model_masks])
    leaves = ctx.gather_rows([sum(trees.episodes[i].model_mask[: trees.forks[i][j]]) + sum(mask)
                              for (i, j), mask in zip(trees.branch_meta, trees.branch_model_masks)])
    return base, branches, leaves
