"""Localization examples for the chain warm start, and how well a model localizes (docs/testbed.md).

SRPO asks the policy for the first wrong thought of its failed rollout (the paper's "self-localization"; a
dedicated localizer is its future work). A 135M model was never taught to answer that prompt. This module writes
supervised examples of it: a correct solution of a train problem (either structure) with one injected error at a
chosen line - a wrong arithmetic result (propagated: later lines compute on it), a wrong operand, or a skipped
operation; the answer line can box a wrong value - kept only when :func:`~trl_credit.tasks.chain.first_wrong_step`
says the first wrong line is the intended one. The example is the exact chat message SRPOTrainer sends
(``localization_prompt(question_of(prompt), thoughts)`` as one user message; thoughts are the chain's lines with
``thought_delimiter="\\n"``) and the reply ``\\boxed{k}``.

    python -m trl_credit.testbed.warm_start --init_model smollm2-135m-chain --num_examples 8 \\
        --localization_examples 24 --epochs 1        # builds CHAIN_LOC_MODEL (a second stage on CHAIN_MODEL)
    python -m trl_credit.testbed.warm_start_localization --results benchmarks/results/warm_start_localization.json

The second command evaluates localization against the checker for both warm starts (and pass@1 of each). Without
``--init_model``, ``--localization_examples N`` adds the examples to the first warm start's own mix (from the
base model); docs/testbed.md says why the recorded model is the second-stage one.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter

from trl_credit.evaluation.metrics import wilson_interval
from trl_credit.tasks.chain import _OPS, ChainProblem, chain_solutions, check_steps, make_chain_dataset, parse_question

__all__ = [
    "ERROR_KINDS",
    "inject_error",
    "chain_thoughts",
    "localization_messages",
    "localization_examples",
    "localize",
    "localization_report",
    "main",
]

#: Errors injected at a step line; the answer line gets ``arithmetic`` (a boxed value off by a little) or
#: ``operand`` (an earlier line's value boxed).
ERROR_KINDS = ("arithmetic", "operand", "skip")
_DELTAS = (-2, -1, 1, 2, -10, 10)


def _program(problem: ChainProblem, structure: str) -> list[list]:
    """The solution as steps ``[x, op, y]`` whose operands are ``("lit", n)`` (a number of the question) or
    ``("ref", j)`` (the result of step j), so that an error in one step propagates to the later ones."""
    lit = lambda n: ("lit", n)  # noqa: E731
    if problem.distributive:
        a, op, b, c = problem.core
        if structure == "factored":
            steps = [[lit(b), op, lit(c)], [lit(a), "*", ("ref", 0)]]
        else:
            steps = [[lit(a), "*", lit(b)], [lit(a), "*", lit(c)], [("ref", 0), op, ("ref", 1)]]
    else:
        steps = [[lit(problem.core[0]), problem.core[1], lit(problem.core[2])]]
    for op, y in problem.ops:
        steps.append([("ref", len(steps) - 1), op, lit(y)])
    return steps


def _render(steps: list[list], slip: tuple[int, int] | None = None, boxed_shift: int = 0) -> tuple[str, list[int]]:
    """Lines ``x op y = z`` computed in order (``slip=(j, delta)``: step j writes its result off by ``delta`` and
    later steps use the written value), then ``\\boxed{last + boxed_shift}``. Returns the text and the values."""
    values, lines = [], []
    for j, (x, op, y) in enumerate(steps):
        xv, yv = (values[s[1]] if s[0] == "ref" else s[1] for s in (x, y))
        z = _OPS[op](xv, yv) + (slip[1] if slip and slip[0] == j else 0)
        values.append(z)
        lines.append(f"{xv} {op} {yv} = {z}")
    return "\n".join(lines + [f"\\boxed{{{values[-1] + boxed_shift}}}"]), values


def inject_error(problem: ChainProblem, structure: str, step: int, kind: str, rng: random.Random) -> str | None:
    """A solution of ``problem`` (``structure`` ``"term"``/``"factored"``) whose first wrong line per the checker is
    line ``step`` (1-indexed; the answer line is ``len(steps) + 1``) with an error of ``kind`` (:data:`ERROR_KINDS`),
    or None when that error cannot be put there (the result passes a check it should fail, a value goes negative,
    or the boxed answer comes out right)."""
    if kind not in ERROR_KINDS:
        raise ValueError(f"kind must be one of {ERROR_KINDS}, got {kind!r}")
    steps = _program(problem, structure)
    n = len(steps)
    if not 1 <= step <= n + 1:
        raise ValueError(f"step must be in [1, {n + 1}] for this chain ({n} step lines + the answer line), got {step}")
    j = step - 1
    if step == n + 1:  # the answer line
        _, values = _render(steps)
        if kind == "arithmetic":
            text, _ = _render(steps, boxed_shift=rng.choice(_DELTAS))
        elif kind == "operand":
            text, _ = _render(steps, boxed_shift=rng.choice(values[:-1]) - values[-1])
        else:
            return None  # skipping the answer line leaves no answer: not a localizable step
    elif kind == "arithmetic":
        text, _ = _render(steps, slip=(j, rng.choice(_DELTAS)))
    elif kind == "operand":
        x, op, y = steps[j]
        side = rng.randrange(2)
        if x[0] == "ref" and y[0] == "ref":  # p1 op p2: one product used twice
            steps[j] = [x, op, x] if side else [y, op, y]
        elif (x, y)[side][0] == "lit":
            old = (x, y)[side][1]
            new = ("lit", rng.choice([v for v in range(2, 10) if v != old]))
            steps[j] = [new, op, y] if side == 0 else [x, op, new]
        else:  # the running value replaced by an earlier result, or a number of the question if there is none
            _, values = _render(steps)
            earlier = [("ref", i) for i in range(j - 1)] or [("lit", v) for v in (2, 3, 4, 5) if v != values[j - 1]]
            steps[j] = [rng.choice(earlier), op, y] if side == 0 else [x, op, rng.choice(earlier)]
        text, _ = _render(steps)
    else:  # skip step j: later references to it read its own running input (or its second operand)
        x, op, y = steps.pop(j)
        carried = x if x[0] == "ref" else y
        for later in steps[j:]:
            for side in (0, 2):
                if later[side] == ("ref", j):
                    later[side] = carried
                elif later[side][0] == "ref" and later[side][1] > j:
                    later[side] = ("ref", later[side][1] - 1)
        if not steps:
            return None
        text, _ = _render(steps)
    # a negative value first shows as a result ("= -") or in the box; the task's values are never negative
    if "= -" in text or "{-" in text or text.endswith(f"{{{problem.answer}}}"):
        return None
    return text if check_steps(problem.question, text).step == step else None


def chain_thoughts(completion: str) -> list[str]:
    """SRPO's thoughts of a completion with ``thought_delimiter="\\n"``: its non-empty lines, stripped (the text
    ``thought_texts`` gives for the token ids; docs/testbed.md)."""
    return [line.strip() for line in completion.splitlines() if line.strip()]


def localization_messages(prompt, completion: str) -> list[dict]:
    """The localization request SRPOTrainer sends for a failed ``completion`` of the dataset ``prompt`` (chat
    messages or text), with the default template: one user message (a text prompt would be sent as text)."""
    from trl_credit.srpo.prompts import localization_prompt, question_of

    return [{"role": "user", "content": localization_prompt(question_of(prompt), chain_thoughts(completion))}]


def localization_examples(rows, num_examples: int, seed: int = 0) -> list[dict]:
    """``num_examples`` injected-error chains from ``rows`` (``prompt``/``question`` columns, taken in order,
    each at most once): per row a structure (distributive: term or factored, equal odds), a line ``k`` uniform over
    the chain's lines (answer line included) and a kind uniform over those that fit there; the other kinds are tried
    when one fails, then the next row. Each item: ``prompt`` (the localization messages), ``completion``
    (``\\boxed{k}``), and ``question``, ``chain``, ``step``, ``kind``, ``num_steps`` (lines). Deterministic in
    ``seed``; raises when ``rows`` run out."""
    rng = random.Random(seed)
    examples = []
    for prompt, question in zip(rows["prompt"], rows["question"]):
        if len(examples) == num_examples:
            break
        problem = parse_question(question)
        structure = rng.choice(["term", "factored"]) if problem.distributive else "term"
        lines = len(chain_solutions(problem)[1 if structure == "factored" else 0]) + 1
        step = rng.randint(1, lines)
        kinds = list(ERROR_KINDS if step < lines else ERROR_KINDS[:2])
        rng.shuffle(kinds)
        for kind in kinds:
            chain = inject_error(problem, structure, step, kind, rng)
            if chain is not None:
                examples.append({
                    "prompt": localization_messages(prompt, chain),
                    "completion": [{"role": "assistant", "content": f"\\boxed{{{step}}}"}],
                    "question": question, "chain": chain, "step": step, "kind": kind,
                    "num_steps": len(chain_thoughts(chain)),  # a skipped line makes it one shorter
                })
                break
    if len(examples) < num_examples:
        raise ValueError(f"only {len(examples)} of num_examples={num_examples} localization examples from "
                         f"{len(rows['question'])} rows: pass more rows")
    return examples


def localize(model, tokenizer, messages: list, num_steps: list[int], max_new_tokens: int = 64,
             batch_size: int = 16) -> list[int | None]:
    """Greedy localization replies parsed as SRPOTrainer does (stop right after ``\\boxed{N}``, ``parse_reset_step``
    with ``ended_with_eos``); ``max_new_tokens`` is ``SRPOConfig.localization_max_tokens``'s default."""
    import torch

    from trl_credit.srpo.prompts import parse_reset_step, stop_strings

    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    tokenizer.padding_side = "left"
    picks = []
    for start in range(0, len(messages), batch_size):
        chunk, steps = messages[start:start + batch_size], num_steps[start:start + batch_size]
        texts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in chunk]
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**batch, do_sample=False, temperature=None, top_p=None, top_k=None,
                                 max_new_tokens=max_new_tokens, stop_strings=stop_strings(max(steps)),
                                 tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id)
        for ids, n in zip(out[:, batch["input_ids"].shape[1]:].tolist(), steps):
            end = next((i for i, t in enumerate(ids) if t in eos), None)
            kept = ids if end is None else ids[:end + 1]
            text = tokenizer.decode(kept, skip_special_tokens=True)
            picks.append(parse_reset_step(text, n, ended_with_eos=end is not None))
    return picks


