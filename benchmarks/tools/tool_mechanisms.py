"""Question: on the tool regime, where does each method put its negative credit, turn by turn, against the first wrong
call? Where do SRPO's resets land? (BENCHMARKS.md §8, docs/testbed.md#the-tool-regime)

**Credit**: for GRPO (uniform: the reference), the process oracle (the environment's turn rewards), OPPO
(self-oracle), PRIME and DATPO (its trees' leaves, as they reach the loss), a few generation batches of the regime's
starting model (learning rate ~0: the same rollouts for every method at a seed) and the advantages that reach TRL's
loss. Every failed episode is split into its model turns (TRL's ``tool_mask``); its first wrong call h_o comes from
the transcript (``keychain.transcript_first_wrong``: the first call that does not copy the last tool result). Per
episode: the share of its negative advantage mass sum(-min(A_t, 0)) on the model's tokens of turns before h_o, on
h_o's turn and after it, beside the share of its model tokens there (what GRPO's uniform credit gives). Tool-result
tokens carry no advantage (docs/multiturn.md).

OPPO's runs also give ``oppo/evidence_auc`` per step: how often a correct episode's total evidence beats a failed
one's of the same prompt (0.5: its self-oracle does not read the answer the hint appends).

**Resets** need no extra run: SRPO's own metrics in the grid's runs (``srpo/localization_exact_rate``: the reset
is the first wrong call's turn; ``..._clean_rate``: at or before it; ``srpo/reset_at_question_rate``), per method,
averaged over its steps and seeds (``--resets``).

    python benchmarks/tools/tool_mechanisms.py [--steps 3] [--seeds 0,1] [--resets]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tiny"))
RESULTS = os.path.join(os.path.dirname(HERE), "results", "tools")
REGIONS = ("before", "on", "after")
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)


def turns_of(tool_mask: list[int]) -> list[tuple[int, int, str]]:
    """``(start, end, kind)`` runs of a completion's tokens: ``"model"`` (tool_mask 1) or ``"tool"`` (0), in order."""
    from trl_credit.core.steps import model_turn_spans, tool_result_spans

    return sorted([(start, end, "model") for start, end in model_turn_spans(tool_mask)]
                  + [(start, end, "tool") for start, end in tool_result_spans(tool_mask)])


def transcript(tokenizer, ids: list[int], runs) -> tuple[list[str], list[tuple[int, int]]]:
    """The episode as SRPO's localization shows it (one step per model turn, its tool results after it) and the token
    span of every model turn."""
    thoughts, spans = [], []
    for start, end, kind in runs:
        text = tokenizer.decode(ids[start:end], skip_special_tokens=False)
        if kind == "model":
            thoughts.append(text)
            spans.append((start, end))
        elif thoughts:
            thoughts[-1] += "".join(f"\nTool result: {r.strip()}" for r in _RESPONSE.findall(text))
    return thoughts, spans


def region_shares(spans, advantages: list[float], first_wrong: int) -> dict:
    """Per region of turns (before / on / after turn ``first_wrong``, 1-indexed): its share of the model's tokens and
    of the negative advantage mass on them."""
    tokens, mass = dict.fromkeys(REGIONS, 0), dict.fromkeys(REGIONS, 0.0)
    for turn, (start, end) in enumerate(spans, start=1):
        region = "before" if turn < first_wrong else "on" if turn == first_wrong else "after"
        tokens[region] += end - start
        mass[region] += sum(max(-a, 0.0) for a in advantages[start:end])
    total_tokens, total_mass = sum(tokens.values()), sum(mass.values())
    return dict(tokens={r: tokens[r] / total_tokens for r in REGIONS},
                mass={r: mass[r] / total_mass if total_mass > 0 else None for r in REGIONS})


