"""What a finished run did, read from its ``log_history``: the rows of the closing summary
(:func:`trl_credit.scripts.training_summary`) and of the model card's results (:mod:`trl_credit.model_card`)."""

from __future__ import annotations

__all__ = ["TRL_METRIC_PREFIXES", "first_last", "method_metric_names", "result_rows"]

# TRL's own metric groups; any other "<prefix>/<name>" metric is the method's (srpo/, oppo/, datpo/, cue/, ...).
TRL_METRIC_PREFIXES = {"completions", "rewards", "clip_ratio", "sampling", "tools", "vespo"}


def first_last(log_history: list[dict], key: str) -> tuple[float, float] | None:
    """The first and last logged value of ``key`` (None when it was never logged)."""
    values = [entry[key] for entry in log_history if isinstance(entry.get(key), (int, float))]
    return (values[0], values[-1]) if values else None


def method_metric_names(log_history: list[dict]) -> list[str]:
    """Metric names a method logs on top of TRL's: every ``prefix/name`` whose prefix is not one of TRL's groups."""
    names = []
    for entry in log_history:
        for key in entry:
            prefix = key.split("/", 1)[0]
            if "/" in key and prefix not in TRL_METRIC_PREFIXES and not key.startswith("eval_") and key not in names:
                names.append(key)
    return names


def result_rows(log_history: list[dict]) -> list[tuple[str, tuple[float, float] | None]]:
    """(metric, (first, last)) for the reward, ``frac_reward_zero_std`` and every method metric, in that order; the
    pair is None for a metric never logged."""
    history = [entry for entry in log_history if "step" in entry]
    keys = ["reward", "frac_reward_zero_std", *method_metric_names(history)]
    return [(key, first_last(history, key)) for key in keys]
