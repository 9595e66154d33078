"""Question: Do SRPO's shared-prefix rows get more per-token signal, and where do its resets land (Fig. 3)?

SRPO's mechanism on SmolLM2 (paper Fig. 3 / Appendix G): per-token gradient signal of shared-prefix rows vs base
rows over a short training run, correction rate vs base pass rate, and where the resets land (h*/H).

A short SRPOTrainer run (``--steps`` optimizer steps, LoRA) on the built-in arithmetic task. At every step the
script records the rows TRL trains on (``_generate_and_score_completions``: advantages (B,), completion_mask,
tool_mask, the rewards TRL computed), scores π_θ(y_t | ·) of every trained token with the current policy (TRL's
log-prob pass, before the optimizer step), and records the reset of every seed (``reset_prefix_length``: h* and the
number of thoughts H) and every decoded localization verdict (``parse_reset_step``: parsed or not; only with
``--localization generate``, the scored choice has no answer to parse).

- Per-token signal (paper §5 / App. G): g_{i,t} = (|Â_i| / T_i)(1 − π_θ(y_{i,t} | ·)), T_i = the row's active
  tokens (suffix length for shared-prefix rows, full length for base rows), averaged over each row's active tokens
  and compared on prompts where both the base group and a shared-prefix group deliver gradient (some nonzero
  advantage in each), as App. G does.
- Correction rate (share of correct suffixes) against the prompt's base pass rate.
- h*/H of the resets, and the localization parse rate (``--reset random`` runs RRPO instead).

    python benchmarks/mechanisms/mechanism_srpo.py                   # 4 prompts x 8 rows, 3 steps, 64 tokens (~8 min CPU)
    python benchmarks/mechanisms/mechanism_srpo.py --reset random --output benchmarks/results/mechanism_rrpo.json

With ``--task chain`` (the warm-started ``smollm2-135m-chain``, the chain step checker on; ``--reset oracle`` is
the checker-placed control) the script also records every reset against the checker's first wrong thought h_o
(``_choose_resets``: h* before / exactly at / after h_o) and splits the correction rate by a clean (h* <= h_o) or
erroneous (h* > h_o) kept prefix (paper Fig. 4), and writes ``mechanism_<srpo|rrpo|srpo_oracle>_chain.*``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

from harness import mechanisms as common  # noqa: E402
import torch  # noqa: E402

ROW_BASE, ROW_SUFFIX, ROW_FALLBACK = "base", "suffix", "fallback"


def row_kinds(trainer, num_rows: int) -> list[str]:
    """Kind of each row from the documented layout: per prompt, ``num_base_generations`` base rows then each reset
    group's ``suffixes_per_reset`` rows (trl_credit/srpo/advantages.py ``srpo_group_ids``); fallback rows are told
    apart later by an all-zero loss mask."""
    args = trainer.args
    size, base = trainer.num_generations, args.num_base_generations
    return [ROW_BASE if i % size < base else ROW_SUFFIX for i in range(num_rows)]


def per_token_signal(trainer, inputs, output) -> dict:
    """π_θ of every completion token under the current policy, and the rows' loss masks, for g_{i,t}."""
    from trl_credit.core.scoring import score_completions

    with torch.no_grad():
        logps, _ = score_completions(trainer, trainer.model, output["prompt_ids"], output["prompt_mask"],
                                     output["completion_ids"], output["completion_mask"])
    return dict(token_probs=logps.exp().detach().cpu())