def capture(method: str, seed: int, steps: int) -> tuple[list[dict], list[float]]:
    """Per failed episode with a first wrong call: where it is and the region shares; and OPPO's logged
    ``oppo/evidence_auc`` of each step (does its oracle read the answer? empty for other methods)."""
    from transformers import AutoTokenizer

    from trl_credit.tasks.keychain import transcript_first_wrong
    from trl_credit.testbed.tool_regime import tool_regime_model_path
    from trl_credit.testbed.tool_runner import run_tools

    tokenizer = AutoTokenizer.from_pretrained(tool_regime_model_path())
    rows: list[dict] = []

    def on_rows(inputs):
        mask = inputs["completion_mask"] * inputs["tool_mask"]
        for i in range(mask.size(0)):
            length = int(inputs["completion_mask"][i].sum())
            ids = inputs["completion_ids"][i, :length].tolist()
            runs = turns_of(inputs["tool_mask"][i, :length].tolist())
            thoughts, spans = transcript(tokenizer, ids, runs)
            prompt = tokenizer.decode(inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist())
            wrong = transcript_first_wrong(prompt, thoughts) if thoughts else None
            advantages = inputs["advantages"]
            values = (advantages[i, :length] if advantages.dim() == 2 else advantages[i].expand(length)).tolist()
            if wrong is None or not any(v < 0 for v, m in zip(values, mask[i, :length].tolist()) if m):
                continue  # a right episode, or one with no negative credit on its model tokens
            rows.append(dict(first_wrong=wrong, turns=len(spans), **region_shares(spans, values, wrong)))

    from tiny_mechanisms import record_loss_inputs

    result = run_tools(method, seed, 1e-30, steps=steps,
                       on_trainer=lambda trainer: record_loss_inputs(trainer, on_rows), evaluate_at_end=False)
    return rows, [log["oppo/evidence_auc"] for log in result["logs"] if "oppo/evidence_auc" in log]


def summarize(rows: list[dict]) -> dict:
    out = dict(episodes=len(rows), mean_turns=statistics.fmean(r["turns"] for r in rows) if rows else None)
    for kind in ("tokens", "mass"):
        out[kind] = {region: statistics.fmean(v) if (v := [r[kind][region] for r in rows
                                                            if r[kind][region] is not None]) else None
                     for region in REGIONS}
    return out


def reset_landing(runs_dir: str) -> dict:
    """Per SRPO method of the grid: its localization metrics averaged over every logged step of every run."""
    keys = ("srpo/localization_exact_rate", "srpo/localization_clean_rate", "srpo/reset_at_question_rate",
            "srpo/localization_deviation", "srpo/replay_mismatch_rate", "srpo/fallback_rate")
    by_method: dict = {}
    for phase in ("sweep_30steps", "sweep", "runs"):  # the 30-step sweep ran SRPO first
        folder = os.path.join(runs_dir, phase)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            with open(os.path.join(folder, name)) as f:
                run = json.load(f)
            if not run["method"].startswith(("srpo", "rrpo")):
                continue
            for log in run["logs"]:
                for key in keys:
                    if log.get(key) is not None:
                        by_method.setdefault(run["method"], {}).setdefault(key, []).append(log[key])
    return {m: {k.split("/")[1]: round(statistics.fmean(v), 3) for k, v in values.items()}
            for m, values in by_method.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["grpo", "process", "oppo"])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--resets", action="store_true", help="only the reset landing from the grid's runs")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    path = os.path.join(RESULTS, "mechanisms.json")
    saved = json.load(open(path)) if os.path.exists(path) else {}
    if not args.resets:
        credit = {}
        for method in args.methods:
            captured = [capture(method, seed, args.steps) for seed in map(int, args.seeds.split(","))]
            credit[method] = summarize([row for rows, _ in captured for row in rows])
            aucs = [auc for _, step_aucs in captured for auc in step_aucs]
            if aucs:  # OPPO: the steps' mean (0.5: its oracle does not read the answer)
                credit[method]["evidence_auc"] = dict(mean=statistics.fmean(aucs), steps=len(aucs))
            print(method, json.dumps(credit[method]), flush=True)
        previous = saved.get("credit", {})
        if (previous.get("steps"), previous.get("seeds")) != (args.steps, args.seeds):
            previous = {}  # other settings: the methods run before are not comparable
        saved["credit"] = dict(previous, **credit, steps=args.steps, seeds=args.seeds)  # the methods rerun replaced
    saved["resets"] = reset_landing(RESULTS)
    print(json.dumps(saved["resets"], indent=1))
    with open(path, "w") as f:
        json.dump(saved, f, indent=1)


if __name__ == "__main__":
    main()
