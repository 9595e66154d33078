"""Question: Does DATPO's budget follow difficulty, and where do its forks land?

DATPO's mechanism on SmolLM2 rollouts (paper §3): difficulty-adaptive budgets, where the forks land, and what a
leaf costs.

One or more generation batches of DATPOTrainer (no training) on the built-in arithmetic task. The script records
what the trainer computed through the pure functions its rollout's module (datpo/parts.py) calls: ``adaptive_budget``
(V_root → K̂, B̂, paper Eq. 1-2), ``select_forks`` (token entropies, sentence spans, chosen forks; paper Alg. 2 /
App. D.1), the rollout's ``generate_branches`` (the branches, each cut to its fork's budget) and
``rewards_of_extra_rows`` (their rewards), plus the base rows and rewards of ``_generate_and_score_completions``:

- K̂ and B̂ (and the branches actually grown) against the prompt's base pass rate V_root: hard prompts get more
  branches, solved prompts none;
- fork positions against sentence entropy: every sentence of a forked base rollout at its normalized start
  position, the chosen ones highlighted (sent_entropy picks the K̂ highest-entropy sentences);
- generated tokens per leaf against the leaves' answer length (prefix + branch): a branch shares the prefix before
  its fork, so a tree pays less than one full answer per leaf; GRPO pays exactly one (the diagonal).

    python benchmarks/mechanisms/mechanism_datpo.py                  # 8 prompts x 4 base rollouts, 64 tokens (~4 min CPU)

With ``--task chain`` (``smollm2-135m-chain``, one step per line) every sentence is also marked by whether it starts
at a real step boundary (its first non-whitespace token is the first token of a line,
``harness.mechanisms.line_of_token``), and the summary gives the share of chosen forks at step boundaries, the
sentences and lines per rollout, and the trainer's token-entropy fallback rate; in incorrect base rollouts it puts the
chosen forks against the chain step checker's first wrong line h_o (before / on / after, next to where all sentences
are) with the share of correct branches grown from each (:func:`fork_regions`).
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


def line_starts(pieces: list[str]) -> set[int]:
    """Tokens that begin a line: their line (``common.line_of_token``) is above the previous token's."""
    lines = common.line_of_token(pieces)
    return {j for j, line in enumerate(lines) if line > (lines[j - 1] if j else 0)}


