"""Question: How well does the policy localize its first wrong thought, against a step checker?

How well does the policy localize its first wrong thought? SRPO's localization modes against the chain task's
step checker (docs/srpo.md#reset-index, paper §4.2 and §5.3).

Samples rollouts of held-out ``chain`` problems (docs/testbed.md), keeps the failed ones in which the step checker
finds a wrong thought and that have at least two thoughts (a one-thought seed is never localized), and for each
compares the reset index h* of

- ``generate``: the paper's greedy decoded ``\\boxed{N}`` (parse rate reported; unparsed answers take the scored
  choice, as ``localization="generate"`` does by default);
- ``scored``: the argmax of the policy's log-probabilities of ``N}`` after the prompt and a forced ``\\boxed{``;
- ``calibrated``: the same divided by the scores on a content-free chain of the same length;
- ``uniform``: RRPO's draw, in expectation (exact, no sampling noise);

with the checker's first wrong thought h_o: exact rate (h* = h_o), clean rate (h* <= h_o: the kept prefix has no
wrong thought), mean deviation h* - h_o, each with a 95% interval (Wilson for rates, normal for means), and the
mean probability the plain scores put on step 1. Cost per localized seed: decoded tokens (generate) and forward
tokens (scored: H_s rows of prompt + answer; calibrated: twice that).

    OMP_NUM_THREADS=1 python benchmarks/mechanisms/srpo_localization.py                      # smollm2-135m-chain, ~64-128 seeds
    python benchmarks/mechanisms/srpo_localization.py --model smollm2-135m --out benchmarks/results/srpo_localization_base.json

Scores use the same prompt, template and answer tokens as the trainer (``trl_credit.srpo.localization``); the
forward pass here is a plain one (logits / ``--temperature``, as TRL's log-prob pass at the sampling temperature).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from trl_credit.evaluation.metrics import wilson_interval  # noqa: E402
from trl_credit.models import load_model  # noqa: E402
from trl_credit.tasks.chain import make_chain_dataset  # noqa: E402
from trl_credit.tasks.rewards import accuracy_reward  # noqa: E402
from trl_credit.srpo.localization import (  # noqa: E402
    BOXED_OPEN,
    answer_texts,
    calibrate_scores,
    chain_step_checker,
    content_free_thoughts,
    normalize_scores,
    pick_step,
)
from trl_credit.srpo.prompts import LOCALIZATION_TEMPLATE, localization_prompt, parse_reset_step  # noqa: E402
from trl_credit.core.steps import split_thoughts, thought_texts  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results", "srpo_localization.json")


def wilson(successes: int, n: int, z: float = 1.96) -> list[float] | None:
    """Wilson score interval of successes / n (trl_credit.evaluation.metrics.wilson_interval, z = 1.96 here)."""
    return wilson_interval(successes, n, z)


def mean_ci(values: list[float]) -> tuple[float | None, list[float] | None]:
    n = len(values)
    if n == 0:
        return None, None
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, [round(mean - 1.96 * sd / math.sqrt(n), 4), round(mean + 1.96 * sd / math.sqrt(n), 4)]


def chat_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"])


def answer_scores(model, tokenizer, question: str, thoughts: list[str], temperature: float) -> tuple[list[float], int]:
    """Summed log-probs of ``N}`` (N = 1..H) after the localization prompt and ``\\boxed{``, and the forward tokens."""
    import torch

    prefix = chat_ids(tokenizer, localization_prompt(question, thoughts, LOCALIZATION_TEMPLATE))
    prefix += tokenizer.encode(BOXED_OPEN, add_special_tokens=False)
    answers = [tokenizer.encode(a, add_special_tokens=False) for a in answer_texts(len(thoughts))]
    width = len(prefix) + max(len(a) for a in answers)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([prefix + a + [pad] * (width - len(prefix) - len(a)) for a in answers])
    mask = torch.tensor([[1] * (len(prefix) + len(a)) + [0] * (width - len(prefix) - len(a)) for a in answers])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float() / temperature
    logps = torch.log_softmax(logits, dim=-1)
    scores = [sum(logps[i, len(prefix) + j - 1, t].item() for j, t in enumerate(a)) for i, a in enumerate(answers)]
    return scores, sum(len(prefix) + len(a) for a in answers)


def decoded_answer(model, tokenizer, question, thoughts, max_tokens: int) -> tuple[int | None, int]:
    """The greedy localization answer (cut after the first ``\\boxed{N}``, as the trainer's stop strings do),
    parsed; returns ``(step or None, decoded tokens)``."""
    import torch

    prompt = chat_ids(tokenizer, localization_prompt(question, thoughts, LOCALIZATION_TEMPLATE))
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=max_tokens,
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    new = out[0, len(prompt):].tolist()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    kept = len(new)
    for end in range(1, len(new) + 1):  # first \boxed{N} ends the answer
        text = tokenizer.decode(new[:end], skip_special_tokens=True)
        if any(f"\\boxed{{{n}}}" in text for n in range(1, len(thoughts) + 1)):
            kept = end
            break
    new = new[:kept]
    ended_with_eos = bool(new) and new[-1] in eos
    text = tokenizer.decode(new, skip_special_tokens=True)
    return parse_reset_step(text, len(thoughts), ended_with_eos=ended_with_eos), len(new)


def summarize(picks: list[int], oracles: list[int]) -> dict:
    n = len(picks)
    exact = sum(p == o for p, o in zip(picks, oracles))
    clean = sum(p <= o for p, o in zip(picks, oracles))
    deviation, deviation_ci = mean_ci([p - o for p, o in zip(picks, oracles)])
    return {"n": n, "exact": exact, "exact_rate": exact / n, "exact_ci": wilson(exact, n), "clean": clean,
            "clean_rate": clean / n, "clean_ci": wilson(clean, n), "mean_deviation": deviation,
            "deviation_ci": deviation_ci, "step1_picks": sum(p == 1 for p in picks) / n}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--model", default="smollm2-135m-chain", help="model name (trl_credit.models) or path")
    parser.add_argument("--problems", type=int, default=48, help="held-out chain problems")
    parser.add_argument("--samples", type=int, default=4, help="rollouts per problem")
    parser.add_argument("--max_seeds", type=int, default=96, help="failed rollouts to localize, at most")
    parser.add_argument("--tokens", type=int, default=160, help="max new tokens of a rollout")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top_p", type=float, default=0.95)
    parser.add_argument("--localization_max_tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    import torch

    from trl_credit.evaluation.evaluate import sample_completions

    torch.manual_seed(args.seed)
    start = time.perf_counter()
    model, tokenizer = load_model(args.model)
    model.eval()
    test = make_chain_dataset(num_train=0, num_test=args.problems, seed=0)["test"]
    samples = sample_completions(model, tokenizer, test["prompt"], args.samples, temperature=args.temperature,
                                 top_p=args.top_p, max_new_tokens=args.tokens, seed=args.seed, progress=False)
    sampling_seconds = time.perf_counter() - start
    seeds, counts = [], {"rollouts": 0, "failed": 0, "no_wrong_step": 0, "single_thought": 0}
    for row, group in zip(test, samples):
        question = row["prompt"][-1]["content"]
        for sample in group:
            counts["rollouts"] += 1
            if accuracy_reward([sample["text"]], [row["answer"]])[0] >= 1.0:
                continue
            counts["failed"] += 1
            ids = tokenizer.encode(sample["text"], add_special_tokens=False)
            ends = split_thoughts(ids, tokenizer, "\n")
            thoughts = thought_texts(ids, ends, tokenizer, "\n")
            if len(thoughts) < 2:
                counts["single_thought"] += 1
                continue
            oracle = chain_step_checker(question, thoughts)
            if oracle is None:
                counts["no_wrong_step"] += 1
                continue
            seeds.append((question, thoughts, oracle))
    seeds = seeds[: args.max_seeds]

    oracles, modes = [], {"generate": [], "generate_parsed_only": [], "scored": [], "calibrated": []}
    uniform = {"exact": [], "clean": [], "deviation": []}
    cost = {"generate_decoded_tokens": 0, "scored_forward_tokens": 0, "calibrated_forward_tokens": 0}
    parsed, step1_mass, thoughts_total = 0, [], 0
    for question, thoughts, oracle in seeds:
        h = len(thoughts)
        thoughts_total += h
        oracles.append(oracle)
        plain, tokens = answer_scores(model, tokenizer, question, thoughts, args.temperature)
        free, _ = answer_scores(model, tokenizer, question, content_free_thoughts(h), args.temperature)
        cost["scored_forward_tokens"] += tokens
        cost["calibrated_forward_tokens"] += 2 * tokens
        step1_mass.append(math.exp(normalize_scores(plain)[0]))
        modes["scored"].append(pick_step(plain))
        modes["calibrated"].append(pick_step(calibrate_scores(plain, free)))
        step, decoded = decoded_answer(model, tokenizer, question, thoughts, args.localization_max_tokens)
        cost["generate_decoded_tokens"] += decoded
        parsed += step is not None
        modes["generate"].append(step if step is not None else modes["scored"][-1])
        if step is not None:
            modes["generate_parsed_only"].append((step, oracle))
        uniform["exact"].append(1 / h)
        uniform["clean"].append(oracle / h)
        uniform["deviation"].append((h + 1) / 2 - oracle)

    n = len(seeds)
    results = {name: summarize(picks, oracles) for name, picks in modes.items() if name != "generate_parsed_only"}
    pairs = modes["generate_parsed_only"]
    results["generate_parsed_only"] = summarize([p for p, _ in pairs], [o for _, o in pairs]) if pairs else {"n": 0}
    results["uniform"] = {
        "n": n, "exact_rate": mean_ci(uniform["exact"])[0], "exact_ci": mean_ci(uniform["exact"])[1],
        "clean_rate": mean_ci(uniform["clean"])[0], "clean_ci": mean_ci(uniform["clean"])[1],
        "mean_deviation": mean_ci(uniform["deviation"])[0], "deviation_ci": mean_ci(uniform["deviation"])[1],
        "note": "expected values of RRPO's draw per seed (1/H, h_o/H, (H+1)/2 - h_o); CI over seeds",
    }
    first_wrong = {}
    for oracle in oracles:
        first_wrong[str(oracle)] = first_wrong.get(str(oracle), 0) + 1
    payload = {
        "model": args.model,
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "counts": {**counts, "seeds": n},
        "mean_thoughts_per_seed": thoughts_total / n if n else None,
        "first_wrong_thought": dict(sorted(first_wrong.items(), key=lambda kv: int(kv[0]))),
        "generate_parse_rate": parsed / n if n else None,
        "scored_mean_probability_on_step_1": sum(step1_mass) / n if n else None,
        "results": results,
        "cost_per_seed": {k: v / n for k, v in cost.items()} if n else None,
        "seconds": {"sampling": round(sampling_seconds, 1), "total": round(time.perf_counter() - start, 1)},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as file:
        json.dump(payload, file, indent=2)
    print(json.dumps({k: payload[k] for k in ("model", "counts", "generate_parse_rate",
                                              "scored_mean_probability_on_step_1")}, indent=1))
    for name, result in results.items():
        if result.get("n"):
            print(f"{name:>22}: n={result['n']} exact {result['exact_rate']:.3f} {result['exact_ci']}  clean "
                  f"{result['clean_rate']:.3f} {result['clean_ci']}  deviation {result['mean_deviation']:+.2f}")
    return payload


if __name__ == "__main__":
    main()
