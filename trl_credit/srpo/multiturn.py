"""SRPO / RRPO inside multi-turn rollouts (TRL's ``tools`` or ``environment_factory``; docs/srpo.md#multi-turn-rollouts,
docs/multiturn.md#srpo--rrpo-resets).

Every rollout of the step (base rows, seed candidates, suffixes) is a multi-turn episode generated through TRL's tool
loop (:func:`trl_credit.core.tool_loop.continue_tool_loop`). What changes from a single-turn step:

- **Reset points** are the starts of the model's steps: thoughts split inside each model turn
  (``core.steps.step_spans(unit="thoughts")``: a step never spans a tool result, a turn without the delimiter is one
  step), so a reset lands at a model turn's start (right after a tool result) or at a thought inside a turn, never
  inside a tool result. The kept prefix holds the earlier turns and their tool results.
- **Continuation**: the model continues the prefix (the turn in progress, or a new turn after a tool result); a tool
  call it emits is executed and the loop goes on as in TRL. With ``tools`` the prefix's tool results are reused as
  recorded. With an ``environment_factory`` the suffix rows' environments are rebuilt at the reset point by replay
  (``reset()``, then the prefix's tool calls in order); a replay whose results differ from the recorded ones skips
  that reset (its rows become fallback rows: no loss, advantage 0), warned once and counted in
  ``srpo/replay_mismatch_rate`` every step.
- **Localization** reads the whole transcript: each step's text, with the tool results that follow it.
- **Rows**: the model mask is 1 on the model's tokens (the prefix's and the suffix's), 0 on tool results; the loss mask
  (TRL's ``tool_mask``) is the model mask with a suffix row's prefix zeroed, as a single-turn suffix row masks it.
"""

from __future__ import annotations

from trl_credit.core.steps import span_texts, step_spans, tool_result_spans
from trl_credit.core.tool_loop import Episode, Resume

__all__ = ["EpisodeIds", "generate_episodes", "generated_tokens", "episode_steps", "transcript_texts", "resume_resets",
           "loss_mask"]


class EpisodeIds(list):
    """The token ids of a multi-turn rollout (a list, as a single-turn rollout's ids are, so the step's bookkeeping
    reads both alike) carrying its :class:`~trl_credit.core.tool_loop.Episode` and the environment instance it ran in
    (None with ``tools`` only). A slice is a plain list."""

    def __init__(self, episode: Episode, environment=None):
        super().__init__(episode.ids)
        self.episode = episode
        self.environment = environment


def generate_episodes(ctx, prompt_ids: list[list[int]], prompts: list, rows: list[dict], environments: list):
    """A multi-turn rollout from each prompt (``prompts[i]``'s messages, tokenized as ``prompt_ids[i]``; ``rows[i]``
    its dataset row, ``environments[i]`` its environment instance, already reset): the first turn in one generation
    call (``ctx.generate``, collective), then TRL's tool loop. Returns ``(ids, logprobs)`` as ``ctx.generate`` does,
    the ids :class:`EpisodeIds`."""
    first, logprobs = ctx.generate(prompt_ids)
    resumes = [Resume(row=row, prompt=prompt, prompt_ids=ids, prefix=Episode([], [], [], [] if logprobs else None),
                      turn_start=0, continuation=turn, continuation_logprobs=logprobs[i] if logprobs else None,
                      environment=environment)
               for i, (ids, prompt, row, environment, turn) in enumerate(zip(prompt_ids, prompts, rows, environments,
                                                                                first))]
    episodes = ctx.continue_tool_loop(resumes)
    ids = [EpisodeIds(episode, environment) for episode, environment in zip(episodes, environments)]
    return ids, None if logprobs is None else [episode.logprobs for episode in episodes]


def generated_tokens(ids) -> int:
    """The tokens the model generated in a rollout: all of a single-turn one, the model's turns of an
    :class:`EpisodeIds` (tool results are not generated: the ``srpo/tokens_*`` metrics count what TRL's
    ``completions/mean_length`` counts)."""
    return sum(ids.episode.model_mask) if isinstance(ids, EpisodeIds) else len(ids)


def episode_steps(ids: EpisodeIds, tokenizer, delimiter: str) -> list[tuple[int, int]]:
    """The seed's steps (module docstring): thoughts inside each model turn, as token spans."""
    return step_spans(list(ids), tokenizer, delimiter, ids.episode.model_mask, unit="thoughts")


