"""SRPO's self-localization calls to the policy (paper §4.2 "SRPO: self-localized reset", Appendix D "L2
self-localization"; docs/srpo.md#reset-index): the greedy decoded ``\\boxed{N}`` answer and the scored choice.

Functions of the trainer (they generate and run forward passes through it); the pure parts (answers, calibration,
picks) are in srpo/localization.py. Every call here is collective: every process makes it, the same number of times.
"""

from __future__ import annotations

from trl_credit._trl import gather_counts, generate_from_prefixes, pad_rows, score_completions
from trl_credit.collectives import fill_rows
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

__all__ = ["localize", "answer_scores"]


def localize(trainer, resets: list[Reset], group_prompts, stats: StepStats, rng=None) -> None:
    """SRPO's self-localization (§4.2, Appendix D) of multi-thought seeds: the greedy decoded ``\\boxed{N}``
    (``localization="generate"``; an unparsed answer falls back to ``localization_fallback``) or the scored
    choice (``"scored"``, srpo/localization.py). Every process makes the same calls. ``rng`` draws the random
    fallback and the scored pick (default: the trainer's reset generator)."""
    args = trainer.args
    rng = rng if rng is not None else trainer._reset_rng
    questions = [question_of(group_prompts[r.group]) for r in resets]
    is_text = [isinstance(group_prompts[r.group], str) for r in resets]
    to_score = list(range(len(resets)))
    if args.localization == "generate":
        chains = [(q, r.texts, plain) for q, r, plain in zip(questions, resets, is_text)]
        ids = _localization_prompt_ids(trainer, chains)
        # Stop right after "\boxed{N}" (the answer the prompt asks for); the same strings on every process.
        most_steps = max(gather_counts(trainer, max((len(r.ends) for r in resets), default=0)))
        answers, _ = generate_from_prefixes(
            trainer, ids, greedy=True, max_new_tokens=args.localization_max_tokens,
            stop_strings=stop_strings(most_steps) if most_steps else None,
        )
        eos_ids, to_score = set(trainer.eos_token_ids), []
        for index, (reset, answer_ids) in enumerate(zip(resets, answers)):
            answer = trainer._tokenizer.decode(answer_ids, skip_special_tokens=True)
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
        for i, scores in zip(to_score, answer_scores(trainer, requests, stats)):
            resets[i].step = pick_step(scores, args.localization_temperature, rng)
            resets[i].source = "scored"
    for reset in resets:
        stats.generated += reset.source == "generated"
        stats.scored += reset.source == "scored"
        stats.random += reset.source == "random"


def answer_scores(trainer, requests: list[tuple[str, list[str], bool]], stats: StepStats) -> list[list[float]]:
    """Scores of the answers ``\\boxed{1}``..``\\boxed{H_s}`` for every ``(question, thoughts, text prompt?)``
    (srpo/localization.py): the policy's log-probability of ``N}`` after the localization prompt and a forced
    ``\\boxed{``, all rows in one log-prob pass (TRL's, at the sampling temperature); with
    ``localization_scoring="calibrated"`` divided by the scores on a content-free chain of the same length.
    Collective: every process passes the same number of rows (padded)."""
    args = trainer.args
    calibrated = args.localization_scoring == "calibrated"
    chains = list(requests)
    if calibrated:
        chains += [(q, content_free_thoughts(len(t)), plain) for q, t, plain in requests]
    tokenizer = trainer._tokenizer
    prefixes = _localization_prompt_ids(trainer, chains)
    opening = tokenizer.encode(BOXED_OPEN, add_special_tokens=False)
    prompt_rows, answer_rows, owners = [], [], []
    for index, (prefix, (_, thoughts, _)) in enumerate(zip(prefixes, chains)):
        for answer in answer_texts(len(thoughts)):
            prompt_rows.append(prefix + opening)
            answer_rows.append(tokenizer.encode(answer, add_special_tokens=False))
            owners.append(index)
    stats.localization_forward_tokens += sum(len(p) + len(a) for p, a in zip(prompt_rows, answer_rows))
    most = max(gather_counts(trainer, len(prompt_rows)))
    if most == 0:
        return [[] for _ in requests]
    filler = (prompt_rows[0], answer_rows[0]) if prompt_rows else (opening, opening)
    real = len(prompt_rows)
    prompt_rows, answer_rows = fill_rows(prompt_rows, most, filler[0]), fill_rows(answer_rows, most, filler[1])
    device = trainer.accelerator.device
    p_ids, p_mask, a_ids, a_mask = pad_rows(prompt_rows, answer_rows, tokenizer.pad_token_id, device)
    logps, _ = score_completions(trainer, trainer.model, p_ids, p_mask, a_ids, a_mask)
    sums = (logps * a_mask).sum(dim=1)[:real].tolist()
    scores: list[list[float]] = [[] for _ in chains]
    for owner, value in zip(owners, sums):
        scores[owner].append(value)
    if calibrated:
        n = len(requests)
        return [calibrate_scores(scores[i], scores[n + i]) for i in range(n)]
    return scores[: len(requests)]


def _localization_prompt_ids(trainer, chains: list[tuple[str, list[str], bool]]) -> list[list[int]]:
    """Token ids of the localization prompt (Appendix D) for every ``(question, thoughts, text prompt?)``: the prompt
    as a user message when the dataset's prompts are conversational, as plain text when they are text."""
    texts = [localization_prompt(q, thoughts, trainer.args.localization_template) for q, thoughts, _ in chains]
    rows = [text if plain else [{"role": "user", "content": text}] for text, (_, _, plain) in zip(texts, chains)]
    return [list(map(int, x)) for x in trainer._tokenize_prompts(rows)[0]] if rows else []
