"""Behaviour on a real model: each method's mechanism moves the way its paper says, on SmolLM2-135M-Instruct + LoRA
(offline), the built-in arithmetic task (1-digit addition, ~45% base accuracy), a few training steps each.

These run the mechanism scripts of ``benchmarks/`` at a small size (``--train``: optimizer steps after the recorded
generation batches; SRPO always trains; DATPO and Cue-GRPO only generate, see their tests) and assert on what the trainers
computed, so a regression in behaviour (not only in formulas) fails here.
Slow: ``pytest -m slow tests/test_mechanisms_slow.py`` (about 10 minutes on a busy 2-core CPU).
"""

import os
import sys

import pytest

import tests.benchmarks_path  # noqa: F401  (benchmarks/ and its folders on sys.path)

pytestmark = pytest.mark.slow


def test_oppo_credit_concentrates_and_values_separate(tmp_path):
    import mechanism_oppo

    payload = mechanism_oppo.main(["--prompts", "2", "--generations", "8", "--tokens", "48", "--steps", "2",
                                   "--train", "--output", str(tmp_path / "oppo.json")])
    summary = payload["summary"]
    assert summary["completions_with_signal"] >= 8
    # Paper §3.3: credit concentrates on undetermined positions; GRPO's uniform credit puts 20% of the mass on the
    # top 20% tokens.
    assert summary["top20_anchored_all"] > 0.35
    assert summary["top20_normalized_all"] > 0.25
    # Fig. 1a: |A_t| accumulates earlier than uniform (V_t commits, V(1−V) collapses later in the sequence).
    assert summary["incorrect"]["anchored_share_first_half"] > 0.5
    # V_t commits: incorrect completions end below their prior and below the correct ones.
    incorrect, correct = summary["incorrect"], summary["correct"]
    assert incorrect["final_value"] < incorrect["prior_value"]
    assert incorrect["final_value"] < correct["final_value"]


def test_srpo_suffix_rows_get_more_per_token_signal(tmp_path):
    import mechanism_srpo

    payload = mechanism_srpo.main(["--prompts", "2", "--tokens", "48", "--steps", "2",
                                   "--output", str(tmp_path / "srpo.json")])
    summary = payload["summary"]
    assert summary["resets"] >= 2
    # Paper §5 / App. G: g = (|Â|/T)(1 − π) is higher on shared-prefix rows (shorter active span T, resampled
    # from a failed state) than on base rows, where both groups deliver gradient.
    # Pooled over every row with a nonzero advantage (with 2 prompts x 2 steps, prompts where both groups deliver
    # may be too few to compare alone).
    assert summary["suffix_signal_rows"] > summary["base_signal_rows"]
    if summary["prompts_both_deliver"]:
        assert summary["suffix_signal_mean"] > summary["base_signal_mean"]
    assert summary["suffix_active_tokens"] <= summary["base_active_tokens"]


def test_datpo_hard_prompts_get_more_branches(tmp_path):
    import mechanism_datpo

    # No optimizer step: budgets, forks and branches are all decided while generating, and DATPO trains on every leaf
    # of the batch at once (100+ rows here), a LoRA backward that needs over 15 GB on a CPU.
    payload = mechanism_datpo.main(["--prompts", "4", "--generations", "4", "--tokens", "32", "--steps", "1",
                                    "--output", str(tmp_path / "datpo.json")])
    prompts = payload["prompts"]
    rates = sorted({p["v_root"] for p in prompts})
    assert len(rates) >= 2, "all prompts had the same base pass rate: no difficulty contrast to test"
    # Eq. 1-2: K̂ and B̂ do not increase with the pass rate, and solved prompts do not branch.
    for easy in prompts:
        for hard in prompts:
            if hard["v_root"] < easy["v_root"]:
                assert hard["k_hat"] >= easy["k_hat"] and hard["b_hat"] >= easy["b_hat"]
    assert all(not p["branches"] for p in prompts if p["v_root"] >= 1.0)
    # What the trainer actually grew: the hardest prompts get more branches than the easiest.
    hardest = [len(p["branches"]) for p in prompts if p["v_root"] == rates[0]]
    easiest = [len(p["branches"]) for p in prompts if p["v_root"] == rates[-1]]
    assert sum(hardest) / len(hardest) > sum(easiest) / len(easiest)


def test_cue_grpo_rarer_clusters_get_larger_weights(tmp_path):
    import mechanism_cue_grpo

    # No optimizer step: the redistribution happens before the loss, and a 64-row LoRA backward on a CPU takes
    # several GB (8 prompts are needed for groups whose positives split into clusters of different sizes).
    payload = mechanism_cue_grpo.main(["--prompts", "8", "--generations", "8", "--tokens", "64", "--steps", "1",
                                       "--output", str(tmp_path / "cue.json")])
    groups = payload["groups"]
    unequal = [g for g in groups if g["nonuniform_sizes"]]
    assert unequal, "no group had clusters of different sizes: the cue partition found one strategy everywhere"
    # Eq. 3/8: within a group, a smaller cluster never gets a smaller weight than a larger one, and some get more.
    for group in unequal:
        for a in group["members"]:
            for b in group["members"]:
                if a["cluster_size"] < b["cluster_size"]:
                    assert a["weight"] >= b["weight"] - 1e-9
    assert any(max(m["weight"] for m in g["members"]) > min(m["weight"] for m in g["members"]) + 1e-6
               for g in unequal)
    # Fig. 2c: the positive mass grows slower than the cluster size (GRPO: slope 1), and moves to minority clusters.
    assert payload["summary"]["mass_slope"] < 1.0
    assert payload["summary"]["cue_minority_share"] > payload["summary"]["grpo_minority_share"]