def reconstruct(trainer, record: dict, calls: dict, chain: bool = False) -> list[dict]:
    """Per prompt of one batch: V_root, K̂, B̂, base lengths, forks per base rollout (with sentence entropies) and
    branches (fork position, generated length, reward)."""
    N = trainer.num_generations
    budgets = [(a[0] if a else k["v_root"], result) for a, k, result in calls["adaptive_budget"]]
    fork_calls = list(calls["select_forks"])
    branch_calls = list(calls["generate_branches"])
    branch_ids = [list(ids) for ids in branch_calls[0][2][0]] if branch_calls else []
    num_base = len(budgets) * N
    mask = record["output"]["completion_mask"]
    lengths = [int(mask[i].sum()) for i in range(num_base)]
    # branch rewards: TRL's reward path via rewards_of_extra_rows (one matrix per process; one process here)
    extra = [torch.cat(result).cpu() for _, _, result in calls.get("rewards_of_extra_rows", [])]
    branch_success = common.success_of(trainer, torch.cat(extra)).tolist()[: len(branch_ids)] if extra else []
    base_success = common.success_of(trainer, record["rewards"][0]).tolist()
    prompts = []
    cursor = 0
    for g, (v_root, (k_hat, b_hat)) in enumerate(budgets):
        prompt = dict(v_root=float(v_root), k_hat=int(k_hat), b_hat=int(b_hat), base_lengths=lengths[g * N:(g + 1) * N],
                      base_correct=base_success[g * N:(g + 1) * N], rollouts=[], branches=[])
        for i in range(g * N, (g + 1) * N):
            if k_hat <= 0 or lengths[i] < 2 or not fork_calls:
                prompt["rollouts"].append(dict(forks=[], sentences=[]))
                continue
            a, k, forks = fork_calls.pop(0)
            entropies = [] if a[0] is None else [float(x) for x in (a[0].tolist() if hasattr(a[0], "tolist") else a[0])]
            spans = a[1] or []
            # a fork is a prefix length: the sentence's start + 1 when the prefix keeps its first token (default)
            shift = 1 if k.get("position", "after_token") == "after_token" else 0
            sentences = [dict(start=s, end=e, entropy=sum(entropies[s:e]) / (e - s) if e > s and entropies else None,
                              chosen=s + shift in forks) for s, e in spans]
            first_wrong = None
            if chain:
                from trl_credit.tasks.chain import first_wrong_step

                ids = record["output"]["completion_ids"][i, :lengths[i]].tolist()
                pieces = common.token_pieces(ids, trainer.processing_class)
                starts, token_lines = line_starts(pieces), common.line_of_token(pieces)
                for sentence in sentences:
                    first = next((j for j in range(sentence["start"], sentence["end"]) if pieces[j].strip()), None)
                    sentence["step_boundary"] = first in starts
                    sentence["line"] = token_lines[sentence["start"] if first is None else first]
                prompt.setdefault("lines", []).append(len(starts))
                # the checker's first wrong line of this base rollout (None: every step holds)
                text = trainer.processing_class.decode(ids, skip_special_tokens=True)
                first_wrong = first_wrong_step(record["inputs"][i]["question"], text)
            length = k.get("num_tokens", lengths[i])
            prompt["rollouts"].append(dict(forks=list(forks), length=length, sentences=sentences,
                                           first_wrong=first_wrong))
            fork_lines = {s["start"] + shift: s.get("line") for s in sentences}
            for fork in forks:
                for _ in range(b_hat):
                    if cursor < len(branch_ids):
                        verdict = branch_success[cursor] if cursor < len(branch_success) else None
                        prompt["branches"].append(dict(fork=int(fork), base_length=length,
                                                       generated=len(branch_ids[cursor]), correct=verdict,
                                                       fork_line=fork_lines.get(int(fork)), first_wrong=first_wrong))
                    cursor += 1
        leaves = N + len(prompt["branches"])
        generated = sum(prompt["base_lengths"]) + sum(b["generated"] for b in prompt["branches"])
        answer_tokens = sum(prompt["base_lengths"]) + sum(b["fork"] + b["generated"] for b in prompt["branches"])
        prompt.update(leaves=leaves, tokens_per_leaf=generated / leaves, answer_length=answer_tokens / leaves,
                      base_pass_rate=common.mean(prompt["base_correct"]),
                      tree_pass_rate=common.mean(prompt["base_correct"] + [b["correct"] for b in prompt["branches"]
                                                                          if b["correct"] is not None]))
        prompts.append(prompt)
    if cursor != len(branch_ids):
        print(f"warning: {len(branch_ids)} branches generated, {cursor} assigned to forks", file=sys.stderr)
    return prompts


def plot(prompts: list[dict], summary: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    x = [p["v_root"] for p in prompts]
    ax.scatter([v - 0.01 for v in x], [p["k_hat"] for p in prompts], marker="o", color="tab:blue",
               label="K̂ (forks per rollout)")
    ax.scatter([v + 0.01 for v in x], [p["b_hat"] for p in prompts], marker="s", color="tab:orange",
               label="B̂ (branches per fork)")
    ax2 = ax.twinx()
    ax2.scatter(x, [len(p["branches"]) for p in prompts], marker="x", color="tab:green", label="branches grown")
    ax2.set_ylabel("branches grown per prompt", color="tab:green")
    ax.set_xlabel("base pass rate V_root of the prompt")
    ax.set_ylabel("K̂, B̂")
    ax.set_title("Adaptive budget vs difficulty (Eq. 1-2)")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="upper right")

    ax = axes[1]
    for p in prompts:
        for r in p["rollouts"]:
            for s in r["sentences"]:
                if s["entropy"] is None:
                    continue
                pos = s["start"] / max(r["length"], 1)
                ax.scatter(pos, s["entropy"], s=30 if s["chosen"] else 10,
                           color="tab:red" if s["chosen"] else "lightgray", zorder=3 if s["chosen"] else 2)
    ax.scatter([], [], color="tab:red", s=30, label="chosen fork (sentence start)")
    ax.scatter([], [], color="lightgray", s=10, label="other sentence")
    ax.set_xlabel("sentence start / rollout length")
    ax.set_ylabel("sentence entropy (mean token entropy, nats)")
    ax.set_title(f"Forks vs sentence entropy ({summary['forks_per_forkable_rollout']:.2f} forks per rollout "
                 f"with K̂>0)")
    ax.legend(fontsize=8)

    ax = axes[2]
    ax.scatter([p["answer_length"] for p in prompts], [p["tokens_per_leaf"] for p in prompts], color="tab:green",
               label="DATPO tree (one point per prompt)")
    top = max([p["answer_length"] for p in prompts] + [1])
    ax.plot([0, top], [0, top], "k--", lw=1, label="GRPO: one full answer per leaf")
    ax.set_xlabel("mean leaf answer length (tokens, prefix + branch)")
    ax.set_ylabel("generated tokens per leaf")
    ax.set_title(f"Cost per leaf (mean ratio {summary['tokens_per_leaf_over_answer_length']:.2f})")
    ax.legend(fontsize=8)
    common.save_figure(fig, path, title)


