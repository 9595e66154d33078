"""Configuration of CueGRPOTrainer: ``trl.GRPOConfig`` plus the Cue-GRPO fields (paper defaults; docs/cue_grpo.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from trl_credit.core.success import SuccessArguments
from trl_credit.core.viz import CreditLoggingArguments
from trl_credit.trl_bridge.compat import adopt_activation_checkpointing

from .weights import DEFAULT_ALPHA, WEIGHTING_MODES

__all__ = ["CueGRPOConfig", "CueGRPOFields", "PARTITION_SOURCES"]

PARTITION_SOURCES = ("cue", "random", "judge", "callable")
TREE_CREDIT_RULES = ("rows", "leaves")  # cue_tree_credit: where the weights act on DATPO's trees


@dataclass
class CueGRPOFields:
    """The Cue-GRPO fields and their checks, mixed into :class:`CueGRPOConfig` and
    :class:`~trl_credit.config.CreditConfig` (the ``cue`` modifier)."""

    cue_partition: str = field(
        default="cue",
        metadata={
            "help": "How the positive completions of a group are partitioned. 'cue': Strategy Cues (the paper's "
            "method); 'random': Random-Cluster ablation (as many random labels as cue clusters, seeded identically "
            "on every process); 'judge': an LLM judge groups by strategy (CR-JP / UARL, see cue_judge_model); "
            "'callable': the `partition_fn` passed to CueGRPOTrainer."
        },
    )
    cue_weighting: str = field(
        default="cr",
        metadata={
            "help": "Weighting rule: 'cr' (Credit Redistribution: |C|^-alpha, unit mean, clip, singleton reset, "
            "shift floor), 'uarl' (|C|^-alpha, unit mean, no clip/floor), 'mu_matched' (cr without floor, "
            "renormalized to unit mean), 'uniform_boost' (every positive advantage x tau), or any mode registered "
            "with trl_credit.cue_grpo.register_weighting."
        },
    )
    cue_alpha: float | None = field(
        default=None,
        metadata={"help": "Rarity exponent alpha in [0, 1]. None = the weighting's paper default: 0.8 for 'cr' and "
                  "'mu_matched', 0.5 for 'uarl' (unused by 'uniform_boost')."},
    )
    cue_epsilon: float = field(
        default=0.5, metadata={"help": "Cosine-similarity threshold epsilon in [0, 1] of the bag-of-cues graph."}
    )
    cue_rho: float = field(
        default=0.75,
        metadata={"help": "Group suppression threshold rho in [0, 1]: a cue present in more than rho*|P| positive "
                  "completions of a group is dropped from all of them."},
    )
    cue_tau: float = field(
        default=1.05,
        metadata={"help": "Minimum positive multiplier tau > 0 of the shift floor ('cr'); the boost of "
                  "'uniform_boost'."},
    )
    cue_gamma_min: float = field(
        default=0.3, metadata={"help": "Lower clip gamma_min of the normalized weights ('cr', 'mu_matched'), in [0, 1]."}
    )
    cue_gamma_max: float = field(
        default=3.0, metadata={"help": "Upper clip gamma_max of the normalized weights ('cr', 'mu_matched'), >= 1."}
    )
    cue_singleton_reset: bool = field(
        default=True,
        metadata={"help": "Reset artifact singleton clusters (anomalously short/long cue skeletons) to weight 1 "
                  "(paper Appendix B). Applies to the 'cue' and 'random' partitions, which have cue skeletons."},
    )
    cue_judge_model: str | None = field(
        default=None,
        metadata={
            "help": "Judge for cue_partition='judge': a causal LM name or path (loaded with transformers on the "
            "training device and run with HF generate, not vLLM), or 'policy' to ask the policy itself through "
            "TRL's generation path (vLLM when use_vllm). A model instance can be passed as CueGRPOTrainer(judge_model=...)."
        },
    )
    cue_judge_completions: str = field(
        default="all",
        metadata={"help": "Which completions the judge sees: 'all' K of the group (paper Appendix B) or only the "
                  "'positive' ones. Clusters are always those of the positive completions."},
    )
    cue_judge_max_new_tokens: int = field(
        default=512, metadata={"help": "Maximum tokens of the judge's answer (greedy decoding; paper: 512)."}
    )
    cue_judge_head_chars: int = field(
        default=200, metadata={"help": "Characters kept from the start of each solution shown to the judge."}
    )
    cue_judge_tail_chars: int = field(
        default=500, metadata={"help": "Characters kept from the end of each solution shown to the judge."}
    )
    cue_judge_batch_size: int = field(
        default=4, metadata={"help": "Judge prompts per HF generate call (separate judge model only)."}
    )
    cue_judge_dtype: str = field(
        default="auto", metadata={"help": "torch dtype for loading a separate judge model by name ('auto', "
                                          "'bfloat16', 'float16', 'float32')."}
    )
    cue_tree_credit: str = field(
        default="rows",
        metadata={
            "help": "Only with DATPO's trees (CreditConfig rollout='trees', credit='blocks', modifiers=['cue']): "
            "where the rarity weight w of a leaf of P acts. 'rows' (Cue-GRPO's rule): DATPO's block advantages are "
            "computed from the leaf rewards as they are, then the positive advantages of the blocks the leaf's row "
            "trains are multiplied by w; every other advantage is DATPO's. 'leaves': the leaf outcome becomes "
            "m + w (r - m) before the block Monte Carlo aggregation, so the values of blocks shared with other "
            "leaves move too (incorrect leaves' advantages included); a path's advantages still sum to its "
            "re-weighted outcome advantage. See docs/composition.md."
        },
    )

    def _check_cue_grpo_after_grpo(self) -> None:
        """Validate the Cue-GRPO fields (run after GRPOConfig's ``__post_init__``)."""
        # multi_objective_aggregation: both are accepted. Correctness comes from the verifier; under
        # "normalize_then_sum" TRL's advantage is a sum of per-group z-scores (zero mean within each group) over the
        # batch std, so A_i > 0 still means "above its own group", the role it plays in P.
        if self.cue_partition not in PARTITION_SOURCES:
            raise ValueError(f"cue_partition={self.cue_partition!r}; accepted: {list(PARTITION_SOURCES)}")
        if self.cue_weighting not in WEIGHTING_MODES:
            raise ValueError(f"cue_weighting={self.cue_weighting!r}; accepted: {sorted(WEIGHTING_MODES)}")
        if self.cue_alpha is not None and not 0.0 <= self.cue_alpha <= 1.0:
            raise ValueError(f"cue_alpha={self.cue_alpha}; accepted: a number in [0, 1] or None (mode default)")
        for name in ("cue_epsilon", "cue_rho"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value}; accepted: a number in [0, 1]")
        if not self.cue_tau > 0:
            raise ValueError(f"cue_tau={self.cue_tau}; accepted: a number > 0")
        if not 0.0 <= self.cue_gamma_min <= 1.0 <= self.cue_gamma_max:
            raise ValueError(
                f"cue_gamma_min={self.cue_gamma_min}, cue_gamma_max={self.cue_gamma_max}; accepted: "
                "0 <= cue_gamma_min <= 1 <= cue_gamma_max (unit weight must lie inside the clip range)"
            )
        if self.cue_judge_completions not in ("all", "positive"):
            raise ValueError(f"cue_judge_completions={self.cue_judge_completions!r}; accepted: 'all', 'positive'")
        for name in ("cue_judge_max_new_tokens", "cue_judge_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}; accepted: an integer >= 1")
        for name in ("cue_judge_head_chars", "cue_judge_tail_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)}; accepted: an integer >= 0")
        if self.cue_tree_credit not in TREE_CREDIT_RULES:
            raise ValueError(f"cue_tree_credit={self.cue_tree_credit!r}; accepted: {list(TREE_CREDIT_RULES)}")
        if self.cue_judge_dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(
                f"cue_judge_dtype={self.cue_judge_dtype!r}; accepted: 'auto', 'bfloat16', 'float16', 'float32'"
            )

    def _check_cue_grpo_composed(self) -> None:
        """The Cue-GRPO checks in a composed config (``CreditConfig``, run after GRPOConfig's ``__post_init__``):
        the fields', and ``cue_tree_credit`` only with DATPO's trees (the rollout is a choice of the composition)."""
        self._check_cue_grpo_after_grpo()
        if self.rollout != "trees" and self.cue_tree_credit != "rows":
            raise ValueError(
                f"cue_tree_credit={self.cue_tree_credit!r} applies only to DATPO's trees, but "
                f"rollout={self.rollout!r}: set rollout='trees' or leave cue_tree_credit at 'rows'."
            )

    @property
    def cue_resolved_alpha(self) -> float:
        """cue_alpha, or the weighting's paper default when None (0 for modes that ignore alpha)."""
        if self.cue_alpha is not None:
            return self.cue_alpha
        default = DEFAULT_ALPHA[self.cue_weighting]
        return 0.0 if default is None else default


# Mixins before GRPOConfig: dataclass fields follow the reversed MRO, so GRPOConfig's fields keep their positions
# (`CueGRPOConfig("my_run")` is the output dir) and the mixins' and the method's fields come after them.
@dataclass
class CueGRPOConfig(CueGRPOFields, CreditLoggingArguments, SuccessArguments, GRPOConfig):
    r"""GRPOConfig + Cue-GRPO's rarity-aware credit redistribution (paper: "When Correct Solutions Repeat").

    Fields are prefixed ``cue_`` (GRPOConfig already has ``epsilon`` and ``delta``). Defaults are the paper's single
    configuration: α = 0.8, ε = 0.5, τ = 1.05, ρ = 0.75, [γmin, γmax] = [0.3, 3.0]. Every GRPOConfig field keeps
    GRPOConfig's default; the paper's training recipe (K = 64, lr 5e-7, β = 0.001, LoRA r16/α32) is in
    ``examples/recipes/cue_grpo.yaml``.

    Success (fields of :class:`~trl_credit.core.success.SuccessArguments`): ``success_reward`` names the reward function
    that decides whether a completion is correct (the verifier; its name or index in ``reward_funcs``, None = the
    first one) and ``success_threshold`` (default 1.0) is the raw reward of that function a correct completion reaches
    (>=). The positive set whose strategies are clustered and reweighted is P = {i : correct_i and A_i > 0}, with A_i
    TRL's advantage (its weighted sum of all reward functions, under either ``multi_objective_aggregation``). With
    ``reward_funcs=[accuracy_reward, format_reward]`` a wrong but well-formatted answer can have A_i > 0; it stays
    out of P and keeps its GRPO advantage. Completions no reward function could score (all None), and completions
    whose loss TRL masks (``mask_truncated_completions``), are never in P nor counted in cluster sizes. The fraction
    of A_i > 0 completions left out of P is logged as ``cue/frac_positive_advantage_excluded``.

    How ``cue_alpha`` applies per weighting mode: ``cr`` / ``mu_matched`` rarity exponent (default 0.8); ``uarl``
    rarity exponent with UARL's default 0.5; ``uniform_boost`` ignores it. Leave it None for the mode's default.
    """

    def __post_init__(self):
        self._validate_success_arguments()
        adopt_activation_checkpointing(self)  # TRL's default under transformers' new name: no FutureWarning
        super().__post_init__()
        self._check_cue_grpo_after_grpo()
        if self.cue_tree_credit != "rows":  # a field CueGRPOTrainer would ignore: it grows no trees
            raise ValueError(
                f"cue_tree_credit={self.cue_tree_credit!r} applies only to DATPO's trees (CreditConfig with "
                "rollout='trees', credit='blocks', modifiers=['cue']); CueGRPOTrainer has none: leave it at 'rows'."
            )
