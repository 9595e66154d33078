"""Question: Where do the token credit and DATPO's forks land on the tiny testbed, against the step checker?

Where the token credit lands on the tiny testbed, against the step checker (BENCHMARKS.md section 4).

For OPPO (self-oracle), the process credit (the checker's own step rewards) and GRPO (uniform, the reference), a
few generation batches of the testbed model (learning rate 0: the rollouts of the starting model, the same for every
method at a seed) and the advantages that reach TRL's loss. For every incorrect completion whose first wrong line
h_o the checker finds (a slip, an off-path digit, a missing answer line is left out: no token lies on it), the
share of its negative advantage mass sum(-min(A_t, 0)) on tokens before h_o, on h_o and after it, against the share
of its tokens there (what GRPO's uniform credit gives). The paper's claim (OPPO §3.3, Fig. 1a) is that the recursion
concentrates credit on the pivotal tokens: here, on the slip.

For DATPO (``--forks``): where the chosen forks of its incorrect base rollouts lie against the checker's first
wrong line h_o (before / on / after, next to where the line starts are: what a uniform choice among them would
give), and how often a branch grown from each region ends correct. A branch from a line before h_o can still
avoid the error; one from a line after it inherits it. DATPO's claim (§3.2, App. D.1) is that high-entropy
sentence starts are where a rollout's outcome is decided, so its forks should not land after h_o more often than
a uniform choice.

On the trap regime (``--regime trap``) an arithmetic error on h_o is also classified as the **trap step** (a step
adding a digit of the recipe's ``trap_digits`` written one too high: the error the building data taught) or another
slip, and the mass on h_o is reported for the trap steps apart.

    python benchmarks/tiny/tiny_mechanisms.py [--steps 3] [--seeds 0,1] [--forks] [--regime trap]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

REGIONS = ("before", "on", "after")
RESULTS_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def trap_step(text: str, line_number: int, trap_digits: str) -> bool:
    """Whether step line ``line_number`` (1-indexed over non-empty lines) of ``text`` is the trap regime's systematic
    error: ``x+y=z`` with y a trap digit and z one too high (trl_credit.testbed.model.trapped_solution). Lines are
    numbered as the step checker numbers them (sums.step_line)."""
    from trl_credit.tasks import sums

    step = sums.step_line(text, line_number) if trap_digits else None
    if step is None:
        return False
    x, y, z = step
    return str(y) in trap_digits and z == (x + y + 1) % 10


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


def run_starting_model(method: str, seed: int, steps: int, model_path: str | None, on_trainer) -> None:
    """``steps`` generation batches of the starting model (learning rate ~0: the same rollouts for every method at a
    seed), no evaluation to speak of; ``on_trainer(trainer)`` attaches the recorder."""
    from trl_credit.tasks import sums
    from trl_credit.testbed import runner

    spec = runner.method_spec(method)
    runner.run(spec["trainer"], spec["config"], seed=seed, learning_rate=1e-30, steps=steps, eval_every=10 ** 6,
               eval_samples=1, test=sums.make_dataset()["test"].select(range(2)), model_path=model_path,
               trainer_kwargs=spec["kwargs"], on_trainer=on_trainer, **spec["fields"])


def capture(method: str, seed: int, steps: int, model_path: str | None, trap_digits: str = "") -> list[dict]:
    """Per incorrect completion with a checkable first wrong line: its reason and region shares."""
    from trl_credit.tasks import sums
    from trl_credit.testbed.model import make_tokenizer

    tokenizer = make_tokenizer()
    rows: list[dict] = []

    def on_rows(inputs):
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
                             trap=reason == "arithmetic" and trap_step(text, wrong, trap_digits),
                             **region_shares(lines[:length], values.tolist(), wrong)))

    run_starting_model(method, seed, steps, model_path, lambda trainer: record_loss_inputs(trainer, on_rows))
    return rows


def record_loss_inputs(trainer, on_rows) -> None:
    """Call ``on_rows(inputs)`` with what reaches TRL's loss: every training row once (num_iterations 1)."""
    if hasattr(trainer, "add_credit_callback"):  # the credit core's trainers: TRL's training batch, per batch
        trainer.add_credit_callback(lambda step: on_rows(step.output))
        return
    # TRL's own GRPOTrainer (the grpo control) has no on_credit: its micro-batches as they reach the loss
    original = trainer._compute_loss

    def wrapped(model, inputs):
        on_rows(inputs)
        return original(model, inputs)

    trainer._compute_loss = wrapped