def analyse_step(trainer, record: dict) -> dict:
    out = record["output"]
    advantages = out["advantages"].double()
    mask = out["completion_mask"].double()
    if "tool_mask" in out:
        mask = mask * out["tool_mask"].double()
    probs = record["token_probs"].double()
    rewards = record["rewards"][-1]
    success = common.success_of(trainer, rewards).tolist()
    num_rows = advantages.numel()
    kinds = row_kinds(trainer, num_rows)
    size, base = trainer.num_generations, trainer.args.num_base_generations
    suffixes = trainer.args.suffixes_per_reset
    rows = []
    for i in range(num_rows):
        active = int(mask[i].sum())
        kind = kinds[i] if active else ROW_FALLBACK
        g = None
        if active:
            per_token = (advantages[i].abs() / active) * (1 - probs[i])
            g = float((per_token * mask[i]).sum() / active)
        rows.append(dict(prompt=i // size, kind=kind, active_tokens=active, advantage=float(advantages[i]),
                         correct=bool(success[i]), signal=g,
                         group=(i // size, "base" if i % size < base else f"reset{(i % size - base) // suffixes}")))
    prompts = []
    for p in range(num_rows // size):
        mine = [r for r in rows if r["prompt"] == p]
        base_rows = [r for r in mine if r["kind"] == ROW_BASE]
        suffix_rows = [r for r in mine if r["kind"] == ROW_SUFFIX]
        base_signal = any(r["advantage"] != 0 for r in base_rows)
        suffix_signal = any(r["advantage"] != 0 for r in suffix_rows)
        prompts.append(dict(
            prompt=p, base_pass_rate=common.mean(r["correct"] for r in base_rows),
            correction_rate=common.mean(r["correct"] for r in suffix_rows) if suffix_rows else None,
            both_deliver=base_signal and suffix_signal,
            base_signal=common.mean(r["signal"] for r in base_rows if r["signal"] is not None),
            suffix_signal=common.mean(r["signal"] for r in suffix_rows if r["signal"] is not None),
            base_active_tokens=common.mean(r["active_tokens"] for r in base_rows),
            suffix_active_tokens=common.mean(r["active_tokens"] for r in suffix_rows) if suffix_rows else None,
        ))
    return dict(rows=rows, prompts=prompts)


def chain_resets(recorder, steps, trainer) -> dict:
    """Every reset vs the checker (h*, h_o, H) and the correction rate of its suffix rows; the resets of a step are
    in prompt order and fill the reset slots of their prompt in order (``Resets._training_rows``, srpo/parts.py)."""
    size, base, suffixes = trainer.num_generations, trainer.args.num_base_generations, trainer.args.suffixes_per_reset
    out = []
    for step, (_, _, resets) in zip(steps, recorder.calls["_choose_resets"]):
        slot_of = {}
        for reset in resets:
            slot = slot_of.get(reset.group, 0)
            slot_of[reset.group] = slot + 1
            first = reset.group * size + base + slot * suffixes
            rows = step["rows"][first:first + suffixes]
            out.append(dict(h=int(reset.step), h_o=reset.oracle, H=len(reset.ends),
                            position=common.reset_position(reset.step, reset.oracle),
                            source=getattr(reset, "source", None),
                            clean=None if reset.oracle is None else reset.step <= reset.oracle,
                            suffixes_correct=sum(r["correct"] for r in rows if r["kind"] == ROW_SUFFIX),
                            suffixes=sum(r["kind"] == ROW_SUFFIX for r in rows)))
    return dict(summary=common.reset_summary(out), resets=out)


def plot_chain(chain: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, resets = chain["summary"], chain["resets"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    checked = [r for r in resets if r["h_o"] is not None]
    if checked:
        ax.scatter([r["h_o"] + 0.1 * ((i % 5) - 2) for i, r in enumerate(checked)], [r["h"] for r in checked],
                   alpha=0.6, color="tab:orange")
        top = max(max(r["h"] for r in checked), max(r["h_o"] for r in checked)) + 1
        ax.plot([0.5, top], [0.5, top], "k--", lw=1, label="h* = h_o (exact)")
        ax.legend(fontsize=8)
    ax.set_xlabel("checker's first wrong step h_o")
    ax.set_ylabel("reset step h*")
    ax.set_title(f"Reset vs checker ({summary['checked']} checked resets)")
    ax = axes[1]
    names = ("before", "exact", "after")
    n = max(summary["checked"], 1)
    ax.bar(names, [summary[p] / n for p in names], color=["tab:green", "tab:blue", "tab:red"])
    for i, p in enumerate(names):
        ax.text(i, summary[p] / n + 0.02, str(summary[p]), ha="center")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share of checked resets")
    ax.set_title("h* before / at / after h_o (before or at = clean prefix)")
    ax = axes[2]
    bars = [summary["correction_clean_prefix"], summary["correction_erroneous_prefix"]]
    values = [b["rate"] if b["rate"] is not None else 0 for b in bars]
    errors = [[v - b["ci95"][0] if b["ci95"] else 0 for v, b in zip(values, bars)],
              [b["ci95"][1] - v if b["ci95"] else 0 for v, b in zip(values, bars)]]
    ax.bar(["clean prefix", "erroneous prefix"], values, yerr=errors, capsize=6, color=["tab:green", "tab:red"])
    for i, b in enumerate(bars):
        ax.text(i, 0.02, f"{b['correct']}/{b['suffixes']}", ha="center", color="white")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("correction rate (correct suffixes; 95% Wilson CI)")
    ax.set_title("Correction by prefix quality (paper Fig. 4)")
    common.save_figure(fig, path, title)


def plot(steps: list[dict], resets: list[dict], summary: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for s, step in enumerate(steps, 1):
        for kind, color, dx in ((ROW_BASE, "tab:blue", -0.12), (ROW_SUFFIX, "tab:red", 0.12)):
            values = [r["signal"] for r in step["rows"] if r["kind"] == kind and r["signal"] and r["advantage"] != 0]
            ax.scatter([s + dx] * len(values), values, color=color, alpha=0.5, s=14,
                       label=("base rows" if kind == ROW_BASE else "shared-prefix (suffix) rows") if s == 1 else None)
            if values:
                ax.plot([s + dx - 0.08, s + dx + 0.08], [common.mean(values)] * 2, color=color, lw=2.5)
    ax.set_xticks(range(1, len(steps) + 1))
    ax.set_xlabel("training step")
    ax.set_ylabel("mean per-token signal g = (|Â|/T)(1 − π(y_t)) per row")
    ax.set_yscale("log")
    ax.set_title("Per-token gradient signal (rows with Â ≠ 0; bar = mean)")
    ax.legend(fontsize=8)

    ax = axes[1]
    points = [(p["base_pass_rate"], p["correction_rate"]) for step in steps for p in step["prompts"]
              if p["correction_rate"] is not None]
    if points:
        ax.scatter([x for x, _ in points], [y for _, y in points], color="tab:purple", alpha=0.6)
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="correction rate = base pass rate")
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("base pass rate of the prompt")
    ax.set_ylabel("correction rate (correct suffixes from the failed seed)")
    ax.set_title(f"Correction vs base pass rate (means {summary['correction_rate']:.2f} vs "
                 f"{summary['base_pass_rate']:.2f})")
    ax.legend(fontsize=8)

    ax = axes[2]
    positions = [r["h_over_H"] for r in resets]
    if positions:
        ax.hist(positions, bins=[i / 10 for i in range(11)], color="tab:orange", edgecolor="black")
    parse = summary["localization_parse_rate"]
    parse_text = "n/a (no decoded answer)" if parse is None else f"{parse:.2f}"
    ax.set_xlabel("h* / H (reset thought / thoughts in the seed)")
    ax.set_ylabel("resets")
    ax.set_title(f"Where resets land; localization parse rate {parse_text}")
    common.save_figure(fig, path, title)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    common.add_common_arguments(parser, prompts=4, generations=8, tokens=64, temperature=0.7, steps=3)
    # (--train is accepted for symmetry with the other scripts: SRPO's run always trains)
    parser.add_argument("--reset", choices=["self", "random", "oracle"], default="self",
                        help="SRPO (self), RRPO (random), or the checker's reset (oracle; --task chain only)")
    parser.add_argument("--localization", choices=["scored", "generate"], default="scored",
                        help="SRPO's localization (SRPOConfig.localization): scored choice or decoded answer")
    args = parser.parse_args(argv)
    if args.reset == "oracle" and not common.is_chain(args):
        parser.error("--reset oracle needs the chain step checker: add --task chain")
    method_name = {"self": "srpo", "random": "rrpo", "oracle": "srpo_oracle"}[args.reset]
    json_path, png_path = common.output_paths(args, method_name)
    start = time.perf_counter()

    import trl_credit.srpo.localize as srpo_localize
    import trl_credit.srpo.parts as srpo_parts

    recorder = common.Recorder()
    recorder.wrap(srpo_parts, "reset_prefix_length")
    if args.reset == "self":
        recorder.wrap(srpo_localize, "parse_reset_step")
    trainer = common.build_trainer("srpo", args, own=dict(reset=args.reset, localization=args.localization))
    recorder.attach(trainer, per_token_signal)
    if common.is_chain(args):
        recorder.wrap(trainer.rollout, "_choose_resets")
    seconds = common.collect(trainer, args.steps, train=True)
    recorder.unpatch()

    steps = [analyse_step(trainer, record) for record in recorder.batches]
    resets = []
    for a, k, kept in recorder.calls["reset_prefix_length"]:
        ends, step = a[0], (a[1] if len(a) > 1 else k["reset_step"])
        resets.append(dict(h=int(step), H=len(ends), h_over_H=int(step) / len(ends), kept_tokens=int(kept)))
    verdicts = [result is not None for _, _, result in recorder.calls.get("parse_reset_step", [])]

    both = [p for step in steps for p in step["prompts"] if p["both_deliver"]]
    all_rows = [r for step in steps for r in step["rows"]]
    summary = dict(
        prompts_both_deliver=len(both),
        prompts_total=sum(len(step["prompts"]) for step in steps),
        suffix_signal_mean=common.mean(p["suffix_signal"] for p in both),
        base_signal_mean=common.mean(p["base_signal"] for p in both),
        share_prompts_suffix_higher=common.mean(p["suffix_signal"] > p["base_signal"] for p in both),
        per_step=[dict(step=s + 1,
                       suffix_signal=common.mean(p["suffix_signal"] for p in step["prompts"] if p["both_deliver"]),
                       base_signal=common.mean(p["base_signal"] for p in step["prompts"] if p["both_deliver"]),
                       both_deliver=sum(p["both_deliver"] for p in step["prompts"]))
                  for s, step in enumerate(steps)],
        # pooled over every row with a nonzero advantage (all prompts and steps)
        suffix_signal_rows=common.mean(r["signal"] for r in all_rows
                                       if r["kind"] == ROW_SUFFIX and r["advantage"] != 0),
        base_signal_rows=common.mean(r["signal"] for r in all_rows if r["kind"] == ROW_BASE and r["advantage"] != 0),
        suffix_active_tokens=common.mean(r["active_tokens"] for r in all_rows if r["kind"] == ROW_SUFFIX),
        base_active_tokens=common.mean(r["active_tokens"] for r in all_rows if r["kind"] == ROW_BASE),
        correction_rate=common.mean(r["correct"] for r in all_rows if r["kind"] == ROW_SUFFIX),
        base_pass_rate=common.mean(r["correct"] for r in all_rows if r["kind"] == ROW_BASE),
        fallback_rows=sum(r["kind"] == ROW_FALLBACK for r in all_rows),
        resets=len(resets),
        reset_at_question=common.mean(r["h"] == 1 for r in resets) if resets else None,
        mean_h_over_H=common.mean(r["h_over_H"] for r in resets) if resets else None,
        localization_attempts=len(verdicts),
        localization_parse_rate=(sum(verdicts) / len(verdicts)) if verdicts else None,
    )
    metrics = {k: v for k, v in common.harness.last_metrics(trainer).items() if k.startswith("srpo/")}
    payload = dict(settings=common.settings_of(args, trainer), seconds=time.perf_counter() - start,
                   train_seconds=seconds, summary=summary, trainer_metrics_last_step=metrics, resets=resets,
                   steps=steps, log_history=trainer.state.log_history)
    if common.is_chain(args):
        # raw resets first (h*, h_o, H, prompt), so a failure of the analysis below loses no run
        payload["chain_raw"] = [[dict(group=r.group, h=r.step, h_o=r.oracle, H=len(r.ends), source=r.source)
                                 for r in result] for _, _, result in recorder.calls["_choose_resets"]]
        common.write_json(json_path, payload)
        payload["chain"] = chain_resets(recorder, steps, trainer)
        common.write_json(json_path, payload)
        c = payload["chain"]["summary"]
        plot_chain(payload["chain"], png_path,
                   f"{method_name.upper()} on {common.task_label(args)}: {args.steps} steps x {args.prompts} prompts, "
                   f"{c['resets']} resets vs the chain step checker")
        print(f"  vs checker: {c['checked']} checked resets: before {c['before']}, exact {c['exact']}, after "
              f"{c['after']} (mean h*-h_o {c['mean_deviation']}); correction clean prefix "
              f"{c['correction_clean_prefix']}, erroneous {c['correction_erroneous_prefix']}")
        print(f"wrote {json_path} and {png_path}")
        return payload
    common.write_json(json_path, payload)
    plot(steps, resets, summary, png_path,
         f"{method_name.upper()} on SmolLM2-135M + LoRA, {args.steps} steps x {args.prompts} arithmetic prompts, "
         f"{args.generations} rows per prompt ({trainer.args.num_base_generations} base + "
         f"{trainer.args.reset_groups}x{trainer.args.suffixes_per_reset} suffixes)")
    print(f"{method_name.upper()} mechanism over {args.steps} steps: per-token signal on prompts where both groups "
          f"deliver gradient ({summary['prompts_both_deliver']}/{summary['prompts_total']}): suffix rows "
          f"{summary['suffix_signal_mean']:.4f} vs base rows {summary['base_signal_mean']:.4f} (suffix higher on "
          f"{summary['share_prompts_suffix_higher']:.2f} of them); active tokens suffix "
          f"{summary['suffix_active_tokens']:.1f} vs base {summary['base_active_tokens']:.1f}")
    print(f"  correction rate {summary['correction_rate']:.3f} vs base pass rate {summary['base_pass_rate']:.3f}; "
          f"{summary['resets']} resets, mean h*/H {summary['mean_h_over_H']}, at the question "
          f"{summary['reset_at_question']}; localization parse rate {summary['localization_parse_rate']} "
          f"({summary['localization_attempts']} attempts); fallback rows {summary['fallback_rows']}")
    print(f"wrote {json_path} and {png_path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
