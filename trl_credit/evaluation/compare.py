"""Did training help? The accuracy of a trained model against its base model on the same problems, with an interval
(``trl-credit-eval --adapter <dir> --compare_base``).

Both reports come from :func:`trl_credit.evaluation.evaluate.evaluate` with the same settings, so problem i is the same problem
in both. The difference is paired over problems: d_i = c_i / n - b_i / n (the trained and the base model's share of
correct samples on problem i), its mean is the difference of the two accuracies (avg@k = pass@1), and the 95%
interval is mean ± 1.96 · sd(d) / sqrt(m) over the m problems (normal approximation; it holds both the problems drawn
and the samples drawn per problem). An interval that holds 0 means no measured difference at this sample size: more
problems (``--num_problems``) or samples (``-n``) narrow it.
"""

from __future__ import annotations

import math

__all__ = ["paired_difference", "format_difference"]

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def _shares(report: dict) -> list[float]:
    return [p["num_correct"] / p["num_samples"] for p in report["problems"]]


def paired_difference(trained: dict, base: dict) -> dict:
    """``{"trained", "base", "difference", "low", "high", "num_problems"}``: accuracies (fractions), their
    difference and its 95% interval (``low``/``high`` None with fewer than 2 problems). Refuses reports of other
    problems or sample counts."""
    if trained["num_problems"] != base["num_problems"] or trained["num_samples"] != base["num_samples"]:
        raise ValueError(
            f"the reports differ in problems or samples ({trained['num_problems']} x {trained['num_samples']} vs "
            f"{base['num_problems']} x {base['num_samples']}): compare evaluations run with the same settings."
        )
    questions = [(p.get("prompt"), p.get("answer")) for p in trained["problems"]]
    if questions != [(p.get("prompt"), p.get("answer")) for p in base["problems"]]:
        raise ValueError("the reports hold different problems: compare evaluations run with the same settings.")
    d = [a - b for a, b in zip(_shares(trained), _shares(base))]
    m = len(d)
    mean = sum(d) / m
    result = {"trained": trained["accuracy"], "base": base["accuracy"], "difference": mean, "low": None,
              "high": None, "num_problems": m}
    if m >= 2:
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (m - 1))
        half = Z_95 * sd / math.sqrt(m)
        result["low"], result["high"] = mean - half, mean + half
    return result


def format_difference(result: dict) -> str:
    """One line: both accuracies and the difference in percentage points with its interval."""
    line = (f"accuracy (avg@k = pass@1): trained {100 * result['trained']:.1f}% vs base {100 * result['base']:.1f}%: "
            f"{100 * result['difference']:+.1f} points")
    if result["low"] is None:
        return line + " (one problem: no interval)"
    verdict = ("no measured difference: the interval holds 0" if result["low"] <= 0 <= result["high"]
               else "better than the base" if result["low"] > 0 else "worse than the base")
    return (line + f", 95% interval {100 * result['low']:+.1f} to {100 * result['high']:+.1f} "
            f"(paired over {result['num_problems']} problems): {verdict}")
