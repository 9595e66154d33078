"""SRPO's self-localization calls to the policy (paper §4.2 "SRPO: self-localized reset", Appendix D "L2
self-localization"; docs/srpo.md#reset-index): the greedy decoded ``\\boxed{N}`` answer and the scored choice.

Functions of the generation batch's context (:class:`~trl_credit.core.context.BatchContext`: they generate and run
forward passes of the policy through it); the pure parts (answers, calibration, picks) are in srpo/localization.py.
Every call here is collective: every process makes it, the same number of times.
"""

from __future__ import annotations

import inspect
import random

import torch
import transformers

from trl_credit.core.collectives import fill_rows
from trl_credit.core.scoring import pad_rows
from trl_credit.generation.hooks import _accepts_logits_to_keep, _prefill_can_be_shared
from trl_credit.srpo.localization import (
    BOXED_OPEN,
    answer_texts,
    calibrate_scores,
    content_free_thoughts,
    pick_step,
)
from trl_credit.srpo.prompts import localization_prompt, parse_reset_step, question_of, stop_strings
from trl_credit.srpo.resets import Reset, random_reset_step
from trl_credit.srpo.step_metrics import StepStats
from trl_credit.trl_bridge.compat import HAS_FUSED_LM_HEAD, disable_gradient_checkpointing

__all__ = ["localize", "answer_scores"]


def localize(ctx, resets: list[Reset], group_prompts, stats: StepStats, rng: random.Random) -> None:
    """SRPO's self-localization (§4.2, Appendix D) of multi-thought seeds: the greedy decoded ``\\boxed{N}``
    (``localization="generate"``; an unparsed answer falls back to ``localization_fallback``) or the scored
    choice (``"scored"``, srpo/localization.py). Every process makes the same calls. ``rng`` draws the random
    fallback and the scored pick (the rollout's reset generator, ``Resets.rng``)."""
    args = ctx.args
    questions = [question_of(group_prompts[r.group]) for r in resets]
    is_text = [isinstance(group_prompts[r.group], str) for r in resets]
    to_score = list(range(len(resets)))
    if args.localization == "generate":
        chains = [(q, r.texts, plain) for q, r, plain in zip(questions, resets, is_text)]
        ids = _localization_prompt_ids(ctx, chains)
        # Stop right after "\boxed{N}" (the answer the prompt asks for); the same strings on every process.
        most_steps = max(ctx.gather_counts(max((len(r.ends) for r in resets), default=0)))
        answers, _ = ctx.generate(
            ids, greedy=True, max_new_tokens=args.localization_max_tokens,
            stop_strings=stop_strings(most_steps) if most_steps else None,
        )
        eos_ids, to_score, tokenizer = set(ctx.eos_token_ids), [], ctx.tokenizer
        for index, (reset, answer_ids) in enumerate(zip(resets, answers)):
            answer = tokenizer.decode(answer_ids, skip_special_tokens=True)
            ended_with_eos = bool(answer_ids) and int(answer_ids[-1]) in eos_ids
            step = parse_reset_step(answer, len(reset.ends), ended_with_eos=ended_with_eos)
            stats.localization_tokens += len(answer_ids)
            stats.localization_attempts += 1
            stats.localization_parsed += step is not None
            if step is not None:
                reset.step, reset.source = step, "generated"
            elif args.localization_fallback == "random":
                reset.step, reset.source = random_reset_step(len(reset.ends), rng), "random"
            else:
                to_score.append(index)
        if args.localization_fallback == "random":
            to_score = None  # the paper's mode: no scoring call on any process
    if to_score is not None:
        requests = [(questions[i], resets[i].texts, is_text[i]) for i in to_score]
        for i, scores in zip(to_score, answer_scores(ctx, requests, stats)):
            resets[i].step = pick_step(scores, args.localization_temperature, rng)
            resets[i].source = "scored"
    for reset in resets:
        stats.generated += reset.source == "generated"
        stats.scored += reset.source == "scored"
        stats.random += reset.source == "random"


def answer_scores(ctx, requests: list[tuple[str, list[str], bool]], stats: StepStats) -> list[list[float]]:
    """Scores of the answers ``\\boxed{1}``..``\\boxed{H_s}`` for every ``(question, thoughts, text prompt?)``
    (srpo/localization.py): the policy's log-probability of ``N}`` after the localization prompt and a forced
    ``\\boxed{`` (TRL's log-probs, at the sampling temperature); with ``localization_scoring="calibrated"`` divided by
    the scores on a content-free chain of the same length.

    Each distinct prompt is run once (:func:`_shared_prefix_logps`: its KV cache, copied to its candidates, which
    then read only their 1-3 answer tokens); where that cannot give TRL's numbers (:func:`_prefix_can_be_shared`)
    every candidate row is scored whole, prompt included (:func:`_per_row_logps`, the path before). Collective:
    every process makes the same calls (one count gather; the per-row path's padded forward)."""
    args = ctx.args
    calibrated = args.localization_scoring == "calibrated"
    chains = list(requests)
    if calibrated:
        chains += [(q, content_free_thoughts(len(t)), plain) for q, t, plain in requests]
    tokenizer = ctx.tokenizer
    opening = tokenizer.encode(BOXED_OPEN, add_special_tokens=False)
    prefixes = [prefix + opening for prefix in _localization_prompt_ids(ctx, chains)]
    answers = [[tokenizer.encode(a, add_special_tokens=False) for a in answer_texts(len(t))] for _, t, _ in chains]
    most = max(ctx.gather_counts(sum(len(a) for a in answers)))
    if most == 0:
        return [[] for _ in requests]
    scores = _shared_prefix_logps(ctx, prefixes, answers, stats) if _prefix_can_be_shared(ctx) else None
    if scores is None:
        scores = _per_row_logps(ctx, prefixes, answers, stats, most, opening)
    if calibrated:
        n = len(requests)
        return [calibrate_scores(scores[i], scores[n + i]) for i in range(n)]
    return scores[: len(requests)]


