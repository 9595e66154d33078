"""Is it working? A few logged metrics per method with the range a working run stays in, and what a value outside
it means. The example scripts' closing summary marks every value outside its range; each method page lists its own
(docs/<method>.md#is-it-working). The thresholds are those of the one-time warnings (README, "No silent
degeneration"), where a metric has one."""

from __future__ import annotations

import operator
from dataclasses import dataclass

__all__ = ["HealthCheck", "HEALTH_CHECKS", "health_check", "outside"]

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}


@dataclass(frozen=True)
class HealthCheck:
    """``metric`` stays ``op`` ``bound`` in a working run (e.g. ``srpo/single_thought_rate <= 0.5``)."""

    metric: str
    op: str
    bound: float
    meaning: str  # what a value outside the range means, and the fix
    page: str  # the docs section that explains it

    @property
    def healthy(self) -> str:
        return f"{self.op} {self.bound:g}"

    def holds(self, value: float) -> bool:
        return _OPS[self.op](value, self.bound)


HEALTH_CHECKS = [
    HealthCheck("frac_reward_zero_std", "<", 1, "every group's rewards were equal (all right or all wrong): every "
                "advantage was 0 and the step learned nothing; use easier or harder prompts, or more generations",
                "docs/troubleshooting.md#every-group-has-equal-rewards"),
    HealthCheck("cue/single_cluster_rate", "<=", 0.5, "the correct answers of most groups formed one cluster: "
                "uniform weights, GRPO with positives x cue_tau; ask for step-by-step reasoning or "
                "cue_partition='judge'", "docs/cue_grpo.md#is-it-working"),
    HealthCheck("cue/frac_positive_advantage_excluded", "<", 1, "no completion with A_i > 0 was correct: plain GRPO; "
                "check success_reward is the verifier", "docs/cue_grpo.md#is-it-working"),
    HealthCheck("oppo/success_rate", ">", 0, "no completion counted as correct, so the prior is k = 0 everywhere; "
                "check success_reward is the verifier", "docs/oppo.md#is-it-working"),
    HealthCheck("oppo/evidence_auc", ">", 0.5, "the oracle's evidence ranks correct completions no higher than "
                "incorrect ones of the same prompt: the scorer does not read the answer in the oracle prompt, and the "
                "per-token credit is noise; oracle='teacher', or an oracle_template the model reads",
                "docs/oppo.md#is-it-working"),
    HealthCheck("datpo/v_root", "<", 1, "every prompt was solved by its base rollouts: no tree grew, DATPO trained "
                "as GRPO; use harder prompts", "docs/datpo.md#is-it-working"),
    HealthCheck("datpo/no_fork_rate", "==", 0, "base rollouts that should branch got no fork (one-sentence answers): "
                "fork_position='after_token' or fork_fallback='tok_entropy'", "docs/datpo.md#is-it-working"),
    HealthCheck("srpo/single_thought_rate", "<=", 0.5, "seeds with one thought can only reset at the question: SRPO "
                "is GRPO on two groups; rollout_template='lines' or a thought_delimiter the model writes",
                "docs/srpo.md#is-it-working"),
    HealthCheck("srpo/fallback_rate", "<", 1, "no prompt found an incorrect seed: the step trained as GRPO on the "
                "base group; check success_reward is the verifier, or use harder prompts",
                "docs/srpo.md#is-it-working"),
    HealthCheck("srpo/localization_parse_rate", ">=", 0.5, "most localization answers named no step: those resets "
                "took the fallback (scored choice or random); localization='scored'", "docs/srpo.md#is-it-working"),
]

_BY_METRIC = {check.metric: check for check in HEALTH_CHECKS}


def health_check(metric: str) -> HealthCheck | None:
    """The check of ``metric``, or None when it has none."""
    return _BY_METRIC.get(metric)


def outside(metric: str, value: float) -> bool:
    """Whether ``value`` of ``metric`` lies outside its healthy range (False for a metric without a check)."""
    check = _BY_METRIC.get(metric)
    return check is not None and not check.holds(value)
