"""Question: How much embedder time do length batches and a cache across steps save?

DATPO's sibling-diversity embedder through ``BlockEmbedder`` (batches of one token length, a cache of the texts of
earlier steps) against the previous path (each distinct text once, in the embedder's own padded batches), side by
side on the same texts.

Captures the block texts of ``--steps`` DATPO steps on the tiny testbed (``datpo_embedder_dedup.capture_texts``: the
grid's settings, the committed build). Then ``--repeats`` times, in alternating order, each path embeds the steps'
texts in step order (``BlockEmbedder`` starts each repeat with an empty cache, so what it finds there is what the
earlier steps of the same run left, as in training). Prints the per-step ratio of CPU seconds (new / previous) with
its spread, the texts sent to the embedder, the padded tokens of both paths and the largest difference between a
text's vectors in the two (float32 round-off of another batch shape).

    python benchmarks/cost/datpo_embedder_batches.py --steps 6 --repeats 3
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

from datpo_embedder_dedup import RESULTS, capture_texts  # noqa: E402


def padded_tokens(embedder, batches: list[list[str]]) -> tuple[int, int]:
    """(real, padded) tokens of ``batches`` as ``encode`` pads them: each batch to its longest text."""
    real = padded = 0
    for batch in batches:
        lengths = [len(row) for row in embedder.tokenizer(batch, truncation=True,
                                                          max_length=embedder.max_seq_length)["input_ids"]]
        real += sum(lengths)
        padded += max(lengths) * len(lengths)
    return real, padded


def previous_batches(embedder, unique: list[str], batch_size: int) -> list[list[str]]:
    """The batches ``encode`` makes of ``unique``: sorted by character length, longest first."""
    ordered = sorted(unique, key=len, reverse=True)
    return [ordered[start : start + batch_size] for start in range(0, len(ordered), batch_size)]


def main():
    from trl_credit.datpo.embedding import BlockEmbedder

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=6, help="DATPO steps whose texts are embedded")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs over the steps per path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-size", type=int, default=4096, help="BlockEmbedder's cache (texts)")
    parser.add_argument("--output", default=os.path.join(RESULTS, "datpo_embedder_batches.json"))
    args = parser.parse_args()
    if args.steps < 1 or args.repeats < 1:
        raise SystemExit(f"--steps and --repeats: at least 1, got {args.steps} and {args.repeats}")
    torch.set_num_threads(1)
    captured, embedder, batch_size = capture_texts(args.steps, args.seed)

    def previous(texts):
        unique = list(dict.fromkeys(texts))
        with torch.no_grad():
            vectors = embedder.encode(unique, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
        row_of = {text: n for n, text in enumerate(unique)}
        return torch.as_tensor(vectors).float().cpu()[[row_of[t] for t in texts]]

    seconds = {"previous": [[] for _ in captured], "new": [[] for _ in captured]}
    diff, sent = 0.0, []
    for repeat in range(args.repeats):
        order = ("previous", "new") if repeat % 2 == 0 else ("new", "previous")
        vectors = {}
        for mode in order:
            block_embedder = BlockEmbedder(embedder, batch_size, args.cache_size)
            vectors[mode] = []
            for step, texts in enumerate(captured):
                start = time.process_time()
                vectors[mode].append(previous(texts) if mode == "previous" else block_embedder.embed(texts))
                seconds[mode][step].append(time.process_time() - start)
            if mode == "new":
                sent = block_embedder.encoded_texts
        diff = max(diff, max(float((a - b).abs().max()) for a, b in zip(vectors["previous"], vectors["new"])))
    rows, seen = [], set()
    for step, texts in enumerate(captured):
        unique = list(dict.fromkeys(texts))
        missing = [t for t in unique if t not in seen]
        seen.update(unique)
        real, padded_before = padded_tokens(embedder, previous_batches(embedder, unique, batch_size))
        _, padded_after = padded_tokens(embedder, BlockEmbedder(embedder, batch_size)._batches(missing)) if missing \
            else (0, 0)
        ratios = [n / p for n, p in zip(seconds["new"][step], seconds["previous"][step])]
        rows.append(dict(step=step, texts=len(texts), distinct=len(unique), not_cached=len(missing),
                         real_tokens=real, padded_tokens_previous=padded_before, padded_tokens_new=padded_after,
                         cpu_seconds_previous=seconds["previous"][step], cpu_seconds_new=seconds["new"][step],
                         ratios=ratios))
        print(f"step {step}: {len(unique)} distinct texts, {len(missing)} not cached; tokens real {real}, padded "
              f"previous {padded_before}, new {padded_after}; CPU s previous "
              f"{statistics.median(seconds['previous'][step]):.3f}, new {statistics.median(seconds['new'][step]):.3f}"
              f"; ratio {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]", flush=True)
    all_ratios = [r for row in rows for r in row["ratios"]]
    totals = [sum(seconds["new"][s][r] for s in range(len(captured)))
              / sum(seconds["previous"][s][r] for s in range(len(captured))) for r in range(args.repeats)]
    summary = dict(ratio_median=statistics.median(all_ratios), ratio_min=min(all_ratios), ratio_max=max(all_ratios),
                   pairs=len(all_ratios), run_total_ratios=totals, texts_sent_new=sent,
                   distinct_texts_previous=sum(r["distinct"] for r in rows),
                   padded_tokens_previous=sum(r["padded_tokens_previous"] for r in rows),
                   padded_tokens_new=sum(r["padded_tokens_new"] for r in rows),
                   real_tokens_previous=sum(r["real_tokens"] for r in rows), max_abs_vector_difference=diff)
    print(f"new / previous, CPU seconds per step: median {summary['ratio_median']:.3f} [{summary['ratio_min']:.3f}, "
          f"{summary['ratio_max']:.3f}] over {summary['pairs']} (step, repeat) pairs; whole runs "
          f"{', '.join(f'{t:.3f}' for t in totals)}; texts embedded {sent} of {summary['distinct_texts_previous']}; "
          f"tokens computed {summary['padded_tokens_new']} vs {summary['padded_tokens_previous']} "
          f"({summary['real_tokens_previous']} real before the cache); max |vector difference| {diff:.2e}")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(dict(settings=vars(args), steps=rows, summary=summary), f, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
