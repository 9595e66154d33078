"""Question: Does OPPO's value recursion put the credit where the paper says (Fig. 1a)?

OPPO's mechanism on SmolLM2 rollouts (paper Fig. 1a and §3.3): where the Bayesian value recursion puts credit.

One or more generation batches of OPPOTrainer (self-oracle, no training) on the built-in arithmetic task. For every
completion the script records what the trainer's recursion computed (``bayesian_value_recursion``, paper Eq. 10/20:
running value V_t, evidence log λ_t, clipped tokens) and the per-token advantages the trainer hands TRL's loss, and
reports:

- V_t along the normalized position for correct vs incorrect completions (paper §3.3: V_t commits, towards 1 on
  correct and 0 on incorrect trajectories), and the final value V_{T+1} against the prior V_0;
- the cumulative share of |A_t| (anchored advantage before group normalization) and of |log λ_t| along the
  normalized position, correct and incorrect separately, against GRPO's uniform share (the diagonal; paper Fig. 1a:
  |A_t| rises more steeply than |log λ_t|, the gap widest on incorrect trajectories);
- concentration: the share of a completion's |A| mass carried by its top 20% tokens (uniform = 20%), for the
  recursion's |Â_t| and the normalized advantages the loss uses;
- the evidence clip rate (share of tokens with |o_t − s_t| > C).

    python benchmarks/mechanisms/mechanism_oppo.py                 # 4 prompts x 8 rollouts, 64 tokens, 1 batch (~2 min CPU)
    python benchmarks/mechanisms/mechanism_oppo.py --steps 2 --prompts 8

With ``--task chain`` (``smollm2-135m-chain``) it also asks whether the recursion finds the error: in every
incorrect completion with a signal, the chain step checker's first wrong step h_o splits the tokens (mapped to their
lines, ``harness.mechanisms.line_of_token``) into before / on / after h_o, and the script reports the share of the
negative advantage mass (loss advantages and the recursion's anchored Â_t) in each region against the share of
tokens in it (what uniform credit, GRPO, would give). ``--process`` adds, on the same rollouts, the credit of
``credit="process"`` with the chain step checker (docs/process.md: step rewards 1 before the first wrong line, 0 from
it on, normalized over the group's steps, each token the sum over its own and later steps; DeepSeekMath §4.1.3), the
checker's oracle token credit beside OPPO's, and the mean credit per token by line relative to h_o for both.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

from harness import mechanisms as common  # noqa: E402
import torch  # noqa: E402

GRID = 21


def cumulative_share(magnitudes: list[float], grid: int = GRID) -> list[float]:
    """Share of the total mass reached by normalized position p (0 at p=0, 1 at p=1), sampled on ``grid`` points.
    Token t covers the interval [t/T, (t+1)/T]; mass inside a token's interval is spread evenly."""
    total = sum(magnitudes)
    n = len(magnitudes)
    if n == 0 or total <= 0:
        return [float("nan")] * grid
    cumulative = [0.0]
    for m in magnitudes:
        cumulative.append(cumulative[-1] + m / total)
    return common.interpolate(cumulative, grid)


def top_share(magnitudes: list[float], fraction: float = 0.2) -> float:
    """Share of the mass carried by the ceil(fraction·T) largest tokens (uniform credit: ≈ fraction)."""
    total = sum(magnitudes)
    if not magnitudes or total <= 0:
        return float("nan")
    k = max(1, math.ceil(fraction * len(magnitudes)))
    return sum(sorted(magnitudes, reverse=True)[:k]) / total