def _per_row_logps(ctx, prefixes, answers, stats: StepStats, most: int, opening) -> list[list[float]]:
    """Summed log-probs of every ``answers[c][k]`` after ``prefixes[c]``, one whole row (prompt + answer) per
    candidate, all in TRL's log-prob pass (``score_completions``), padded to ``most`` rows (the largest count of
    any process: the forward is collective under FSDP / ZeRO-3)."""
    prompt_rows, answer_rows, owners = [], [], []
    for index, (prefix, candidates) in enumerate(zip(prefixes, answers)):
        for answer in candidates:
            prompt_rows.append(prefix)
            answer_rows.append(answer)
            owners.append(index)
    stats.localization_forward_tokens += sum(len(p) + len(a) for p, a in zip(prompt_rows, answer_rows))
    filler = (prompt_rows[0], answer_rows[0]) if prompt_rows else (opening, opening)
    real = len(prompt_rows)
    prompt_rows, answer_rows = fill_rows(prompt_rows, most, filler[0]), fill_rows(answer_rows, most, filler[1])
    p_ids, p_mask, a_ids, a_mask = pad_rows(prompt_rows, answer_rows, ctx.pad_token_id, ctx.device)
    logps, _ = ctx.logprobs(p_ids, p_mask, a_ids, a_mask)  # TRL's pass over the policy
    sums = (logps * a_mask).sum(dim=1)[:real].tolist()
    scores: list[list[float]] = [[] for _ in prefixes]
    for owner, value in zip(owners, sums):
        scores[owner].append(value)
    return scores


def _prefix_can_be_shared(ctx) -> bool:
    """Whether :func:`_shared_prefix_logps` gives TRL's log-probs: TRL's fused log-prob head (trl>=1.15, patched into
    the model's forward), a plain growing cache whose rows can be selected (every layer a full-attention
    ``DynamicLayer``: no sliding-window, linear-attention or hybrid layers), nothing that prepends its own cache
    (prompt-learning adapters), no active dropout, and not FSDP / ZeRO-3 with several processes, where a forward
    is a collective call and the row counts differ between processes. The same on every process."""
    if not HAS_FUSED_LM_HEAD or getattr(ctx.args, "use_liger_kernel", False):
        return False
    if ctx.collective_forward:
        return False
    model = ctx.unwrapped_policy
    if not _prefill_can_be_shared(model, None):
        return False
    try:
        layers = transformers.DynamicCache(config=model.config).layers
    except Exception:  # a config DynamicCache cannot read: do not guess
        return False
    return bool(layers) and all(type(layer) is transformers.cache_utils.DynamicLayer for layer in layers)


