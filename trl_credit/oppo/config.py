"""Configuration of :class:`~trl_credit.oppo.OPPOTrainer` (docs/oppo.md; paper §4, App. G, Table 13)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from trl_credit.core.success import SuccessArguments
from trl_credit.core.viz import CreditLoggingArguments
from trl_credit.trl_bridge.compat import adopt_activation_checkpointing

from trl_credit.oppo.oracle import DEFAULT_ORACLE_TEMPLATE

__all__ = ["OPPOConfig", "OPPOFields"]

ORACLE_MODES = ("self", "teacher")
PLAIN_LOGPS_SOURCES = ("auto", "recompute")


@dataclass
class OPPOFields:
    """The OPPO fields and their checks, mixed into :class:`OPPOConfig` and
    :class:`~trl_credit.config.CreditConfig` (credit ``oppo``)."""

    # TrainingArguments' __post_init__ turns a JSON string of these fields (command line, YAML) into a dict.
    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + ["teacher_model_init_kwargs"]

    oracle: str = field(
        default="self",
        metadata={
            "help": "Scorer of the evidence log λ_t: 'self' (the current policy, no grad: Self-OPPO) or 'teacher' "
            "(a frozen model with the same tokenizer: Teacher-OPPO)."
        },
    )
    teacher_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Teacher model name or path for oracle='teacher' (or pass `teacher_model=` to the trainer)."},
    )
    teacher_model_init_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for `from_pretrained` when the teacher is given by name, e.g. "
            "'{\"dtype\": \"bfloat16\"}' or a quantization_config."
        },
    )
    answer_column: str | None = field(
        default=None,
        metadata={"help": "Dataset column with the ground-truth answer y* that conditions the oracle. None: `answer` "
                  "if the training dataset has it, else `solution` (TRL's datasets and trl.rewards.accuracy_reward), "
                  "said once at construction."},
    )
    oracle_template: str = field(
        default=DEFAULT_ORACLE_TEMPLATE,
        metadata={
            "help": "Text appended to the last user message (or to a plain-text prompt) to build the oracle prompt; "
            "must contain '{answer}'."
        },
    )
    plain_logps: str = field(
        default="auto",
        metadata={
            "help": "Source of the self-oracle's plain log-probs s_t: 'auto' (reuse TRL's old log-probs, the "
            "log-probs recorded during HF generation, or vLLM's sampler log-probs under plain sampling, so the extra "
            "pass scores only the B oracle rows) or 'recompute' (score the B plain rows in the extra pass too)."
        },
    )
    evidence_clip: float = field(
        default=3.0,
        metadata={"help": "Evidence clip bound C: log λ_t = clip(o_t − s_t, −C, C) (paper Eq. 20, App. G.1)."},
    )
    prior_strength: float = field(
        default=1.0,
        metadata={"help": "Beta prior strength α: ℓ_0 = log((k + α)/(G − k + α)) (paper Eq. 20, App. G.2)."},
    )
    advantage_eps: float = field(
        default=1e-6,
        metadata={"help": "ε in the per-group token normalization Ã = (Â − mean)/(std + ε) (docs/oppo.md#group-normalization)."},
    )
    direction_anchoring: bool = field(
        default=True,
        metadata={"help": "Ablation switch: False removes anchoring (token sign from log λ_t, not from A^seq)."},
    )
    state_tracking: bool = field(
        default=True,
        metadata={"help": "Ablation switch: False removes tracking (A_t = log λ_t / 4, state weight fixed at 1/4)."},
    )
    evidence_clipping: bool = field(
        default=True,
        metadata={"help": "Ablation switch: False removes evidence clipping (log λ_t = o_t − s_t)."},
    )
    use_prior: bool = field(
        default=True,
        metadata={"help": "Ablation switch: False removes the group prior (ℓ_0 = 0, V_0 = 1/2)."},
    )
    log_lambda_only: bool = field(
        default=False,
        metadata={
            "help": "Ablation switch: True uses the anchored raw evidence A_t = sign(A^seq)|o_t − s_t| (no tracking, "
            "no clipping), the 'log λ_t only' row of Table 2."
        },
    )

    def _check_oppo_after_grpo(self) -> None:
        """Validate the OPPO fields (run after GRPOConfig's ``__post_init__``)."""
        # multi_objective_aggregation: both are accepted. k comes from the verifier, not from the advantages, and
        # under "normalize_then_sum" TRL's advantage is a sum of per-group z-scores (zero mean within each group) over
        # the batch std, so its sign still ranks a completion against its own group: A^seq's role in Eq. 21.
        if self.plain_logps not in PLAIN_LOGPS_SOURCES:
            raise ValueError(f"`plain_logps` must be one of {PLAIN_LOGPS_SOURCES}, got {self.plain_logps!r}.")
        if self.oracle not in ORACLE_MODES:
            raise ValueError(f"`oracle` must be one of {ORACLE_MODES}, got {self.oracle!r}.")
        if self.oracle == "self" and self.teacher_model_name_or_path is not None:
            raise ValueError(
                "`teacher_model_name_or_path` is set but `oracle='self'`: set `oracle='teacher'` to score with the "
                "teacher, or unset `teacher_model_name_or_path`."
            )
        if self.teacher_model_init_kwargs is not None and not isinstance(self.teacher_model_init_kwargs, dict):
            raise ValueError(
                "`teacher_model_init_kwargs` must be a dict (or a JSON string of one), got "
                f"{type(self.teacher_model_init_kwargs).__name__}."
            )
        if self.answer_column is not None and (not isinstance(self.answer_column, str) or not self.answer_column):
            raise ValueError(f"`answer_column` must be a non-empty column name or None (`answer`, else `solution`), "
                             f"got {self.answer_column!r}.")
        if "{answer}" not in self.oracle_template:
            raise ValueError(f"`oracle_template` must contain the placeholder '{{answer}}', got {self.oracle_template!r}.")
        try:
            self.oracle_template.format(answer="0")
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(
                f"`oracle_template` must be a format string whose only placeholder is '{{answer}}' (write literal braces "
                f"as '{{{{' and '}}}}'): {error!r}."
            ) from error
        if not self.evidence_clip > 0:
            raise ValueError(f"`evidence_clip` (C) must be > 0, got {self.evidence_clip}.")
        if not self.prior_strength > 0:
            raise ValueError(f"`prior_strength` (α) must be > 0, got {self.prior_strength}.")
        if not self.advantage_eps > 0:
            raise ValueError(f"`advantage_eps` must be > 0, got {self.advantage_eps}.")


# Mixins before GRPOConfig: dataclass fields follow the reversed MRO, so GRPOConfig's fields keep their positions
# (`OPPOConfig("my_run")` is the output dir) and the mixins' and the method's fields come after them.
@dataclass
class OPPOConfig(OPPOFields, CreditLoggingArguments, SuccessArguments, GRPOConfig):
    r"""
    Configuration for [`OPPOTrainer`]: every [`~trl.GRPOConfig`] argument (with GRPOConfig's defaults), plus the
    ones below, whose defaults are the paper's (Eq. 20, Table 13: C = 3.0, α = 1).

    > Oracle

    oracle (`str`, defaults to `"self"`): which model scores the evidence: `"self"` (the policy, no grad) or
        `"teacher"` (a frozen model sharing the tokenizer).
    teacher_model_name_or_path (`str` or `None`): the teacher for `oracle="teacher"` (or pass `teacher_model=` to
        the trainer, name or instance).
    teacher_model_init_kwargs (`dict` or `None`): `from_pretrained` kwargs for a teacher given by name (e.g.
        `{"dtype": "bfloat16"}`, a `quantization_config`).
    answer_column (`str` or `None`, defaults to `None`): dataset column holding the ground-truth answer y*. `None`:
        `answer` if the training dataset has it, else `solution` (TRL's convention), said once at construction.
    oracle_template (`str`): text with `{answer}` appended to the last user message to build the oracle prompt.
    plain_logps (`str`, defaults to `"auto"`): where the self-oracle's plain log-probs s_t come from. `"auto"`: from
        what already exists with a float32 LM head, like o_t's (docs/oppo.md#evidence), so the extra no-grad pass
        scores only the B oracle rows (the paper's one extra pass): TRL's old log-probs when TRL computes them
        without bf16/fp16 (or with `cast_lm_head_to_fp32`), else the log-probs recorded during HF generation
        (log-softmax of the temperature-scaled logits at the sampled token, with the head in float32), else, without
        bf16/fp16, vLLM's sampler log-probs when sampling is plain (no top-p/top-k/min-p/repetition penalty);
        otherwise the plain rows are scored too. `"recompute"`: always score the plain rows next to the oracle rows
        (2B rows, the checking path). A teacher oracle always scores both (s_t is the teacher's).

    > Recursion

    evidence_clip (`float`, defaults to `3.0`): C in log λ_t = clip(o_t − s_t, −C, C).
    prior_strength (`float`, defaults to `1.0`): α of the Beta prior, ℓ_0 = log((k + α)/(G − k + α)).
    advantage_eps (`float`, defaults to `1e-6`): ε of the per-group token normalization.

    > Success (from [`~trl_credit.core.success.SuccessArguments`])

    success_reward (`str`, `int` or `None`, defaults to `None`): the reward function that decides whether a
        completion is correct (the verifier), by name or index in `reward_funcs`; `None` = the first one.
    success_threshold (`float`, defaults to `1.0`): a completion is correct when that function's raw reward is ≥
        this.

    k of the prior ℓ_0 = log((k + α)/(G − k + α)) is the number of *correct* completions of the group and G the
    number of its *scorable* completions (a completion every reward function returned `None` for is no trial). With
    `reward_funcs=[accuracy_reward, format_reward]` a wrong but well-formatted answer is not correct, so it does not
    raise k. Everything else keeps TRL's weighted sum of all reward functions: the sign anchor sign(A^seq) is the sign
    of TRL's advantage (under either `multi_objective_aggregation`), taken from the rewards so that a row tying its
    group's mean gets 0; a row whose verifier returned `None` counts as verifier reward 0 (not correct) there.
    Unscorable completions get advantage 0 on every token and are left out of the group's token statistics. With
    `off_policy_mask_threshold` or `loss_type="vespo"`, TRL's per-sequence decisions (drop a negative sequence; pick the
    gamma weighting) use the sign of A^seq.

    > Ablations (paper Table 2)

    direction_anchoring, state_tracking, evidence_clipping, use_prior (`bool`, default `True`), log_lambda_only
        (`bool`, default `False`).

    Every GRPOConfig field keeps GRPOConfig's default (`loss_type="dapo"` included): switching the config class
    changes nothing else, and OPPO works with every TRL `loss_type`. The paper's objective (Eq. 22) averages each
    completion's tokens (1/T_i) and then the G completions, which is TRL's `"grpo"` aggregation:
    `examples/recipes/oppo.yaml` sets it, with the paper's other training settings (Table 13).
    """

    def __post_init__(self):
        self._validate_success_arguments()
        adopt_activation_checkpointing(self)  # TRL's default under transformers' new name: no FutureWarning
        super().__post_init__()
        self._check_oppo_after_grpo()