def analyse(records: list[dict]) -> dict:
    """Per-completion curves and summaries from the recorded batches."""
    rows = []
    for record in records:
        credit = record["credit"]
        mask = record["output"]["completion_mask"].bool()
        final_advantages = record["output"]["advantages"]
        success = record["success"]
        for i in range(mask.size(0)):
            length = int(mask[i].sum())
            if length == 0:
                continue
            values = credit["values"][i, :length].tolist()
            log_lambda = credit["log_lambda"][i, :length].tolist()
            anchored = credit["advantages"][i, :length].abs().tolist()
            normalized = final_advantages[i, :length].abs().tolist()
            prior = float(credit["prior_values"][i])
            final_log_odds = math.log(prior / (1 - prior)) + sum(log_lambda)  # ℓ_{T+1}
            final_value = 1 / (1 + math.exp(-min(max(final_log_odds, -700), 700)))
            rows.append(dict(
                correct=bool(success[i]), length=length, prior_value=prior, final_value=final_value,
                seq_advantage=float(credit["seq_advantages"][i]),
                values=values, clipped=int(credit["clipped"][i, :length].sum()),
                top20_anchored=top_share(anchored), top20_normalized=top_share(normalized),
                top20_log_lambda=top_share([abs(x) for x in log_lambda]),
                cum_anchored=cumulative_share(anchored), cum_log_lambda=cumulative_share([abs(x) for x in log_lambda]),
                cum_normalized=cumulative_share(normalized),
                value_curve=common.interpolate(values + [final_value], GRID),  # V_1..V_T, V_{T+1}
            ))
    return rows


REGIONS = common.REGIONS


def region_shares(lines: list[int], advantages: list[float], first_wrong: int) -> dict:
    """Share of the negative advantage mass sum(-min(A_t, 0)) and of the tokens before / on / after the first wrong
    line (tokens before the first line, line 0, count as before it). Mass shares are None when no token has A_t < 0.
    """
    region = [common.region_of(line, first_wrong) for line in lines]
    negative = [max(-a, 0.0) for a in advantages]
    total = sum(negative)
    return dict(tokens={r: region.count(r) / len(region) for r in REGIONS},
                mass={r: (sum(m for m, g in zip(negative, region) if g == r) / total if total > 0 else None)
                      for r in REGIONS})