def transcript_texts(ids: EpisodeIds, spans, tokenizer, delimiter: str) -> list[str]:
    """The text of each step as the localization prompt shows it (``Step k: ...``), followed on new lines by the tool
    results that come right after it (``Tool result: ...``, the tool messages' contents), so the prompt reads the whole
    transcript while only the model's steps are numbered."""
    texts = span_texts(list(ids), spans, tokenizer, delimiter)
    results = [m for m in ids.episode.messages if m.get("role") == "tool"]
    rounds = tool_result_spans(ids.episode.model_mask)
    # tool messages of each round, in order (one run of tool-result tokens per round, one message per call)
    per_round, cursor = [], 0
    calls = [len(m.get("tool_calls") or []) for m in ids.episode.messages if m.get("role") == "assistant"]
    for count in calls[: len(rounds)]:
        per_round.append(results[cursor: cursor + count])
        cursor += count
    for (start, _), messages in zip(rounds, per_round):
        before = max((k for k, (_, end) in enumerate(spans) if end <= start), default=None)
        if before is None:
            continue
        for message in messages:
            content = message.get("content")
            shown = content if isinstance(content, str) else repr(content)  # a content list (images): as a repr
            texts[before] += f"\nTool result: {shown}"
    return texts


def resume_resets(ctx, resets, prompt_ids, group_prompts, group_inputs, stats, part=None) -> tuple[list, list | None]:
    """The suffixes of every reset (``suffixes_per_reset`` each): the continuation of ``x*`` in one generation call
    with the budget ``max_completion_length`` minus the prefix (collective), each suffix row's environment replayed to
    the reset point (``environment_factory``), then TRL's tool loop. A reset whose replay differs on any of its rows is
    marked ``skipped`` (its rows train as fallback rows). Returns the suffix ids (:class:`EpisodeIds` of the whole
    completion, prefix included) and their log-probs, ``suffixes_per_reset`` per reset in order."""
    args = ctx.args
    num_suffixes, max_length = args.suffixes_per_reset, args.max_completion_length
    batch_environments = ctx.environments
    rows, budgets, plans = [], [], []
    for index, reset in enumerate(resets):
        keep = reset.prefix_length()
        prefix, turn_start = reset.ids.episode.prefix(keep)
        environments = [None] * num_suffixes
        if batch_environments is not None:
            # the suffix rows' own environments (TRL's, one per training row): base rows, then each reset slot's rows
            first = reset.group * ctx.group_size + args.num_base_generations + reset.slot * num_suffixes
            environments = batch_environments[first: first + num_suffixes]
            stats.replayed += 1
            if not all(ctx.replay_environment(env, group_inputs[reset.group], prefix.messages) for env in environments):
                reset.skipped = True
                stats.replay_mismatches += 1
        for environment in environments:
            rows.append(prompt_ids[reset.group] + list(prefix.ids))
            budgets.append(max(1, max_length - keep) if max_length is not None else None)
            plans.append((reset, prefix, turn_start, environment))
    continuations, logprobs = ctx.generate(rows, max_new_tokens=budgets if max_length is not None else None)
    ctx.refuse_empty_completions(continuations, "the generation of suffixes", part=part)
    resumes = [Resume(row=group_inputs[reset.group], prompt=group_prompts[reset.group],
                      prompt_ids=prompt_ids[reset.group], prefix=prefix, turn_start=turn_start, continuation=ids,
                      continuation_logprobs=logprobs[i] if logprobs is not None else None, environment=environment)
               for i, ((reset, prefix, turn_start, environment), ids) in enumerate(zip(plans, continuations))]
    # skipped resets: no tool loop (their rows are fallback rows), their generated continuation is kept as it is
    live = [i for i, (reset, *_) in enumerate(plans) if not reset.skipped]
    episodes: list = [None] * len(plans)
    for i, episode in zip(live, ctx.continue_tool_loop([resumes[i] for i in live])):
        episodes[i] = episode
    suffixes = []
    for i, (reset, prefix, _, environment) in enumerate(plans):
        episode = episodes[i] or Episode(list(prefix.ids) + list(continuations[i]),
                                         list(prefix.model_mask) + [1] * len(continuations[i]),
                                         list(prefix.messages), None)
        suffixes.append(EpisodeIds(episode, environment))
    stats.suffix_tokens = sum(sum(ids.episode.model_mask[len(plan[1].ids):]) for ids, plan in zip(suffixes, plans))
    return suffixes, None if logprobs is None else [ids.episode.logprobs for ids in suffixes]


def loss_mask(row_mask: list[int], model_mask: list[int]) -> list[int]:
    """TRL's ``tool_mask`` of a training row: 1 where the row trains (``row_mask``: 0 on a suffix row's prefix and on a
    fallback row) and the model generated the token (``model_mask``)."""
    return [int(bool(a) and bool(b)) for a, b in zip(row_mask, model_mask)]