def capture_forks(seed: int, steps: int, model_path: str | None) -> list[dict]:
    """Per incorrect DATPO base rollout with a first wrong line h_o and at least one fork: the line (h) of every
    chosen fork and of every line start, and each branch's fork line and verdict."""
    from trl_credit.tasks import sums
    from trl_credit.testbed.model import make_tokenizer

    tokenizer = make_tokenizer()
    rows: list[dict] = []

    def on_trees(trainer, trees):
        shift = 1 if trainer.args.fork_position == "after_token" else 0  # a fork keeps its sentence's first token
        for i, (prompt_ids, ids, forks) in enumerate(zip(trees.prompt_ids, trees.completion_ids, trees.forks)):
            text = tokenizer.decode(ids).replace(tokenizer.eos_token, "")
            wrong, reason, _ = sums.check_steps(tokenizer.decode(prompt_ids), text)
            if not forks or wrong is None or reason in ("no answer", "text after answer"):
                continue
            lines = line_of_each_token(text)
            lines += [lines[-1] if lines else 1] * (len(ids) - len(lines))
            starts = [lines[j] for j in range(len(lines)) if j == 0 or lines[j] > lines[j - 1]]
            at = [lines[min(max(f - shift, 0), len(lines) - 1)] for f in forks]  # the line each fork lies on
            branches = [dict(line=at[j], correct=bool(trees.branch_success[b]))  # branch_meta: (base row, fork index)
                        for b, (row, j) in enumerate(trees.branch_meta) if row == i]
            rows.append(dict(first_wrong=wrong, reason=reason, starts=starts, branches=branches,
                             forks=at))

    def record_trees(trainer):
        original = trainer.rollout.grow

        def wrapped(*args, **kwargs):
            trees = original(*args, **kwargs)
            on_trees(trainer, trees)
            return trees

        trainer.rollout.grow = wrapped

    run_starting_model("datpo", seed, steps, model_path, record_trees)
    return rows


def region_of(line: int, first_wrong: int) -> str:
    return "before" if line < first_wrong else "on" if line == first_wrong else "after"


def summarize_forks(rows: list[dict]) -> dict:
    forks = [region_of(h, r["first_wrong"]) for r in rows for h in r["forks"]]
    starts = [region_of(h, r["first_wrong"]) for r in rows for h in r["starts"]]
    branches = [(region_of(b["line"], r["first_wrong"]), b["correct"]) for r in rows for b in r["branches"]]
    share = lambda xs: {k: xs.count(k) / len(xs) if xs else None for k in REGIONS}  # noqa: E731
    grown = {k: [c for g, c in branches if g == k] for k in REGIONS}
    return dict(incorrect_forked_rollouts=len(rows), forks=len(forks), fork_share=share(forks),
                line_start_share=share(starts),
                branches={k: len(v) for k, v in grown.items()},
                branch_correct_rate={k: (sum(v) / len(v) if v else None) for k, v in grown.items()})


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
    traps = [row for row in rows if row.get("trap")]  # the trap regime's systematic step (trap_step)
    out["trap_share_of_first_errors"] = len(traps) / len(rows) if rows else None
    out["trap_steps"] = {"completions": len(traps),
                         "mass_on": statistics.fmean(r["mass"]["on"] for r in traps if r["mass"]["on"] is not None)
                         if traps else None,
                         "tokens_on": statistics.fmean(r["tokens"]["on"] for r in traps) if traps else None}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--methods", default="grpo,oppo,process")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--regime", default="tiny", help="the testbed regime (its committed model and results folder)")
    parser.add_argument("--model", default=None, help="default: benchmarks/results/<regime>/model")
    parser.add_argument("--output", default=None, help="default: benchmarks/results/<regime>/mechanisms.json")
    parser.add_argument("--forks", action="store_true", help="also DATPO's forks against the first wrong line")
    args = parser.parse_args(argv)
    import torch

    from trl_credit.testbed.regimes import regime_recipe

    torch.set_num_threads(1)
    committed = os.path.join(RESULTS_ROOT, args.regime, "model")
    args.model = args.model or (committed if os.path.exists(committed) else None)
    args.output = args.output or os.path.join(RESULTS_ROOT, args.regime, "mechanisms.json")
    trap_digits = regime_recipe(args.regime).trap_digits
    result = {}
    if args.forks:
        rows = [row for seed in args.seeds.split(",") for row in capture_forks(int(seed), args.steps, args.model)]
        result["datpo_forks"] = s = summarize_forks(rows)
        fmt = lambda d: " / ".join("-" if d[r] is None else f"{d[r]:.2f}" for r in REGIONS)  # noqa: E731
        print(f"datpo: {s['forks']} forks in {s['incorrect_forked_rollouts']} incorrect rollouts; forks before/on/"
              f"after h_o {fmt(s['fork_share'])} vs line starts {fmt(s['line_start_share'])}; branches correct "
              f"{fmt(s['branch_correct_rate'])} (n {s['branches']})", flush=True)
    for method in filter(None, args.methods.split(",")):
        rows = [row for seed in args.seeds.split(",") for row in capture(method, int(seed), args.steps, args.model, trap_digits)]
        result[method] = summarize(rows)
        s = result[method]
        print(f"{method}: {s['completions']} incorrect completions; negative mass before/on/after h_o "
              + " / ".join(f"{s['mass'][r]:.2f}" for r in REGIONS) + " vs tokens "
              + " / ".join(f"{s['tokens'][r]:.2f}" for r in REGIONS)
              + f"; slips: mass on the slip line {s['slips']['mass_on']} vs tokens {s['slips']['tokens_on']}"
              + (f"; trap steps ({s['trap_share_of_first_errors']:.2f} of first errors): mass on them "
                 f"{s['trap_steps']['mass_on']} vs tokens {s['trap_steps']['tokens_on']}" if trap_digits else ""),
              flush=True)
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(dict(settings=vars(args), methods=result), f, indent=1)


if __name__ == "__main__":
    main()