def fork_regions(prompts: list[dict]) -> dict:
    """Chain task: in forked base rollouts with a wrong line h_o (the checker's), where the chosen forks are against
    h_o (their sentence's line before / on / after it) next to where all the rollout's sentences are (a uniform
    choice), and how often a branch grown from each region is correct. A fork on h_o keeps its first token
    (``after_token``) and resamples the rest of the wrong line."""
    rollouts = [r for p in prompts for r in p["rollouts"] if r["forks"] and r.get("first_wrong") is not None]
    chosen = [common.region_of(s["line"], r["first_wrong"]) for r in rollouts for s in r["sentences"] if s["chosen"]]
    every = [common.region_of(s["line"], r["first_wrong"]) for r in rollouts for s in r["sentences"]]
    branches = [b for p in prompts for b in p["branches"]
                if b.get("first_wrong") is not None and b.get("fork_line") is not None and b["correct"] is not None]
    corrected = {}
    for name in common.REGIONS:
        grown = [b["correct"] for b in branches if common.region_of(b["fork_line"], b["first_wrong"]) == name]
        corrected[name] = dict(correct=sum(grown), branches=len(grown),
                               ci95=common.wilson(sum(grown), len(grown)) if grown else None)
    return dict(incorrect_forked_rollouts=len(rollouts), chosen_forks=len(chosen),
                chosen_share={name: chosen.count(name) / len(chosen) if chosen else None for name in common.REGIONS},
                sentence_share={name: every.count(name) / len(every) if every else None for name in common.REGIONS},
                branch_correct_by_region=corrected)


