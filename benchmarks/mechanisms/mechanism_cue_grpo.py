"""Question: Do rarer strategy clusters get larger weights, and does the positive mass move to them (Fig. 2c)?

Cue-GRPO's mechanism on SmolLM2 rollouts (paper §4, Fig. 2c): rarer strategy clusters get larger weights, and the
positive advantage mass moves from common to rare clusters.

One or more generation batches of CueGRPOTrainer (strategy cues, CR weighting, defaults; no training) on the
built-in arithmetic task. The script records GRPO's advantages and the redistributed ones
(``RarityWeights.apply``, the Cue-GRPO part of the credit core) and every call of ``compute_rarity_weights``
(cluster ids of a group's positive completions, their weights w'_i and pre-floor multipliers), and reports:

- weight against cluster size for every positive completion (paper Eq. 3/8: w ∝ |C|^-α, clipped, floored);
- per group, the share of the positive advantage mass on minority clusters (all clusters but the largest), under
  GRPO (Σ A_i) and under Cue-GRPO (Σ A_i w'_i);
- the mass slope of paper Fig. 2c: least-squares slope of log M_C against log n_C over clusters, with M_C = n_C·w̄_C
  (pre-floor multipliers, per unit advantage): GRPO gives exactly 1, rarity weighting gives < 1.

    python benchmarks/mechanisms/mechanism_cue_grpo.py               # 8 prompts x 8 rollouts, 64 tokens, 1 batch (~3 min CPU)

With ``--task chain`` (``smollm2-135m-chain``) every positive completion is also labelled with its solution
structure (:func:`solution_structure`: plain core, or for a distributive core term-by-term vs factored) and the
summary gives clusters per group and the weights by structure, and whether the cue clusters separate the two
structures. ``--partition structure`` (chain only) is the control: positives clustered by their structure
(``cue_partition="callable"``, :func:`structure_partition`) instead of by strategy cues.

    python benchmarks/mechanisms/mechanism_cue_grpo.py --task chain --steps 2 --tokens 96
    python benchmarks/mechanisms/mechanism_cue_grpo.py --task chain --steps 2 --tokens 96 --partition structure \
        --output benchmarks/results/mechanism_cue_grpo_structure_chain.json
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

from harness import mechanisms as common  # noqa: E402


def least_squares_slope(points: list[tuple[float, float]]) -> float:
    """Slope of y on x (NaN with fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return float("nan")
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def solution_structure(question: str, text: str) -> str:
    """"plain" (a non-distributive core), else from the first line ``x op y = z``: "factored" when it is the core's
    inner ``b op c``, "term" when it is one of the products ``a * b`` / ``a * c`` (either operand order), "other"
    otherwise (chain.chain_solutions holds both structures)."""
    import re

    from trl_credit.tasks.chain import parse_question

    problem = parse_question(question)
    if not problem.distributive:
        return "plain"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    match = re.fullmatch(r"(\d+) ([-+*]) (\d+) = (-?\d+)\.?", lines[0]) if lines else None
    if match is None:
        return "other"
    x, op, y = int(match.group(1)), match.group(2), int(match.group(3))
    a, core_op, b, c = problem.core
    if op == core_op and (x, y) == (b, c):
        return "factored"
    if op == "*" and ({x, y} == {a, b} or {x, y} == {a, c}):
        return "term"
    return "other"


def structure_partition(completions: list[str], prompt) -> list[str]:
    """``partition_fn`` of ``--partition structure`` (chain task): a positive's cluster is its solution structure,
    read from its first line by :func:`solution_structure` - the control that sees what the cue partition does not."""
    from trl_credit.srpo.localization import _chain_question
    from trl_credit.srpo.prompts import question_of
    from trl_credit.tasks.chain import CHAIN_INSTRUCTION

    # the bare question out of the instruction around it, as SRPO's chain step checker reads it
    question = _chain_question(question_of(prompt), CHAIN_INSTRUCTION)
    return [solution_structure(question, text) for text in completions]


def analyse(trainer, record: dict) -> list[dict]:
    """Per group with positives: members, clusters, weights, advantages before/after, mass shares."""
    size = trainer.num_generations
    before = record["grpo_advantages"]
    after = record["output"]["advantages"].tolist()
    groups = []
    calls = list(record["weight_calls"])
    for g in range(len(before) // size):
        rows = list(range(g * size, (g + 1) * size))
        positives = [r for r in rows if before[r] > 0]
        varied = any(abs(before[r]) > 0 for r in rows)
        if not positives or not varied:
            continue
        if not calls:
            break
        a, k, result = calls.pop(0)
        cluster_ids = list(a[0])
        if len(cluster_ids) != len(positives):
            raise SystemExit(f"group {g}: {len(positives)} positive rows but {len(cluster_ids)} cluster ids recorded")
        sizes = {c: cluster_ids.count(c) for c in cluster_ids}
        largest = max(sizes.values())
        members = [dict(row=r, cluster=c, cluster_size=sizes[c], weight=float(w), prefloor=float(p),
                        grpo_advantage=float(before[r]), cue_advantage=float(after[r]))
                   for r, c, w, p in zip(positives, cluster_ids, result.weights, result.prefloor)]
        grpo_mass = sum(m["grpo_advantage"] for m in members)
        cue_mass = sum(m["cue_advantage"] for m in members)
        minority = [m for m in members if m["cluster_size"] < largest]
        clusters = []
        for c, n in sizes.items():
            ws = [m["prefloor"] for m in members if m["cluster"] == c]
            clusters.append(dict(size=n, prefloor_mass=sum(ws), grpo_mass=float(n)))
        groups.append(dict(
            group=g, positives=len(members), clusters=len(sizes), members=members, cluster_masses=clusters,
            nonuniform_sizes=len(set(sizes.values())) > 1,
            grpo_minority_share=sum(m["grpo_advantage"] for m in minority) / grpo_mass if grpo_mass else None,
            cue_minority_share=sum(m["cue_advantage"] for m in minority) / cue_mass if cue_mass else None,
        ))
    return groups


def plot(groups: list[dict], summary: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    cmap = plt.get_cmap("tab10")
    for j, group in enumerate(groups):
        xs = [m["cluster_size"] + (j - len(groups) / 2) * 0.03 for m in group["members"]]
        ax.scatter(xs, [m["weight"] for m in group["members"]], color=cmap(j % 10), s=20, alpha=0.8)
    ax.axhline(1.0, color="black", lw=1, ls="--", label="GRPO (every weight 1)")
    ax.set_xlabel("cluster size |C| (positives of the group sharing the strategy)")
    ax.set_ylabel("weight w' of the completion")
    ax.set_title("Weight vs cluster size (one color per group)")
    ax.legend(fontsize=8)

    ax = axes[1]
    shown = [g for g in groups if g["nonuniform_sizes"]]
    ax.scatter([g["grpo_minority_share"] for g in shown], [g["cue_minority_share"] for g in shown], color="tab:blue")
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="no change")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("GRPO: share of positive mass on minority clusters")
    ax.set_ylabel("Cue-GRPO: same share")
    ax.set_title(f"Mass on rarer strategies ({len(shown)} groups with unequal clusters)")
    ax.legend(fontsize=8)

    ax = axes[2]
    points = [(c["size"], c["prefloor_mass"]) for g in groups for c in g["cluster_masses"]]
    if points:
        ax.scatter([n for n, _ in points], [m for _, m in points], color="tab:red", label="Cue-GRPO clusters")
        top = max(n for n, _ in points)
        ax.plot([1, top], [1, top], "k--", lw=1, label="GRPO: M_C = n_C (slope 1)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cluster size n_C")
    ax.set_ylabel("positive mass per unit advantage M_C")
    slope = summary["mass_slope"]
    ax.set_title(f"Mass slope (paper Fig. 2c): {slope:.3f}" if slope == slope else "Mass slope: undefined")
    ax.legend(fontsize=8)
    common.save_figure(fig, path, title)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    common.add_common_arguments(parser, prompts=8, generations=8, tokens=64, temperature=1.0, steps=1)
    parser.add_argument("--partition", choices=["cue", "structure"], default="cue",
                        help="cue: the paper's strategy-cue partition (default); structure (chain task only): "
                             "cluster positives by solution structure (cue_partition='callable', partition_fn)")
    args = parser.parse_args(argv)
    if args.partition == "structure" and not common.is_chain(args):
        parser.error("--partition structure needs --task chain (the solution structures are the chain task's)")
    json_path, png_path = common.output_paths(args, "cue_grpo")
    start = time.perf_counter()

    import trl_credit.cue_grpo.parts as cue_parts

    recorder = common.Recorder()
    recorder.wrap(cue_parts, "compute_rarity_weights")
    if args.partition == "structure":
        trainer = common.build_trainer("cue_grpo", args, own=dict(cue_partition="callable"),
                                       partition_fn=structure_partition)
    else:
        trainer = common.build_trainer("cue_grpo", args)
    grpo_advantages = []
    rarity = trainer.rarity_weights  # CueGRPOTrainer's RarityWeights part
    redistribute = rarity.apply

    @functools.wraps(redistribute)
    def recording_redistribute(owner, batch, inputs, output, local_advantages, *args, **kwargs):
        grpo_advantages.append(local_advantages.detach().cpu().tolist())
        return redistribute(owner, batch, inputs, output, local_advantages, *args, **kwargs)

    rarity.apply = recording_redistribute

    def on_output(trainer, inputs, output):
        calls = list(recorder.calls["compute_rarity_weights"])
        recorder.calls["compute_rarity_weights"].clear()
        return dict(grpo_advantages=grpo_advantages[-1], weight_calls=calls)

    recorder.attach(trainer, on_output)
    seconds = common.collect(trainer, args.steps, train=args.train)
    recorder.unpatch()
    groups = []
    completions = []
    for record in recorder.batches:
        mine = analyse(trainer, record)
        if common.is_chain(args):
            texts = trainer.processing_class.batch_decode(record["output"]["completion_ids"], skip_special_tokens=True)
            for group in mine:
                for m in group["members"]:
                    m["structure"] = solution_structure(record["inputs"][m["row"]]["question"], texts[m["row"]])
        groups += mine
    from trl_credit.cue_grpo.cues import extract_cues
    from trl_credit.tasks.rewards import completion_text

    for record in recorder.batches[:1]:
        texts = trainer.processing_class.batch_decode(record["output"]["completion_ids"], skip_special_tokens=True)
        completions = [dict(text=t, cues=extract_cues(completion_text(t))) for t in texts[: 2 * args.generations]]
    points = [(math.log(c["size"]), math.log(c["prefloor_mass"])) for g in groups for c in g["cluster_masses"]
              if c["prefloor_mass"] > 0]
    shown = [g for g in groups if g["nonuniform_sizes"]]
    summary = dict(
        groups_with_positives=len(groups),
        groups_with_unequal_clusters=len(shown),
        clusters_per_group=common.mean(g["clusters"] for g in groups),
        positives_per_group=common.mean(g["positives"] for g in groups),
        singleton_weight=common.mean(m["weight"] for g in groups for m in g["members"] if m["cluster_size"] == 1),
        largest_cluster_weight=common.mean(m["weight"] for g in groups for m in g["members"]
                                           if m["cluster_size"] == max(x["cluster_size"] for x in g["members"])
                                           and g["nonuniform_sizes"]),
        grpo_minority_share=common.mean(g["grpo_minority_share"] for g in shown),
        cue_minority_share=common.mean(g["cue_minority_share"] for g in shown),
        mass_slope=least_squares_slope(points),
        grpo_mass_slope=1.0,
    )
    if common.is_chain(args):
        members = [m for g in groups for m in g["members"]]
        by = {}
        for m in members:
            entry = by.setdefault(m["structure"], dict(positives=0, weights=[], cluster_sizes=[]))
            entry["positives"] += 1
            entry["weights"].append(m["weight"])
            entry["cluster_sizes"].append(m["cluster_size"])
        mixed = [g for g in groups if {m["structure"] for m in g["members"]} >= {"term", "factored"}]
        separated = [g for g in mixed if not ({m["cluster"] for m in g["members"] if m["structure"] == "term"}
                                               & {m["cluster"] for m in g["members"] if m["structure"] == "factored"})]
        summary["chain"] = dict(
            by_structure={k: dict(positives=v["positives"], mean_weight=common.mean(v["weights"]),
                                  mean_cluster_size=common.mean(v["cluster_sizes"])) for k, v in sorted(by.items())},
            groups_with_both_structures=len(mixed), of_them_structures_in_disjoint_clusters=len(separated),
            mixed_groups=[dict(clusters=g["clusters"], members=[(m["structure"], m["cluster"], round(m["weight"], 3))
                                                                for m in g["members"]]) for g in mixed])
        print("  chain:", summary["chain"])
    metrics = {k: v for k, v in common.harness.last_metrics(trainer).items() if k.startswith("cue/")}
    payload = dict(settings=common.settings_of(args, trainer), seconds=time.perf_counter() - start,
                   collect_seconds=seconds, summary=summary, trainer_metrics_last_batch=metrics, groups=groups,
                   example_completions=completions)
    common.write_json(json_path, payload)
    plot(groups, summary, png_path, f"Cue-GRPO on {common.task_label(args)}, {args.prompts * args.steps} prompts x "
         f"{args.generations} rollouts, CR weighting (defaults)")
    print(f"Cue-GRPO mechanism: {summary['groups_with_positives']} groups with positives, "
          f"{summary['clusters_per_group']:.2f} clusters per group, {summary['groups_with_unequal_clusters']} with "
          f"unequal cluster sizes")
    print(f"  weight: singletons {summary['singleton_weight']:.3f}, largest clusters {summary['largest_cluster_weight']:.3f}; "
          f"minority-cluster share of positive mass GRPO {summary['grpo_minority_share']:.3f} -> Cue "
          f"{summary['cue_minority_share']:.3f}; mass slope {summary['mass_slope']:.3f} (GRPO 1.0; trainer logged "
          f"{metrics.get('cue/mass_slope')})")
    print(f"wrote {json_path} and {png_path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