def localization_report(picks: list[int | None], targets: list[int], num_steps: list[int]) -> dict:
    """Exact (pick == target), clean (pick <= target) and parse rates with counts and Wilson 95% intervals (an
    unparsed reply counts as a miss), and the expected rates of a uniform draw over each row's steps."""
    total = len(targets)
    rates = {}
    for name, hits in (("exact", sum(p == t for p, t in zip(picks, targets))),
                       ("clean", sum(p is not None and p <= t for p, t in zip(picks, targets))),
                       ("parse", sum(p is not None for p in picks))):
        rates[name] = {"rate": hits / total if total else None, "count": hits, "ci95": wilson_interval(hits, total)}
    return {"rows": total, **rates, "uniform_baseline": {
        "exact": sum(1 / n for n in num_steps) / total if total else None,
        "clean": sum(min(t, n) / n for t, n in zip(targets, num_steps)) / total if total else None},
        "picks_minus_target": dict(sorted(Counter(p - t for p, t in zip(picks, targets) if p is not None).items()))}


def _evaluate_model(name: str, injected: list[dict], num_problems: int, num_samples: int, data_seed: int) -> dict:
    from trl_credit.evaluation.evaluate import load_model_and_tokenizer, sample_completions
    from trl_credit.models import resolve_model_path
    from trl_credit.tasks.rewards import accuracy_reward

    model, tokenizer = load_model_and_tokenizer(resolve_model_path(name))
    start = time.perf_counter()
    report = {"model": name}
    if injected:
        picks = localize(model, tokenizer, [e["prompt"] for e in injected], [e["num_steps"] for e in injected])
        report["injected"] = localization_report(picks, [e["step"] for e in injected],
                                                 [e["num_steps"] for e in injected])
        report["injected"]["exact_by_kind"] = {kind: localization_report(
            [p for p, e in zip(picks, injected) if e["kind"] == kind],
            [e["step"] for e in injected if e["kind"] == kind],
            [e["num_steps"] for e in injected if e["kind"] == kind])["exact"] for kind in ERROR_KINDS}
    if not num_problems:
        report["seconds"] = round(time.perf_counter() - start, 1)
        return report
    # The model's own failures on held-out problems, sampled as evaluate_chain_model does (pass@1 protocol).
    test = make_chain_dataset(num_train=0, num_test=num_problems, seed=data_seed)["test"]
    samples = sample_completions(model, tokenizer, test["prompt"], num_samples, temperature=0.7, top_p=0.95,
                                 max_new_tokens=160, seed=0, progress=False)
    rewards, failures = [], []
    for prompt, question, answer, group in zip(test["prompt"], test["question"], test["answer"], samples):
        for sample in group:
            rewards.append(accuracy_reward([sample["text"]], [answer])[0])
            verdict = check_steps(question, sample["text"])
            thoughts = chain_thoughts(sample["text"])
            if verdict.step is not None and len(thoughts) >= 2:  # one thought: SRPO resets at 1 without asking
                failures.append({"prompt": localization_messages(prompt, sample["text"]), "reason": verdict.reason,
                                 "num_steps": len(thoughts), "step": min(verdict.step, len(thoughts))})
    picks = localize(model, tokenizer, [f["prompt"] for f in failures], [f["num_steps"] for f in failures])
    report["own_failures"] = localization_report(picks, [f["step"] for f in failures],
                                                 [f["num_steps"] for f in failures])
    report["own_failures"]["reasons"] = dict(Counter(f["reason"] for f in failures).most_common())
    hits = sum(rewards)
    report["pass@1"] = {"rate": hits / len(rewards), "count": hits, "samples": len(rewards),
                        "ci95": wilson_interval(int(hits), len(rewards))}
    report["seconds"] = round(time.perf_counter() - start, 1)
    return report