def process_credit(records: list[dict], tokenizer, group_size: int, delimiter: str = "\n") -> None:
    """``record["process"]``: per row, the token advantages ``credit="process"`` gives it with the chain step
    checker (trl_credit/process/parts.py's ProcessCredit on every row: the chain rewards score every row, and TRL's
    default ``scale_rewards="group"``), computed from the recorded completions with the library's pure functions.
    Rows ``k * group_size .. (k + 1) * group_size - 1`` are one prompt's group (TRL's order, checked)."""
    from trl_credit.process.advantages import normalized_step_rewards, token_advantages
    from trl_credit.process.step_rewards import chain_step_rewards
    from trl_credit.core.steps import split_thoughts, thought_texts

    for record in records:
        output, inputs = record["output"], record["inputs"]
        mask = output["completion_mask"].bool()
        rows = []
        for i in range(mask.size(0)):
            if inputs[i]["question"] != inputs[i - i % group_size]["question"]:
                raise SystemExit(f"row {i} is not in its group of {group_size} (another question): update this script.")
            ids = output["completion_ids"][i][mask[i]].tolist()
            ends = split_thoughts(ids, tokenizer, delimiter)
            text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            columns = {key: value for key, value in inputs[i].items() if key != "prompt"}
            steps = thought_texts(ids, ends, tokenizer, delimiter) if ends else []
            rows.append((ids, ends, chain_step_rewards(inputs[i]["prompt"], text, steps, **columns)))
        normalized = normalized_step_rewards([r[2] for r in rows], [i // group_size for i in range(len(rows))])
        record["process"] = [token_advantages(ends, values, len(ids)) for (ids, ends, _), values in zip(rows, normalized)]


OFFSETS = range(-3, 4)  # line - h_o in the per-line profile


def line_profile(lines: list[int], advantages: list[float], first_wrong: int) -> dict:
    """Mean advantage per token on each line at offset line - h_o (OFFSETS; the tokens before the first line count
    as line 0), in units of the completion's mean |A_t| so that credits of different scales compare; offsets with
    no token are left out. Empty when every advantage is 0."""
    scale = sum(abs(a) for a in advantages) / len(advantages)
    if scale == 0:
        return {}
    out = {}
    for d in OFFSETS:
        values = [a for a, line in zip(advantages, lines) if max(line, 1) - first_wrong == d]
        if values:
            out[d] = sum(values) / len(values) / scale
    return out


def _mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None  # None, not NaN: the JSON stays standard


def chain_regions(records: list[dict], tokenizer) -> list[dict]:
    """Incorrect completions with a nonzero sequence advantage: h_o, its reason, and the region shares."""
    from trl_credit.tasks.chain import check_steps

    out = []
    for record in records:
        output, credit = record["output"], record["credit"]
        mask = output["completion_mask"].bool()
        for i in range(mask.size(0)):
            length = int(mask[i].sum())
            if length == 0 or record["success"][i] or float(credit["seq_advantages"][i]) == 0:
                continue
            ids = output["completion_ids"][i, :length].tolist()
            text = tokenizer.decode(ids, skip_special_tokens=True)
            verdict = check_steps(record["inputs"][i]["question"], text)
            if verdict.step is None:
                continue
            lines = common.line_of_token(common.token_pieces(ids, tokenizer))
            loss = output["advantages"][i, :length].tolist()
            entry = dict(question=record["inputs"][i]["question"], text=text,
                         first_wrong=verdict.step, reason=verdict.reason, lines=max(lines), tokens=length,
                         loss=region_shares(lines, loss, verdict.step),
                         anchored=region_shares(lines, credit["advantages"][i, :length].tolist(), verdict.step))
            if "process" in record:
                entry["process"] = region_shares(lines, record["process"][i], verdict.step)
                entry["profile"] = dict(loss=line_profile(lines, loss, verdict.step),
                                        process=line_profile(lines, record["process"][i], verdict.step))
            out.append(entry)
    return out


def summarize_regions(regions: list[dict]) -> dict:
    """Mean shares over completions (each completion weighs the same), with and without the "no answer" ones
    (their h_o is one past the last line: no token lies on or after it)."""
    def block(subset):
        entry = dict(completions=len(subset), token_share={r: common.mean(c["loss"]["tokens"][r] for c in subset)
                                                            for r in REGIONS})
        kinds = ("loss", "anchored", "process") if subset and all("process" in c for c in subset) else ("loss", "anchored")
        for kind in kinds:
            have = [c for c in subset if c[kind]["mass"]["before"] is not None]
            entry[f"{kind}_negative_mass_share"] = {r: common.mean(c[kind]["mass"][r] for c in have) for r in REGIONS}
            entry[f"{kind}_completions_with_negative_mass"] = len(have)
            # per completion: does the on+after region get more of the negative mass than of the tokens?
            entry[f"{kind}_share_on_after_above_tokens"] = common.mean(
                (c[kind]["mass"]["on"] + c[kind]["mass"]["after"]) > (c[kind]["tokens"]["on"] + c[kind]["tokens"]["after"])
                for c in have)
            # ... and the first wrong line alone; its mass share with a 95% interval over prompts (the completions
            # of one prompt are correlated, often the same text)
            entry[f"{kind}_share_on_above_tokens"] = common.mean(
                c[kind]["mass"]["on"] > c[kind]["tokens"]["on"] for c in have)
            entry[f"{kind}_on_mass_interval_over_prompts"] = common.cluster_bootstrap(
                [c[kind]["mass"]["on"] for c in have], [c["question"] for c in have])
        entry["prompts"] = len({c["question"] for c in subset})
        entry["distinct_texts"] = len({(c["question"], c["text"]) for c in subset})
        entry["on_token_interval_over_prompts"] = common.cluster_bootstrap(
            [c["loss"]["tokens"]["on"] for c in subset], [c["question"] for c in subset])
        if "process" in kinds:
            # mean credit per token by line offset from h_o (line_profile), over the completions with that offset
            entry["profile"] = {kind: {d: _mean_or_none([c["profile"][kind][d] for c in subset if d in c["profile"][kind]])
                                       for d in OFFSETS} for kind in ("loss", "process")}
        entry["by_first_wrong_line"] = {}
        for h in sorted({c["first_wrong"] for c in subset}):
            at = [c for c in subset if c["first_wrong"] == h]
            have = [c for c in at if c["loss"]["mass"]["before"] is not None]
            entry["by_first_wrong_line"][h] = dict(
                completions=len(at), token_share={r: common.mean(c["loss"]["tokens"][r] for c in at) for r in REGIONS},
                loss_negative_mass_share={r: common.mean(c["loss"]["mass"][r] for c in have) for r in REGIONS})
        return entry

    reasons = {}
    for c in regions:
        reasons[c["reason"]] = reasons.get(c["reason"], 0) + 1
    located = [c for c in regions if c["reason"] != "no answer"]
    return dict(reasons=reasons, all=block(regions), error_on_a_line=block(located))


def plot_regions(summary: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    process = "process_negative_mass_share" in summary["all"]
    fig, axes = plt.subplots(1, 3 if process else 2, figsize=(16 if process else 11, 4.2))
    for ax, key, name in ((axes[0], "error_on_a_line", "error on a written line"), (axes[1], "all", "all incl. no answer")):
        entry = summary[key]
        x = range(len(REGIONS))
        bars = [("tokens (GRPO / uniform)", entry["token_share"], "tab:gray"),
                ("neg. loss advantage mass", entry["loss_negative_mass_share"], "tab:red"),
                ("neg. anchored Â_t mass", entry["anchored_negative_mass_share"], "tab:orange")]
        if process:
            bars.append(("neg. process credit mass (checker)", entry["process_negative_mass_share"], "tab:blue"))
        width = 0.8 / len(bars)
        for k, (label, values, color) in enumerate(bars):
            ax.bar([i + (k - (len(bars) - 1) / 2) * width for i in x],
                   [values[r] if values[r] is not None and values[r] == values[r] else 0 for r in REGIONS],
                   width, label=label, color=color)
        ax.set_xticks(list(x))
        ax.set_xticklabels([f"{r} h_o" for r in REGIONS])
        ax.set_ylim(0, 1)
        ax.set_ylabel("mean share per incorrect completion")
        ax.set_title(f"{name} (n={entry['completions']})")
        ax.legend(fontsize=8)
    if process:
        ax, profile = axes[2], summary["error_on_a_line"]["profile"]
        for kind, label, color in (("loss", "OPPO (loss advantages)", "tab:red"),
                                   ("process", "process credit (checker)", "tab:blue")):
            points = [(d, v) for d, v in profile[kind].items() if v is not None]
            ax.plot([d for d, _ in points], [v for _, v in points], "o-", color=color, label=label)
        ax.axhline(0, color="black", lw=0.8)
        ax.axvline(0, color="gray", ls="--", lw=0.8)
        ax.set_xlabel("line - first wrong line h_o")
        ax.set_ylabel("mean A_t per token / the completion's mean |A_t|")
        ax.set_title("credit per line around the first wrong line")
        ax.legend(fontsize=8)
    common.save_figure(fig, path, title)


def summarize(rows: list[dict]) -> dict:
    out = {}
    tokens = sum(r["length"] for r in rows)
    out["evidence_clip_rate"] = sum(r["clipped"] for r in rows) / max(tokens, 1)
    signal = [r for r in rows if r["seq_advantage"] != 0]  # groups with reward variance: nonzero advantages
    out["completions"] = len(rows)
    out["completions_with_signal"] = len(signal)
    for label, subset in (("correct", [r for r in signal if r["correct"]]),
                          ("incorrect", [r for r in signal if not r["correct"]])):
        entry = dict(count=len(subset))
        for key in ("top20_anchored", "top20_normalized", "top20_log_lambda", "prior_value", "final_value"):
            entry[key] = common.mean(r[key] for r in subset)
        entry["share_final_value_above_prior"] = common.mean(r["final_value"] > r["prior_value"] for r in subset)
        for key in ("cum_anchored", "cum_log_lambda", "cum_normalized", "value_curve"):
            curves = [r[key] for r in subset if not any(v != v for v in r[key])]
            entry[key + "_mean"] = [common.mean(col) for col in zip(*curves)] if curves else []
        # cumulative share at the middle of the sequence (uniform: 0.5)
        entry["anchored_share_first_half"] = (entry["cum_anchored_mean"][GRID // 2]
                                              if entry["cum_anchored_mean"] else None)
        entry["log_lambda_share_first_half"] = (entry["cum_log_lambda_mean"][GRID // 2]
                                                if entry["cum_log_lambda_mean"] else None)
        out[label] = entry
    both = [r for r in signal]
    out["top20_anchored_all"] = common.mean(r["top20_anchored"] for r in both)
    out["top20_normalized_all"] = common.mean(r["top20_normalized"] for r in both)
    return out


def plot(rows: list[dict], summary: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [j / (GRID - 1) for j in range(GRID)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for label, color in (("correct", "tab:green"), ("incorrect", "tab:red")):
        curves = [r["value_curve"] for r in rows if r["correct"] == (label == "correct") and r["seq_advantage"] != 0]
        for curve in curves:
            ax.plot(grid, curve, color=color, alpha=0.15, lw=0.8)
        if curves:
            low, mid, high = common.quantiles(curves)
            ax.plot(grid, mid, color=color, lw=2.2, label=f"{label} (median, n={len(curves)})")
            ax.fill_between(grid, low, high, color=color, alpha=0.2)
    ax.set_xlabel("normalized position t / T")
    ax.set_ylabel("running value V_t = σ(ℓ_t)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("V_t along the completion (band: IQR)")
    ax.legend(fontsize=8)

    ax = axes[1]
    ax.plot(grid, grid, "k--", lw=1, label="GRPO (uniform credit)")
    for label, color in (("correct", "tab:green"), ("incorrect", "tab:red")):
        entry = summary[label]
        if entry["cum_anchored_mean"]:
            ax.plot(grid, entry["cum_anchored_mean"], color=color, lw=2, label=f"|A_t|, {label}")
            ax.plot(grid, entry["cum_log_lambda_mean"], color=color, lw=1.2, ls=":", label=f"|log λ_t|, {label}")
    ax.set_xlabel("normalized position t / T")
    ax.set_ylabel("cumulative share of the completion's mass")
    ax.set_title("Cumulative credit (paper Fig. 1a)")
    ax.legend(fontsize=7)

    ax = axes[2]
    data = [[r[key] for r in rows if r["seq_advantage"] != 0 and r[key] == r[key]]  # (x == x: not NaN)
            for key in ("top20_anchored", "top20_normalized", "top20_log_lambda")]
    if all(data):
        ax.boxplot(data, tick_labels=["|Â_t| (recursion)", "|Ã_t| (loss)", "|log λ_t|"])
    ax.axhline(0.2, color="black", ls="--", lw=1, label="GRPO / uniform = 0.2")
    ax.set_ylabel("share of |·| mass on the top 20% tokens")
    ax.set_title(f"Concentration; evidence clip rate {summary['evidence_clip_rate']:.3f}")
    ax.legend(fontsize=8)
    common.save_figure(fig, path, title)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    common.add_common_arguments(parser)
    parser.add_argument("--process", action="store_true",
                        help="--task chain: also the process credit of the chain step checker on the same rollouts")
    args = parser.parse_args(argv)
    if args.process and not common.is_chain(args):
        parser.error("--process needs the chain step checker: add --task chain")
    json_path, png_path = common.output_paths(args, "oppo")
    start = time.perf_counter()

    import trl_credit.oppo.parts as oppo_parts

    recorder = common.Recorder()
    recorder.wrap(oppo_parts, "bayesian_value_recursion")
    trainer = common.build_trainer("oppo", args)

    def on_output(trainer, inputs, output):
        calls = recorder.calls["bayesian_value_recursion"]
        if not calls:
            raise SystemExit("OPPOTrainer did not call bayesian_value_recursion: update this script.")
        a, k, credit = calls[-1]
        seq_advantages = k.get("seq_advantages", a[3] if len(a) > 3 else None)
        calls.clear()
        return dict(credit=dict(values=credit.values.detach().cpu(), log_lambda=credit.log_lambda.detach().cpu(),
                                advantages=credit.advantages.detach().cpu(),
                                clipped=credit.evidence_clipped.detach().cpu(),
                                prior_values=credit.prior_values.detach().cpu(),
                                seq_advantages=seq_advantages.detach().cpu()))

    recorder.attach(trainer, on_output)
    seconds = common.collect(trainer, args.steps, train=args.train)
    recorder.unpatch()
    for record in recorder.batches:
        record["success"] = common.success_of(trainer, record["rewards"][-1]).tolist()
    rows = analyse(recorder.batches)
    summary = summarize(rows)
    if args.process:
        process_credit(recorder.batches, trainer.processing_class, trainer.num_generations)
    regions = chain_regions(recorder.batches, trainer.processing_class) if common.is_chain(args) else None
    metrics = {k: v for k, v in common.harness.last_metrics(trainer).items() if k.startswith("oppo/")}
    payload = dict(settings=common.settings_of(args, trainer), seconds=time.perf_counter() - start,
                   collect_seconds=seconds, summary=summary, trainer_metrics=metrics,
                   completions=[{k: v for k, v in r.items()} for r in rows])
    if regions is not None:
        payload["chain"] = dict(summary=summarize_regions(regions), completions=regions)
        plot_regions(payload["chain"]["summary"], png_path.replace(".png", "_regions.png"),
                     f"OPPO on {common.task_label(args)}: negative advantage mass vs the checker's first wrong step")
    common.write_json(json_path, payload)
    plot(rows, summary, png_path, f"OPPO (self-oracle) on {common.task_label(args)}, {len(rows)} completions of "
         f"{args.prompts * args.steps} prompts, {args.generations} rollouts each")
    if regions is not None:
        print("  chain regions:", payload["chain"]["summary"])
    c, w = summary["correct"], summary["incorrect"]
    print(f"OPPO mechanism: {len(rows)} completions ({summary['completions_with_signal']} in groups with reward "
          f"variance), evidence clip rate {summary['evidence_clip_rate']:.3f}")
    print(f"  final V vs prior V0: correct {c['final_value']:.3f} vs {c['prior_value']:.3f} "
          f"(above prior: {c['share_final_value_above_prior']:.2f}); incorrect {w['final_value']:.3f} vs "
          f"{w['prior_value']:.3f} (above prior: {w['share_final_value_above_prior']:.2f})")
    print(f"  top-20% token share of |A| mass (uniform 0.20): recursion {summary['top20_anchored_all']:.3f}, "
          f"loss advantages {summary['top20_normalized_all']:.3f}; |log λ| correct {c['top20_log_lambda']:.3f} "
          f"incorrect {w['top20_log_lambda']:.3f}")
    print(f"  share of |A| in the first half (uniform 0.5): correct {c['anchored_share_first_half']}, incorrect "
          f"{w['anchored_share_first_half']}; |log λ|: correct {c['log_lambda_share_first_half']}, incorrect "
          f"{w['log_lambda_share_first_half']}")
    print(f"wrote {json_path} and {png_path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
