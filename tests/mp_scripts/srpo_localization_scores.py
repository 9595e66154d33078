"""2-process scored localization (launched by tests/test_srpo_multiprocess.py through torchrun).

Each rank scores its own chains with ``answer_scores`` (calibrated, one prefix pass per chain): different counts
per rank, and in the second call none on rank 0, which must still make the call's collective count gather. Each rank
writes its scores; the test compares them with one process scoring the same chains.
"""

import json
import os
import sys

# the chains and the trainer settings the test scores in one process
from tests.test_srpo_multiprocess import LOCALIZATION_CALLS, localization_trainer


def main(model_dir: str, out_dir: str):
    from trl_credit.core.context import BatchContext
    from trl_credit.srpo.localize import _prefix_can_be_shared, answer_scores
    from trl_credit.srpo.step_metrics import StepStats

    trainer = localization_trainer(model_dir, out_dir)
    ctx = BatchContext.for_trainer(trainer)  # what the localization gets inside a generation batch
    rank = ctx.process_index
    report = {"rank": rank, "world": ctx.num_processes, "shared": _prefix_can_be_shared(ctx), "calls": []}
    for call in LOCALIZATION_CALLS:
        stats = StepStats()
        scores = answer_scores(ctx, call[rank], stats)
        report["calls"].append({"scores": scores, "tokens": stats.localization_forward_tokens})
    with open(os.path.join(out_dir, f"scores_rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    from tests.mp import run_then_shut_down

    run_then_shut_down(main, sys.argv[1], sys.argv[2])