def main(argv=None) -> dict:
    from trl_credit.evaluation.evaluate import write_report
    from trl_credit.models import CHAIN_LOC_MODEL, CHAIN_MODEL

    parser = argparse.ArgumentParser(description="Localization accuracy of the chain warm starts vs the checker.")
    parser.add_argument("--models", nargs="+", default=[CHAIN_MODEL, CHAIN_LOC_MODEL])
    parser.add_argument("--num_injected", type=int, default=64, help="Held-out injected-error chains (0: none).")
    parser.add_argument("--num_problems", type=int, default=32, help="Held-out problems sampled (0: none).")
    parser.add_argument("--num_samples", type=int, default=4)
    parser.add_argument("--data_seed", type=int, default=0)
    parser.add_argument("--results", default=None)
    args = parser.parse_args(argv)
    test = make_chain_dataset(num_train=0, num_test=4 * args.num_injected, seed=args.data_seed)["test"]
    injected = localization_examples(test, args.num_injected, seed=args.data_seed + 1)
    report = {"injected_rows": {"num": len(injected), "kinds": dict(Counter(e["kind"] for e in injected)),
                                "steps": dict(sorted(Counter(e["step"] for e in injected).items()))}}
    for name in args.models:
        report[name] = _evaluate_model(name, injected, args.num_problems, args.num_samples, args.data_seed)
        print(name, json.dumps({part: report[name][part]["exact"] for part in ("injected", "own_failures")
                                if part in report[name]}), report[name].get("pass@1"))
    if args.results:
        write_report(report, args.results)
    return report


if __name__ == "__main__":
    main()
