"""Question: How far does decoding alone take the untrained model (the sharpening baseline, taken wide)?

The untrained testbed model on the held-out problems under a set of decodings, no training: temperatures, top-p
0.9, min-p 0.1, each with its sampled accuracy (mean over 8 samples a problem, what runner.evaluate reports) and its
majority vote maj@8 (trl_credit.evaluation.metrics.maj_at_k: the vote of the 8 samples, ties broken uniformly at
random); greedy from the base profile. The sharpening baseline a trained run must beat is the best of them all
(tiny_report.beyond_sharpening). Also pass@64 on every held-out problem (not only the first 64 the grid samples),
to count the problems where the untrained model's pass@64 is below 1.

    python benchmarks/tiny/base_decodings.py --regime trap   # -> benchmarks/results/trap/base_decodings.json

Sampling mirrors trl_credit.testbed.runner.evaluate (the same prompts, seed 1234, batches of 512, 48 new tokens, the
global random state kept); the plain temperatures reproduce the base profile's accuracy_by_temperature exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: (name, temperature, extra sampling arguments of HF generate)
DECODINGS = tuple((f"T={t:g}{name}", t, extra) for t in (0.3, 0.5, 0.7, 1.0)
                  for name, extra in (("", {}), (", top-p 0.9", dict(top_p=0.9)), (", min-p 0.1", dict(min_p=0.1))))
_ANSWER = re.compile(r"^A(\d)$")  # the answer line trl_credit.tasks.sums.accuracy_reward reads


def answer_key(completion: str) -> str | None:
    """The answer a sample votes for: the first ``A<d>`` line, as sums.accuracy_reward reads it (None: no answer)."""
    for line in str(completion).split("\n"):
        match = _ANSWER.match(line.strip())
        if line.strip() and match:
            return match.group(1)
    return None


def majority_accuracy(keys: list[list[str | None]], answers: list[str]) -> float:
    """Mean over problems of maj@n (n = samples a problem): the majority vote of all of its samples is the reference
    answer, a tie among t answers counting (correct ones among them) / t."""
    from trl_credit.evaluation.metrics import maj_at_k

    total = 0.0
    for votes, truth in zip(keys, answers):
        total += maj_at_k(votes, [v == str(truth) for v in votes])
    return total / len(keys)


def sample(model, tokenizer, prompts, seed: int, temperature: float, extra: dict, batch_size: int = 512,
           max_new_tokens: int = 48) -> list[str]:
    """runner._sample with extra sampling arguments (top_p, min_p), the global random state kept."""
    from trl_credit.testbed.runner import _RandomState, _sample

    with _RandomState():
        return _sample(model, tokenizer, prompts, seed, batch_size, max_new_tokens, temperature, extra)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--regime", default="trap")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--passk-samples", type=int, default=64)
    parser.add_argument("--results", default=None, help="default: benchmarks/results/<regime>/base_decodings.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    from transformers import LlamaForCausalLM

    import tiny_grid
    from trl_credit.tasks import sums
    from trl_credit.testbed.model import make_tokenizer, testbed_model_path
    from trl_credit.testbed.regimes import regime_recipe

    torch.set_num_threads(1)
    results_dir = os.path.join(ROOT, "benchmarks", "results", args.regime)
    path = tiny_grid.committed_model(results_dir, args.regime) or testbed_model_path(regime_recipe(args.regime))
    model, tokenizer = LlamaForCausalLM.from_pretrained(path).eval(), make_tokenizer()
    test = sums.make_dataset()["test"]
    prompts = [p for p in test["prompt"] for _ in range(args.samples)]
    answers = [a for a in test["answer"] for _ in range(args.samples)]
    rows = []
    for name, temperature, extra in DECODINGS:
        with torch.no_grad():
            texts = sample(model, tokenizer, prompts, 1234, temperature, extra)
        correct = sums.accuracy_reward(texts, answers)
        keys = [[answer_key(t) for t in texts[i : i + args.samples]] for i in range(0, len(texts), args.samples)]
        rows.append(dict(decoding=name, temperature=temperature, **extra, accuracy=sum(correct) / len(correct),
                         maj=majority_accuracy(keys, list(test["answer"]))))
        print(f"{name}: accuracy {rows[-1]['accuracy']:.3f}, maj@{args.samples} {rows[-1]['maj']:.3f}", flush=True)
    many = [p for p in test["prompt"] for _ in range(args.passk_samples)]
    with torch.no_grad():  # runner.evaluate's pass@k draw (seed + 1), on every held-out problem
        texts = sample(model, tokenizer, many, 1235, 1.0, {})
    ok = sums.accuracy_reward(texts, [a for a in test["answer"] for _ in range(args.passk_samples)])
    per = [int(sum(ok[i * args.passk_samples : (i + 1) * args.passk_samples])) for i in range(len(test["prompt"]))]
    options = {f"{r['decoding']} (sampled)": r["accuracy"] for r in rows}
    options.update({f"{r['decoding']} (maj@{args.samples})": r["maj"] for r in rows})
    best = max(options, key=options.get)
    saved = dict(regime=args.regime, samples=args.samples, decodings=rows,
                 best=dict(decoding=best, accuracy=options[best]),
                 passk_samples=args.passk_samples, passk_correct_per_problem=per,
                 unsolved_in_passk=[i for i, c in enumerate(per) if c == 0])
    print(f"best: {best} {options[best]:.3f}; pass@{args.passk_samples} below 1 on {len(saved['unsolved_in_passk'])} "
          f"of {len(per)} problems")
    with open(args.results or os.path.join(results_dir, "base_decodings.json"), "w") as f:
        json.dump(saved, f, indent=1)


if __name__ == "__main__":
    main()
