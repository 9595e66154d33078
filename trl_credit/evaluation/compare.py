"""Did training help? The accuracy of a trained model against its base model on the same problems, with an interval
(``trl-credit-eval --adapter <dir> --compare_base``).

Accuracy at the sampling temperature alone cannot tell learning from sharpening (a model that only lowers its
entropy gains there too), so the comparison also reports greedy accuracy of both models (paired the same way),
pass@k at the largest k sampled, and the sharpening baseline: the base model at the better of greedy and the
sampling temperature. A trained model learned something only where it beats that baseline.

Both reports come from :func:`trl_credit.evaluation.evaluate.evaluate` with the same settings, so problem i is the same problem
in both. The difference is paired over problems: d_i = c_i / n - b_i / n (the trained and the base model's share of
correct samples on problem i), its mean is the difference of the two accuracies (avg@k = pass@1), and the 95%
interval is mean ± 1.96 · sd(d) / sqrt(m) over the m problems (normal approximation; it holds both the problems drawn
and the samples drawn per problem). An interval that holds 0 means no measured difference at this sample size: more
problems (``--num_problems``) or samples (``-n``) narrow it.
"""

from __future__ import annotations

import math

__all__ = ["paired_difference", "format_difference", "format_beyond_sampling"]

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


def format_beyond_sampling(trained: dict, base: dict, trained_greedy: dict, base_greedy: dict) -> str:
    """Lines for greedy accuracy (paired difference), pass@k at the largest k, and the sharpening baseline (module
    docstring); ``*_greedy`` are reports of one greedy sample per problem on the same problems."""
    greedy = paired_difference(trained_greedy, base_greedy)
    line = format_difference(greedy).replace("accuracy (avg@k = pass@1)", "greedy accuracy", 1)
    k = max(trained["pass_at_k"], key=int)
    temperature = trained.get("settings", {}).get("temperature")
    options = {"greedy": base_greedy["accuracy"], f"temperature {temperature}": base["accuracy"]}
    best = max(options, key=options.get)
    mine = max(trained_greedy["accuracy"], trained["accuracy"])
    return "\n".join([
        line,
        f"pass@{k}: trained {100 * trained['pass_at_k'][k]:.1f}% vs base {100 * base['pass_at_k'][k]:.1f}%",
        f"sharpening baseline (the base at its better of greedy and temperature {temperature}: {best}) "
        f"{100 * options[best]:.1f}%; the trained model's better of the two {100 * mine:.1f}%: "
        + ("above it" if mine > options[best] else "not above it: what training gained, lowering the temperature "
           "of the base gains too")])