@torch.no_grad()
def _shared_prefix_logps(ctx, prefixes, answers, stats: StepStats) -> list[list[float]] | None:
    """Summed log-probs of every ``answers[c][k]`` after ``prefixes[c]``, each distinct prefix run once.

    Per batch of chains (at most ``per_device_train_batch_size`` candidate rows, the row count of the per-row
    pass, so the cache copies take no more memory than its activations): one forward of the prefixes, left-padded,
    all but their last token, with ``use_cache=True``; the cache rows are copied to the candidates
    (``batch_select_indices``) and one forward of ``[last prefix token, answer tokens]`` per candidate,
    right-padded, through TRL's fused log-prob head (``fused_lm_head=True``: temperature, float32 head where TRL
    casts, tiles) as TRL's own pass calls it, at the positions the per-row pass gives each token. Counts the tokens
    run: each prefix once, then one prefix token and the answer tokens per candidate. None where the model's
    forward returned no plain growing cache (then nothing is counted and the caller scores per row)."""
    if any(len(prefix) < 2 for prefix in prefixes):
        return None  # a prompt of one token has nothing to run before its last token
    model = ctx.policy
    device = ctx.device
    pad_id = ctx.pad_token_id
    distinct: dict[tuple, int] = {}  # a content-free chain repeats for the seeds of one question with one H_s
    for prefix, candidates in zip(prefixes, answers):
        distinct.setdefault((tuple(prefix), tuple(map(tuple, candidates))), len(distinct))
    keys = list(distinct)
    batch_rows = max(int(ctx.args.per_device_train_batch_size), 1)
    batches, current, rows = [], [], 0
    for key in keys:
        if current and rows + len(key[1]) > batch_rows:
            batches.append(current)
            current, rows = [], 0
        current.append(key)
        rows += len(key[1])
    if current:
        batches.append(current)
    sums: dict[tuple, list[float]] = {}
    tokens = 0
    # Positions as in the per-row pass, where TRL's model derives them (0, 1, ...) over rows left-padded to the
    # call's longest prompt: a prefix of length L starts at (longest - L). Rotary models see relative positions
    # only, but float rounding differs with the absolute ones (~2e-4 on the tiny test model), so they are kept.
    call_longest = max((len(p) for p in prefixes), default=0)
    unwrapped = ctx.unwrapped_policy
    keep = {"logits_to_keep": 1} if _accepts_logits_to_keep(unwrapped) else {}
    cache_kwarg = _forward_cache_kwarg(unwrapped)
    with disable_gradient_checkpointing(model, ctx.args.gradient_checkpointing_kwargs):
        for batch in batches:
            prefix_rows = [list(key[0]) for key in batch]
            longest = max(len(p) for p in prefix_rows)
            prefix_ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
            prefix_mask = torch.zeros((len(batch), longest), dtype=torch.long)
            positions = torch.zeros((len(batch), longest), dtype=torch.long)
            for row, prefix in enumerate(prefix_rows):  # left-padded, as TRL pads prompts
                prefix_ids[row, longest - len(prefix):] = torch.tensor(prefix)
                prefix_mask[row, longest - len(prefix):] = 1
                positions[row, longest - len(prefix):] = torch.arange(call_longest - len(prefix), call_longest)
            prefix_ids, prefix_mask, positions = prefix_ids.to(device), prefix_mask.to(device), positions.to(device)
            with ctx.autocast():
                output = model(input_ids=prefix_ids[:, :-1], attention_mask=prefix_mask[:, :-1],
                               position_ids=positions[:, :-1], use_cache=True, **keep)
            cache = getattr(output, "cache", None)
            cache = cache if cache is not None else getattr(output, "past_key_values", None)
            if type(cache) is not transformers.DynamicCache:
                return None
            owner = [row for row, key in enumerate(batch) for _ in key[1]]
            candidate_rows = [answer for key in batch for answer in key[1]]
            width = 1 + max(len(a) for a in candidate_rows)
            ids = torch.full((len(owner), width), pad_id, dtype=torch.long, device=device)
            mask = torch.zeros((len(owner), width), dtype=torch.long, device=device)
            select = torch.tensor(owner, device=device)
            ids[:, 0], mask[:, 0] = prefix_ids[select, -1], 1
            for row, answer in enumerate(candidate_rows):
                ids[row, 1 : 1 + len(answer)] = torch.tensor(answer, device=device)
                mask[row, 1 : 1 + len(answer)] = 1
            cache.batch_select_indices(select)
            labels = ids.masked_fill(mask == 0, -100)
            labels[:, 0] = -100
            with ctx.autocast():
                scored = model(input_ids=ids, attention_mask=torch.cat([prefix_mask[select], mask], dim=1),
                               position_ids=torch.arange(call_longest - 1, call_longest - 1 + width, device=device)
                               .expand(len(owner), width),
                               labels=labels, fused_lm_head=True, **{cache_kwarg: cache})
            values = (scored.log_probs[:, -(width - 1):].float() * mask[:, 1:]).sum(dim=1).tolist()
            start = 0
            for key in batch:
                sums[key] = values[start : start + len(key[1])]
                start += len(key[1])
            tokens += sum(len(p) - 1 for p in prefix_rows) + sum(1 + len(a) for a in candidate_rows)
    stats.localization_forward_tokens += tokens
    return [list(sums[(tuple(p), tuple(map(tuple, c)))]) for p, c in zip(prefixes, answers)]


def _forward_cache_kwarg(model) -> str:
    """The name the causal LM's forward takes a ready cache under: ``cache`` in recent transformers
    (``past_key_values`` is deprecated there), ``past_key_values`` before."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(causal_lm.forward).parameters else "past_key_values"


def _localization_prompt_ids(ctx, chains: list[tuple[str, list[str], bool]]) -> list[list[int]]:
    """Token ids of the localization prompt (Appendix D) for every ``(question, thoughts, text prompt?)``: the prompt
    as a user message when the dataset's prompts are conversational, as plain text when they are text."""
    texts = [localization_prompt(q, thoughts, ctx.args.localization_template) for q, thoughts, _ in chains]
    rows = [text if plain else [{"role": "user", "content": text}] for text, (_, _, plain) in zip(texts, chains)]
    # the method's own prompt: rendered without the tools' schema (a multi-turn run's tools are not its to call)
    return [list(map(int, x)) for x in ctx.tokenize(rows, tools=False)[0]] if rows else []
