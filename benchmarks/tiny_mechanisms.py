"""Where the token credit lands on the tiny testbed, against the step checker (BENCHMARKS.md section 6).

For OPPO (self-oracle), the process credit (the checker's own step rewards) and GRPO (uniform, the reference), a
few generation batches of the testbed model (learning rate 0: the rollouts of the starting model, the same for every
method at a seed) and the advantages that reach TRL's loss. For every incorrect completion whose first wrong line
h_o the checker finds (a slip, an off-path digit, a missing answer line is left out: no token lies on it), the
share of its negative advantage mass sum(-min(A_t, 0)) on tokens before h_o, on h_o and after it, against the share
of its tokens there (what GRPO's uniform credit gives). The paper's claim (OPPO §3.3, Fig. 1a) is that the recursion
concentrates credit on the pivotal tokens: here, on the slip.

    python benchmarks/tiny_mechanisms.py [--steps 3] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REGIONS = ("before", "on", "after")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tiny", "mechanisms.json")


def line_of_each_token(text: str) -> list[int]:
    """1-indexed non-empty line of each character (= token: the testbed's tokenizer has one token per character);
    a newline belongs to the line it ends."""
    lines, current, seen_content = [], 1, False
    for char in text:
        lines.append(current)
        if char == "\n":
            if seen_content:
                current += 1
            seen_content = False
        elif not char.isspace():
            seen_content = True
    return lines


def region_shares(lines: list[int], advantages: list[float], first_wrong: int) -> dict:
    region = ["before" if line < first_wrong else "on" if line == first_wrong else "after" for line in lines]
    negative = [max(-a, 0.0) for a in advantages]
    total = sum(negative)
    return dict(tokens={r: region.count(r) / len(region) for r in REGIONS},
                mass={r: (sum(m for m, g in zip(negative, region) if g == r) / total if total > 0 else None)
                      for r in REGIONS})


def capture(method: str, seed: int, steps: int, model_path: str | None) -> list[dict]:
    """Per incorrect completion with a checkable first wrong line: its reason and region shares."""
    from trl_credit.testbed import runner, sums
    from trl_credit.testbed.model import make_tokenizer

    tokenizer = make_tokenizer()
    rows: list[dict] = []
    spec = runner.method_spec(method)

    def on_loss(trainer, inputs):
        mask = inputs["completion_mask"].bool()
        advantages = inputs["advantages"]
        for i in range(mask.size(0)):
            length = int(mask[i].sum())
            if length == 0:
                continue
            prompt = tokenizer.decode(inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist())
            ids = inputs["completion_ids"][i, :length].tolist()
            text = tokenizer.decode(ids)  # one token per character, EOS as "</s>" at the end
            text = text.replace(tokenizer.eos_token, "")
            wrong, reason, _ = sums.check_steps(prompt, text)
            if wrong is None or reason in ("no answer", "text after answer"):
                continue
            values = advantages[i, :length] if advantages.dim() == 2 else advantages[i].expand(length)
            lines = line_of_each_token(text)
            lines += [lines[-1] if lines else 1] * (length - len(lines))  # the EOS token ends the last line
            rows.append(dict(reason=reason, first_wrong=wrong,
                             **region_shares(lines[:length], values.tolist(), wrong)))

    def record_loss_inputs(trainer):  # what reaches TRL's loss, batch by batch
        original = trainer._compute_loss

        def wrapped(model, inputs):
            on_loss(trainer, inputs)
            return original(model, inputs)

        trainer._compute_loss = wrapped

    runner.run(spec["trainer"], spec["config"], seed=seed, learning_rate=1e-30, steps=steps, eval_every=10 ** 6,
               eval_samples=1, test=sums.make_dataset()["test"].select(range(2)), model_path=model_path,
               trainer_kwargs=spec["kwargs"], on_trainer=record_loss_inputs, **spec["fields"])
    return rows


def summarize(rows: list[dict]) -> dict:
    out = {"completions": len(rows)}
    for key in ("tokens", "mass"):
        out[key] = {r: statistics.fmean(row[key][r] for row in rows if row[key][r] is not None) if rows else None
                    for r in REGIONS}
    out["reasons"] = {reason: sum(row["reason"] == reason for row in rows) for reason in {r["reason"] for r in rows}}
    slips = [row for row in rows if row["reason"] == "arithmetic"]
    out["slips"] = {"completions": len(slips),
                    "mass_on": statistics.fmean(r["mass"]["on"] for r in slips if r["mass"]["on"] is not None)
                    if slips else None,
                    "tokens_on": statistics.fmean(r["tokens"]["on"] for r in slips) if slips else None}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--methods", default="grpo,oppo,process")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", default=None)
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    result = {}
    for method in args.methods.split(","):
        rows = [row for seed in args.seeds.split(",") for row in capture(method, int(seed), args.steps, args.model)]
        result[method] = summarize(rows)
        s = result[method]
        print(f"{method}: {s['completions']} incorrect completions; negative mass before/on/after h_o "
              + " / ".join(f"{s['mass'][r]:.2f}" for r in REGIONS) + " vs tokens "
              + " / ".join(f"{s['tokens'][r]:.2f}" for r in REGIONS)
              + f"; slips: mass on the slip line {s['slips']['mass_on']} vs tokens {s['slips']['tokens_on']}",
              flush=True)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(dict(settings=vars(args), methods=result), f, indent=1)


if __name__ == "__main__":
    main()
