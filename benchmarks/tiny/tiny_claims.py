"""The claims table of a grid whose runs predate greedy evaluation (the tiny regime, BENCHMARKS.md section 4): one row
per paper claim, its test at the training temperature, the number and the verdict, and whether a significant verdict
survives Holm's correction over the table's comparisons (multiplicity.py). Called by ``tiny_report.py``; a grid whose
runs measured greedy accuracy gets regime_claims.py's table instead.
"""

from __future__ import annotations

from multiplicity import adjust_family, family_counts, holm_note
from tiny_report import LABELS, backward_share, final_accuracy, final_pass, interval, paired, verdict

__all__ = ["claims_table", "localization_verdict"]


def localization_verdict(srpo: dict, rrpo: dict) -> str:
    """Better than the uniform draw on both counts (exact h_o and a clean prefix), or say which count is not."""
    exact = srpo["srpo/localization_exact_rate"] > rrpo["srpo/localization_exact_rate"]
    clean = srpo["srpo/localization_clean_rate"] > rrpo["srpo/localization_clean_rate"]
    if exact and clean:
        return "holds (mechanism), by little" if srpo["srpo/localization_exact_rate"] < 2 * rrpo[
            "srpo/localization_exact_rate"] else "holds (mechanism)"
    if exact or clean:
        return f"mixed: better on {'exact h_o' if exact else 'clean prefix'}, not on the other"
    return "does not hold: no better than a uniform draw"


