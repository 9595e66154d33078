"""The TRL helpers every trainer shares, re-exported from the modules that hold them (this name is kept for code
that imports from it). Nothing method-specific lives in them; the private TRL names they use are listed in
:mod:`trl_credit.trl_compat` (supported TRL versions and shims).

- :mod:`trl_credit.trainer_setup`: construction (:func:`resolve_method_args`, :func:`check_single_turn`,
  :func:`bind_success` / :func:`rollout_success`, :func:`outside_zero3_init`), :func:`speaker` and :func:`trainer_mode`.
- :mod:`trl_credit.trainer_logs`: :func:`log_metric`, :func:`warn_once`, :func:`nonfinite_reward_groups` /
  :func:`zero_nonfinite_groups`, :func:`replace_logged_advantages`.
- :mod:`trl_credit.collectives`: :func:`gather_rows` / :func:`gather_counts`, :func:`fill_rows` (filler rows for
  a collective call), :func:`local_rows` (this process's slice of the global batch), :func:`rewards_of_extra_rows`.
- :mod:`trl_credit.scoring`: :func:`pad_rows`, :func:`score_completions`.
- :mod:`trl_credit.generation`: :func:`sampling_overrides`, :func:`generate_from_prefixes`,
  :func:`one_weight_push` / :class:`OneWeightPushMixin`.
- :mod:`trl_credit.generation_hooks`: :func:`hf_generate_hooks`, :class:`GenerationRecorder` (transformers only, no
  TRL import).
- :mod:`trl_credit.mixins`: :class:`RolloutCaptureMixin`, :class:`MethodRNGStateMixin`,
  :class:`EmptyCompletionCheckMixin`, :class:`CPUMemoryMixin` / :func:`return_freed_buffers`.
"""

from __future__ import annotations

from trl_credit.collectives import (
    decode_completions,
    fill_rows,
    gather_counts,
    gather_rows,
    local_rows,
    rewards_of_extra_rows,
)
from trl_credit.generation import (
    OneWeightPushMixin,
    generate_from_prefixes,
    one_weight_push,
    sampling_overrides,
)
from trl_credit.generation_hooks import (  # noqa: F401 - _layers_rows_selectable: read by tests
    GenerationRecorder,
    _layers_rows_selectable,
    hf_generate_hooks,
    kept_length,
)
from trl_credit.mixins import (
    CPUMemoryMixin,
    EmptyCompletionCheckMixin,
    MethodRNGStateMixin,
    RolloutCapture,
    RolloutCaptureMixin,
    refuse_empty_completions,
    return_freed_buffers,
)
from trl_credit.scoring import pad_rows, score_completions
from trl_credit.trainer_logs import (
    log_metric,
    nonfinite_reward_groups,
    replace_logged_advantages,
    warn_once,
    zero_nonfinite_groups,
)
from trl_credit.trainer_setup import (
    bind_success,
    check_single_turn,
    outside_zero3_init,
    resolve_method_args,
    rollout_success,
    speaker,
    trainer_mode,
)

__all__ = [
    "sampling_overrides",
    "generate_from_prefixes",
    "gather_rows",
    "gather_counts",
    "fill_rows",
    "local_rows",
    "score_completions",
    "log_metric",
    "pad_rows",
    "trainer_mode",
    "speaker",
    "check_single_turn",
    "outside_zero3_init",
    "resolve_method_args",
    "decode_completions",
    "rewards_of_extra_rows",
    "bind_success",
    "rollout_success",
    "warn_once",
    "nonfinite_reward_groups",
    "zero_nonfinite_groups",
    "replace_logged_advantages",
    "one_weight_push",
    "OneWeightPushMixin",
    "RolloutCapture",
    "RolloutCaptureMixin",
    "MethodRNGStateMixin",
    "EmptyCompletionCheckMixin",
    "CPUMemoryMixin",
    "return_freed_buffers",
    "refuse_empty_completions",
    "GenerationRecorder",
    "hf_generate_hooks",
    "kept_length",
]
