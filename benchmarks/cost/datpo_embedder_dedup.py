"""Question: How much embedder time does embedding each distinct block text once save?

DATPO's sibling-diversity embedder on each distinct block text once against every block text, side by side.

Trains DATPO on the tiny testbed (``trl_credit.testbed.runner``, the grid's settings, the committed build) for
``--steps`` steps and keeps the texts each step gave the embedder (each distinct text once, as
``datpo.credit.embedded_sibling_diversity`` does now) together with every block's text, the list it embedded before
(one per block with siblings). Then, per step and repeat, in alternating order: the seconds of embedding every text
and of embedding the distinct ones, and the largest difference between a text's vector in the two (round-off of
another batch composition). Prints the per-step ratio of seconds (distinct / every) with its spread.

    python benchmarks/cost/datpo_embedder_dedup.py --steps 4 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: the harness package

import torch  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def capture_texts(steps: int, seed: int) -> tuple[list[list[str]], object, int]:
    """Every block text each DATPO step embedded (repeats included), the embedder and its batch size."""
    from trl_credit.tasks import sums
    from trl_credit.testbed import runner

    import trl_credit.datpo.credit as credit

    spec = runner.method_spec("datpo")
    captured: list[list[str]] = []
    original = credit.embedded_sibling_diversity

    def recording(ctx, trees, embedder, groups=None):  # ctx: the batch context
        forest = trees.forest
        texts = []
        keys = [None if block.unscorable else block.sibling_key for block in forest.blocks]
        sizes: dict = {}
        for key in keys:
            if key is not None and (ctx.args.diversity_root_siblings or key[1] != 0):
                sizes[key] = sizes.get(key, 0) + 1
        for b, key in enumerate(keys):
            if key is None or sizes.get(key, 0) < 2:
                continue
            kind, row, start, end = forest.blocks[b].source
            ids = trees.completion_ids[row][start:end] if kind == "base" else trees.branch_ids[row][start:end]
            text = ctx.tokenizer.decode(ids, skip_special_tokens=True)
            if text.strip():
                texts.append(text)
        captured.append(texts)
        return original(ctx, trees, embedder, groups)

    holder = {}
    credit.embedded_sibling_diversity = recording
    try:
        runner.run(spec["trainer"], spec["config"], seed=seed, learning_rate=3e-4, steps=steps, eval_every=10**6,
                   eval_samples=1, test=sums.make_dataset()["test"].select(range(1)), trainer_kwargs=spec["kwargs"],
                   model_path=os.path.join(RESULTS, "tiny", "model"),
                   on_trainer=lambda trainer: holder.update(trainer=trainer), **spec["fields"])
    finally:
        credit.embedded_sibling_diversity = original
    trainer = holder["trainer"]
    return captured, trainer.credit.embedder, trainer.args.embedding_batch_size


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=4, help="DATPO steps whose texts are embedded")
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs per step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=os.path.join(RESULTS, "datpo_embedder_dedup.json"))
    args = parser.parse_args()
    if args.steps < 1 or args.repeats < 1:
        raise SystemExit(f"--steps and --repeats: at least 1, got {args.steps} and {args.repeats}")
    torch.set_num_threads(1)
    captured, embedder, batch_size = capture_texts(args.steps, args.seed)

    def encode(texts):
        start = time.process_time()
        with torch.no_grad():
            vectors = embedder.encode(texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
        return torch.as_tensor(vectors).float().cpu(), time.process_time() - start

    rows = []
    for step, texts in enumerate(captured):
        unique = list(dict.fromkeys(texts))
        ratios, every_s, distinct_s, diff = [], [], [], 0.0
        for repeat in range(args.repeats):
            order = ("every", "distinct") if repeat % 2 == 0 else ("distinct", "every")
            seconds = {}
            for mode in order:
                vectors, seconds[mode] = encode(texts if mode == "every" else unique)
                if mode == "every":
                    every_vectors = vectors
                else:
                    distinct_vectors = vectors
            row_of = {text: n for n, text in enumerate(unique)}
            mapped = distinct_vectors[[row_of[t] for t in texts]]
            diff = max(diff, float((mapped - every_vectors).abs().max()))
            ratios.append(seconds["distinct"] / seconds["every"])
            every_s.append(seconds["every"])
            distinct_s.append(seconds["distinct"])
        rows.append(dict(step=step, texts=len(texts), distinct=len(unique), cpu_seconds_every=every_s,
                         cpu_seconds_distinct=distinct_s, ratios=ratios, max_abs_vector_difference=diff))
        print(f"step {step}: {len(texts)} texts, {len(unique)} distinct; CPU seconds every {statistics.median(every_s):.3f}"
              f", distinct {statistics.median(distinct_s):.3f}; ratio median {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}, {max(ratios):.3f}]; max |vector difference| {diff:.2e}", flush=True)
    all_ratios = [r for row in rows for r in row["ratios"]]
    summary = dict(ratio_median=statistics.median(all_ratios), ratio_min=min(all_ratios), ratio_max=max(all_ratios),
                   pairs=len(all_ratios), texts=sum(r["texts"] for r in rows),
                   distinct=sum(r["distinct"] for r in rows),
                   max_abs_vector_difference=max(r["max_abs_vector_difference"] for r in rows))
    print(f"distinct / every, CPU seconds: median {summary['ratio_median']:.3f} [{summary['ratio_min']:.3f}, "
          f"{summary['ratio_max']:.3f}] over {summary['pairs']} pairs; {summary['distinct']} of {summary['texts']} "
          f"texts distinct; max |vector difference| {summary['max_abs_vector_difference']:.2e}")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(dict(settings=vars(args), steps=rows, summary=summary), f, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