def claims_table(runs: dict, summary: dict, base: dict, mechanisms: dict | None) -> str:
    """One row per paper claim: the claim, the test here, the number, the verdict; the rows read from paired seeds
    form the table's family of comparisons, and a significant verdict says whether it survives Holm over them."""
    rows = []
    tested: dict[int, list[float]] = {}  # row index -> paired differences (the family of comparisons)

    def add(claim, test, values, higher=True, digits=3, pair=None):
        tokens = "-"
        if pair and all(m in summary for m in pair):  # generated tokens per step, A's over B's
            tokens = f"{summary[pair[0]]['tokens_per_step'] / summary[pair[1]]['tokens_per_step']:.2f}x"
        if not values:
            rows.append((claim, test, "-", "not tested yet (no paired runs)", tokens))
            return
        mean, half = interval(values)
        number = f"{mean:+.{digits}f} ± {half:.{digits}f}" if len(values) > 1 else f"{mean:+.{digits}f}"
        tested[len(rows)] = values
        rows.append((claim, test, number, verdict(values, higher), tokens))

    add("OPPO improves over GRPO (abstract, §5)", "final held-out accuracy, OPPO - GRPO per seed",
        paired(runs, "oppo", "grpo", final_accuracy), pair=("oppo", "grpo"))
    if mechanisms and "oppo" in mechanisms:
        o, g = mechanisms["oppo"]["slips"], mechanisms.get("grpo", {}).get("slips", {})
        rows.append(("OPPO's recursion concentrates credit on pivotal tokens (§3.3, Fig. 1a)",
                     "share of an incorrect completion's negative advantage on its slip line (the checker's first "
                     "wrong line), starting model",
                     f"OPPO {o['mass_on']:.2f} vs GRPO {g.get('mass_on', float('nan')):.2f}, tokens {o['tokens_on']:.2f} "
                     f"({o['completions']} slipped completions)",
                     "holds (mechanism)" if o["mass_on"] > 2 * o["tokens_on"] else "not shown", "-"))
    add("SRPO outperforms GRPO (abstract, §5)", "final accuracy, SRPO - GRPO",
        paired(runs, "srpo", "grpo", final_accuracy), pair=("srpo", "grpo"))
    add("SRPO outperforms RRPO (abstract, §5)", "final accuracy, SRPO - RRPO",
        paired(runs, "srpo", "rrpo", final_accuracy), pair=("srpo", "rrpo"))
    add("Resets at the credit-assignment oracle beat random resets (§3, CPI analysis)",
        "final accuracy, SRPO with oracle resets - RRPO", paired(runs, "srpo_oracle", "rrpo", final_accuracy),
        pair=("srpo_oracle", "rrpo"))
    for method in ("srpo", "rrpo"):
        entry = summary.get(method, {})
        if "srpo/correction_rate_clean_prefix" in entry:
            rows.append((f"Suffixes after a clean prefix are corrected more often than after an erroneous one "
                         f"(Fig. 4; {LABELS[method]})", "training logs: correction rate of suffix rows by prefix",
                         f"clean {entry['srpo/correction_rate_clean_prefix']:.2f} vs erroneous "
                         f"{entry.get('srpo/correction_rate_erroneous_prefix', float('nan')):.2f}",
                         "holds (mechanism)" if entry["srpo/correction_rate_clean_prefix"] >
                         entry.get("srpo/correction_rate_erroneous_prefix", 1) else "does not hold", "-"))
    if "srpo/localization_exact_rate" in summary.get("srpo", {}) and "rrpo" in summary:
        srpo, rrpo = summary["srpo"], summary["rrpo"]
        rows.append(("The policy self-localizes the first erroneous thought (§4.2)",
                     "h* = the checker's first wrong thought, SRPO's decoded pick vs RRPO's uniform draw",
                     f"exact {srpo['srpo/localization_exact_rate']:.2f} vs {rrpo['srpo/localization_exact_rate']:.2f}; "
                     f"clean prefix {srpo['srpo/localization_clean_rate']:.2f} vs "
                     f"{rrpo['srpo/localization_clean_rate']:.2f}",
                     localization_verdict(srpo, rrpo), "-"))
    add("Cue-GRPO improves repeated sampling, most at high k (abstract, §5)",
        "pass@2 (pass@8 is 1.0 for the starting model: no room), Cue-GRPO - GRPO",
        paired(runs, "cue_grpo", "grpo", final_pass(2)), pair=("cue_grpo", "grpo"))
    add("Cue-GRPO keeps rare correct structures (§3-4)", "share of backward (rare) samples, Cue-GRPO - GRPO",
        paired(runs, "cue_grpo", "grpo", backward_share), pair=("cue_grpo", "grpo"))
    add("DATPO outperforms GRPO, especially in pass@k (abstract)", "pass@2, DATPO (adaptive) - GRPO",
        paired(runs, "datpo", "grpo", final_pass(2)), pair=("datpo", "grpo"))
    add("... at GRPO's budget (compute-matched: <= G leaves a prompt)", "final accuracy, DATPO (<= G leaves) - GRPO",
        paired(runs, "datpo_matched", "grpo", final_accuracy), pair=("datpo_matched", "grpo"))
    if mechanisms and "datpo_forks" in mechanisms:
        f = mechanisms["datpo_forks"]
        after, uniform = f["fork_share"]["after"], f["line_start_share"]["after"]
        rows.append(("DATPO forks where the outcome is decided: high-entropy sentence starts (§3.2, App. D.1)",
                     "share of the forks of incorrect rollouts after the checker's first wrong line, vs the line "
                     "starts there (a uniform choice), starting model",
                     f"{after:.2f} vs {uniform:.2f} ({f['forks']} forks); branches correct before/on/after "
                     + " / ".join(f"{f['branch_correct_rate'][r]:.2f}" for r in ("before", "on", "after")),
                     "holds (mechanism)" if after < uniform else "does not hold", "-"))
    add("Process supervision (DeepSeekMath §4.1.3) beats outcome supervision: the oracle token credit",
        "final accuracy, process credit (the step checker) - GRPO", paired(runs, "process", "grpo", final_accuracy),
        pair=("process", "grpo"))
    add("Composition: SRPO's resets with OPPO's credit beat each alone", "final accuracy, SRPO x OPPO - OPPO",
        paired(runs, "srpo_oppo", "oppo", final_accuracy), pair=("srpo_oppo", "oppo"))
    if "prime" in runs:
        add("PRIME's implicit PRM (outcome labels only) beats outcome supervision (Cui et al. 2025, §4)",
            "final accuracy, PRIME - GRPO", paired(runs, "prime", "grpo", final_accuracy), pair=("prime", "grpo"))
        add("... and reaches the process oracle", "final accuracy, PRIME - process credit",
            paired(runs, "prime", "process", final_accuracy), pair=("prime", "process"))
    family = adjust_family(tested)
    count, unadjusted, survive = family_counts(family)
    for index, (p, adjusted) in family.items():
        note = holm_note(p, adjusted)
        if note:
            claim, test, number, said, tokens = rows[index]
            rows[index] = (claim, test, number, f"{said}; {note}", tokens)
    lines = [f"**Comparisons: {count}** (the rows read from paired seeds; the mechanism rows are readings, not tests). "
             "A verdict that holds or shows the reverse is significant unadjusted (its 95% interval excludes 0: the "
             "two-sided paired t-test over seeds gives p < 0.05); \"survives Holm\" marks one whose Holm-adjusted "
             f"p-value over the {count} comparisons is <= 0.05 too, \"unadjusted only\" one that does not. "
             f"{unadjusted} verdicts are significant unadjusted, {survive} survive Holm.", "",
             "| claim (paper section) | test on the tiny testbed | number (mean ± 95% t-interval) | verdict | "
             "generated tokens A / B |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    return "\n".join(lines) + "\n"