def summarize(prompts: list[dict]) -> dict:
    forkable = [r for p in prompts if p["k_hat"] > 0 for r in p["rollouts"]]
    chosen = [s["entropy"] for p in prompts for r in p["rollouts"] for s in r["sentences"]
              if s["chosen"] and s["entropy"] is not None]
    candidates = [s["entropy"] for p in prompts for r in p["rollouts"] for s in r["sentences"]
                  if not s["chosen"] and s["start"] > 0 and s["entropy"] is not None]
    fork_positions = [f / r["length"] for p in prompts for r in p["rollouts"] for f in r["forks"]]
    by_difficulty = {}
    for p in prompts:
        entry = by_difficulty.setdefault(f"{p['v_root']:.2f}", dict(prompts=0, k_hat=p["k_hat"], b_hat=p["b_hat"],
                                                                      branches=0))
        entry["prompts"] += 1
        entry["branches"] += len(p["branches"])
    for entry in by_difficulty.values():
        entry["branches_per_prompt"] = entry["branches"] / entry["prompts"]
    branched = [p for p in prompts if p["branches"]]
    return dict(
        prompts=len(prompts),
        by_base_pass_rate=dict(sorted(by_difficulty.items())),
        rollouts_with_budget=len(forkable),
        forks_per_forkable_rollout=common.mean(len(r["forks"]) for r in forkable) if forkable else float("nan"),
        rollouts_with_budget_but_no_fork=sum(not r["forks"] for r in forkable),
        single_sentence_rollouts=sum(len(r["sentences"]) <= 1 for r in forkable),
        chosen_sentence_entropy=common.mean(chosen), other_sentence_entropy=common.mean(candidates),
        mean_fork_position=common.mean(fork_positions),
        branches=sum(len(p["branches"]) for p in prompts),
        tokens_per_leaf=common.mean(p["tokens_per_leaf"] for p in branched),
        answer_length=common.mean(p["answer_length"] for p in branched),
        tokens_per_leaf_over_answer_length=common.mean(p["tokens_per_leaf"] / p["answer_length"] for p in branched),
        branch_generated_over_base_length=common.mean(b["generated"] / max(b["base_length"], 1)
                                                      for p in prompts for b in p["branches"]),
        base_pass_rate=common.mean(p["base_pass_rate"] for p in prompts),
        tree_pass_rate=common.mean(p["tree_pass_rate"] for p in prompts),
        # the paper's PassRate: prompts with at least one correct leaf, vs with a correct base rollout
        prompts_solved_by_base=common.mean(any(p["base_correct"]) for p in prompts),
        prompts_solved_by_tree=common.mean(any(p["base_correct"]) or any(b["correct"] for b in p["branches"])
                                           for p in prompts),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    common.add_common_arguments(parser, prompts=8, generations=4, tokens=64, temperature=1.0, steps=1)
    args = parser.parse_args(argv)
    json_path, png_path = common.output_paths(args, "datpo")
    start = time.perf_counter()

    import trl_credit.core.collectives as collectives
    import trl_credit.datpo.parts as datpo_parts

    recorder = common.Recorder()
    for name in ("adaptive_budget", "select_forks"):
        recorder.wrap(datpo_parts, name)
    # branch rewards: datpo/branches.py branch_rewards -> ctx.score, which looks the function up in the module per call
    recorder.wrap(collectives, "rewards_of_extra_rows")
    trainer = common.build_trainer("datpo", args)
    recorder.wrap(trainer.rollout, "generate_branches")  # the Trees rollout: one collective call per generation batch
    prompts = []

    def on_output(trainer, inputs, output):
        return dict(calls={name: list(calls) for name, calls in recorder.calls.items()})

    recorder.attach(trainer, on_output)
    batches = common.harness.prepare_manual_stepping(trainer)
    for _ in range(args.steps):
        for calls in recorder.calls.values():
            calls.clear()
        if args.train:
            common.harness.run_step(trainer, batches)
        else:
            trainer._generate_and_score_completions(next(batches))
    recorder.unpatch()
    for record in recorder.batches:
        prompts += reconstruct(trainer, record, record["calls"], chain=common.is_chain(args))
    summary = summarize(prompts)
    if common.is_chain(args):
        chosen = [s for p in prompts for r in p["rollouts"] for s in r["sentences"] if s["chosen"]]
        others = [s for p in prompts for r in p["rollouts"] for s in r["sentences"] if not s["chosen"]]
        forked = [r for p in prompts for r in p["rollouts"] if r["sentences"]]
        at_step = sum(s["step_boundary"] for s in chosen)
        summary["chain"] = dict(
            chosen_forks=len(chosen), chosen_at_step_boundary=at_step,
            chosen_at_step_boundary_rate=at_step / len(chosen) if chosen else None,
            chosen_at_step_boundary_ci95=common.wilson(at_step, len(chosen)) if chosen else None,
            other_sentences_at_step_boundary_rate=common.mean(s["step_boundary"] for s in others),
            sentences_per_rollout=common.mean(len(r["sentences"]) for r in forked),
            lines_per_rollout=common.mean(n for p in prompts for n in p.get("lines", [])),
            fork_fallback_rate_logged=common.harness.last_metrics(trainer).get("datpo/fork_fallback_rate"),
            fork_position=trainer.args.fork_position,
            forks_against_first_wrong_line=fork_regions(prompts))
    metrics = {k: v for k, v in common.harness.last_metrics(trainer).items() if k.startswith("datpo/")}
    payload = dict(settings=common.settings_of(args, trainer), seconds=time.perf_counter() - start, summary=summary,
                   trainer_metrics_last_batch=metrics, prompts=prompts)
    common.write_json(json_path, payload)
    if common.is_chain(args):
        print("  chain:", summary["chain"])
    plot(prompts, summary, png_path, f"DATPO on {common.task_label(args)}, {len(prompts)} prompts x {args.generations} "
         f"base rollouts, K_max {trainer.args.max_forks}, B_max {trainer.args.max_branches}, "
         f"{trainer.args.fork_method}")
    print(f"DATPO mechanism, {len(prompts)} prompts: by base pass rate {summary['by_base_pass_rate']}")
    print(f"  forks per rollout with K̂>0 {summary['forks_per_forkable_rollout']:.2f} "
          f"({summary['rollouts_with_budget_but_no_fork']} of {summary['rollouts_with_budget']} got none; "
          f"{summary['single_sentence_rollouts']} have one sentence); sentence entropy chosen "
          f"{summary['chosen_sentence_entropy']:.3f} vs other {summary['other_sentence_entropy']:.3f}; mean fork "
          f"position {summary['mean_fork_position']:.2f}")
    print(f"  {summary['branches']} branches; tokens per leaf {summary['tokens_per_leaf']:.1f} vs answer length "
          f"{summary['answer_length']:.1f} (ratio {summary['tokens_per_leaf_over_answer_length']:.2f}); pass rate "
          f"base {summary['base_pass_rate']:.3f} -> tree {summary['tree_pass_rate']:.3f}; prompts with a correct "
          f"leaf {summary['prompts_solved_by_base']:.2f} (base) -> {summary['prompts_solved_by_tree']:.2f} (tree)")
    print(f"wrote {json_path} and {png_path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
