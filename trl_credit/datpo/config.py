"""DATPOConfig: GRPOConfig plus the DATPO tree, forking, value and diversity settings (docs/datpo.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from trl import GRPOConfig

from trl_credit.core.success import SuccessArguments
from trl_credit.core.viz import CreditLoggingArguments
from trl_credit.trl_bridge.compat import adopt_activation_checkpointing

from .diversity import ALPHA_SCHEDULES
from .forks import FORK_METHODS, FORK_POSITIONS
from .tree import VALUE_ESTIMATES

__all__ = ["DATPOConfig", "DATPOFields", "FORK_FALLBACKS", "BRANCH_BUDGETS", "DIVERSITY_EMBEDDINGS"]

FORK_FALLBACKS = ("tok_entropy", "none")
DIVERSITY_EMBEDDINGS = ("all", "gated")
BRANCH_BUDGETS = ("remaining", "full")


@dataclass
class DATPOFields:
    """The DATPO fields and their checks, mixed into :class:`DATPOConfig` and
    :class:`~trl_credit.config.CreditConfig` (rollout ``trees``)."""

    max_forks: int = field(
        default=3,
        metadata={"help": "K_max: forks per base rollout for a prompt no base rollout solved; "
                          "K̂ = ceil(K_max·(1 − V_root)) (Eq. 1). Paper: 3."},
    )
    max_branches: int = field(
        default=4,
        metadata={"help": "B_max: branches per fork for a prompt no base rollout solved; "
                          "B̂ = ceil(B_max·(1 − V_root)) (Eq. 2). Paper: 4."},
    )
    difficulty_adaptive: bool = field(
        default=True,
        metadata={"help": "Scale K̂, B̂ with the prompt's difficulty (Eq. 1-2). False: every prompt gets "
                          "(max_forks, max_branches), even solved ones (the paper's non-adaptive ablation, App. F.5)."},
    )
    fork_method: str = field(
        default="sent_entropy",
        metadata={"help": f"Forking points: one of {FORK_METHODS}. sent_entropy (paper): starts of the top-K̂ "
                          "sentences by mean token entropy; tok_entropy: top-K̂ tokens; fixed_seg: ⌊k·|τ|/(K̂+1)⌋; "
                          "random: uniform (seeded by `seed`)."},
    )
    fork_min_gap: float = field(
        default=0.0,
        metadata={"help": "Distance-forced tok_entropy (App. D.5): minimum distance between forks as a fraction "
                          "of the rollout length (paper: 0.05, 0.1). 0 disables; only with fork_method='tok_entropy'."},
    )
    fork_position: str = field(
        default="after_token",
        metadata={"help": "Where branches start relative to the token an entropy-based fork_method selects (the "
                          "first token of a high-entropy sentence, or a high-entropy token). 'after_token' (default, "
                          "paper Alg. 1/3: the prefix [q; τ_{1:f}] keeps that token and the branches start at the "
                          "next one; every sentence, the first included, can be a fork). 'before_token' (this "
                          "package's behaviour before the option existed: the prefix stops before the token, so the "
                          "branches resample it; the first sentence cannot fork, see fork_fallback). fixed_seg and "
                          "random choose prefix lengths and are the same under both.",
                  "choices": list(FORK_POSITIONS)},
    )
    fork_fallback: str = field(
        default="tok_entropy",
        metadata={"help": "What a base rollout with no eligible sentence gets under fork_method='sent_entropy' and "
                          "fork_position='before_token' (a one-sentence answer: its only sentence starts at token 0, "
                          "and a fork before it would be a fresh rollout, not a branch). 'tok_entropy' (default): its "
                          "top-K̂ tokens by entropy, so short answers still grow trees. 'none': no fork (the prompt "
                          "then learns from its N base rollouts only). With fork_position='after_token' every "
                          "sentence is eligible (a one-sentence answer forks after its first token, as the paper's "
                          "Alg. 2), so no fallback is needed. datpo/no_fork_rate and datpo/fork_fallback_rate are "
                          "logged either way."},
    )
    value_estimate: str = field(
        default="subtree",
        metadata={"help": f"V(node), one of {VALUE_ESTIMATES}. subtree (paper Eq. 7): mean reward of all leaves "
                          "under the node. own_branches (the authors' code, docs/datpo.md#block-advantages): "
                          "the mean reward of the fork's own branches only; the root's value is the mean of the N "
                          "base rollouts."},
    )
    use_diversity: bool = field(
        default=True,
        metadata={"help": "Add the sibling-diversity bonus α_t·Div(b) (Eq. 4). False: no embedder is loaded."},
    )
    diversity_alpha: float = field(
        default=0.2,
        metadata={"help": "α at the first optimizer step. Paper: 0.2."},
    )
    diversity_alpha_final: float = field(
        default=0.0,
        metadata={"help": "α at the last optimizer step (linear schedule). Paper: 0 (ablation: -0.2)."},
    )
    diversity_alpha_schedule: str = field(
        default="linear",
        metadata={"help": f"One of {ALPHA_SCHEDULES}: linear from diversity_alpha to diversity_alpha_final over the "
                          "run's optimizer steps (paper), or constant diversity_alpha (ablation)."},
    )
    diversity_on_all_blocks: bool = field(
        default=False,
        metadata={"help": "Ablation: add the bonus to every block, not only blocks with A_base > 0."},
    )
    diversity_root_siblings: bool = field(
        default=False,
        metadata={"help": "Default False (docs/datpo.md#sibling-diversity: blocks that start at the same fork are siblings; the root is "
                          "not a fork). True: also count the first blocks of the N base rollouts (all starting at "
                          "the root) as siblings, as the authors' code does."},
    )
    diversity_embedding: str = field(
        default="all",
        metadata={"help": "Which sibling groups are embedded. 'all' (default): every group with two or more "
                          "blocks, so datpo/sibling_diversity covers them all. 'gated': only the groups where some "
                          "block gets the bonus (A_base > 0, Eq. 4; every group with diversity_on_all_blocks): the "
                          "same advantages and losses with fewer texts embedded, and datpo/sibling_diversity then "
                          "averages those groups only.",
                  "choices": list(DIVERSITY_EMBEDDINGS)},
    )
    embedding_model: str | None = field(
        default=None,
        metadata={"help": "sentence-transformers model for block embeddings (paper: "
                          "'Alibaba-NLP/gte-large-en-v1.5', which needs embedding_trust_remote_code=True). None: the "
                          "packaged offline all-MiniLM-L6-v2. A model instance can be passed to the trainer as "
                          "`embedder=`."},
    )
    embedding_trust_remote_code: bool = field(
        default=False,
        metadata={"help": "trust_remote_code when loading embedding_model (gte-large-en-v1.5 needs it)."},
    )
    embedding_batch_size: int = field(
        default=64,
        metadata={"help": "Block texts embedded per embedder call."},
    )
    embedding_cache_size: int = field(
        default=4096,
        metadata={"help": "Block texts whose embeddings are kept across steps (least recently used dropped first; "
                          "the embedder is frozen, so a text repeated in a later step is not embedded again). "
                          "0: no cache."},
    )
    rows_per_forward: int | None = field(
        default=None,
        metadata={"help": "Most training rows in one forward/backward pass. A DATPO micro-batch holds a variable "
                          "number of rows (base rollouts + branches); larger ones are split into passes of at most "
                          "this many rows, with the loss normalized so the result is unchanged. None: "
                          "per_device_train_batch_size (a GRPO micro-batch). Not applied under DeepSpeed."},
    )
    branch_budget: str = field(
        default="remaining",
        metadata={"help": "New tokens a branch may generate after its prefix. 'remaining' (default): "
                          "max_completion_length minus the prefix length, so a leaf (prefix + branch) respects "
                          "max_completion_length like every GRPO rollout. 'full': max_completion_length new tokens "
                          "per branch, as the authors' code does (a leaf can reach 2*max_completion_length - 1 "
                          "tokens and a branch costs as much as a rollout).",
                  "choices": list(BRANCH_BUDGETS)},
    )
    branch_chunk_size: int | None = field(
        default=None,
        metadata={"help": "Branch rollouts per generation call and process (phase 2), to bound memory (paper: 384 "
                          "for 3B, 64 for 4B). None: all branches of the generation batch in one call."},
    )

    def _check_datpo_after_grpo(self) -> None:
        """Validate the DATPO fields (run after GRPOConfig's ``__post_init__``)."""
        for name in ("max_forks", "max_branches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}")
        if self.fork_method not in FORK_METHODS:
            raise ValueError(f"`fork_method` must be one of {FORK_METHODS}, got {self.fork_method!r}")
        if not 0.0 <= float(self.fork_min_gap) < 1.0:
            raise ValueError(f"`fork_min_gap` must be in [0, 1) (a fraction of the rollout length), got {self.fork_min_gap!r}")
        if self.fork_min_gap > 0 and self.fork_method != "tok_entropy":
            raise ValueError(
                f"`fork_min_gap` (distance-forced forking) applies only to fork_method='tok_entropy', got "
                f"fork_method={self.fork_method!r}"
            )
        if self.value_estimate not in VALUE_ESTIMATES:
            raise ValueError(f"`value_estimate` must be one of {VALUE_ESTIMATES}, got {self.value_estimate!r}")
        if self.diversity_alpha_schedule not in ALPHA_SCHEDULES:
            raise ValueError(
                f"`diversity_alpha_schedule` must be one of {ALPHA_SCHEDULES}, got {self.diversity_alpha_schedule!r}"
            )
        if self.diversity_embedding not in DIVERSITY_EMBEDDINGS:
            raise ValueError(
                f"`diversity_embedding` must be one of {DIVERSITY_EMBEDDINGS}, got {self.diversity_embedding!r}"
            )
        if self.embedding_batch_size < 1:
            raise ValueError(f"`embedding_batch_size` must be >= 1, got {self.embedding_batch_size!r}")
        if isinstance(self.embedding_cache_size, bool) or not isinstance(self.embedding_cache_size, int) or (
            self.embedding_cache_size < 0
        ):
            raise ValueError(f"`embedding_cache_size` must be an integer >= 0, got {self.embedding_cache_size!r}")
        if self.fork_position not in FORK_POSITIONS:
            raise ValueError(f"`fork_position` must be one of {FORK_POSITIONS}, got {self.fork_position!r}")
        if self.fork_fallback not in FORK_FALLBACKS:
            raise ValueError(f"`fork_fallback` must be one of {FORK_FALLBACKS}, got {self.fork_fallback!r}")
        if self.rows_per_forward is not None and (
            isinstance(self.rows_per_forward, bool) or not isinstance(self.rows_per_forward, int) or self.rows_per_forward < 1
        ):
            raise ValueError(f"`rows_per_forward` must be None or an integer >= 1, got {self.rows_per_forward!r}")
        if self.branch_budget not in BRANCH_BUDGETS:
            raise ValueError(f"`branch_budget` must be one of {BRANCH_BUDGETS}, got {self.branch_budget!r}")
        if self.branch_chunk_size is not None and self.branch_chunk_size < 1:
            raise ValueError(f"`branch_chunk_size` must be None or >= 1, got {self.branch_chunk_size!r}")


# Mixins before GRPOConfig: dataclass fields follow the reversed MRO, so GRPOConfig's fields keep their positions
# (`DATPOConfig("my_run")` is the output dir) and the mixins' and the method's fields come after them.
@dataclass
class DATPOConfig(DATPOFields, CreditLoggingArguments, SuccessArguments, GRPOConfig):
    r"""
    Configuration for [`DATPOTrainer`]: difficulty-adaptive tree rollouts with sentence-entropy forking, block-level
    advantages and an annealed sibling-diversity bonus (Yu et al., 2026). The DATPO fields default to the paper's
    values ((K_max, B_max) = (3, 4), α: 0.2 → 0). Every [`~trl.GRPOConfig`] field keeps its meaning and GRPOConfig's
    default, so switching the config class changes nothing else; `num_generations` is the number N of base
    rollouts per prompt (GRPOConfig's default 8; the paper's N = 4 is set by `examples/recipes/datpo.yaml`, with
    its token-level loss `dapo` (GRPOConfig's default too), clip 0.2 and no KL).

    Rewards: correct/incorrect is what the verifier says. `success_reward` names the reward function that decides it
    (default: the first one, e.g. accuracy in `reward_funcs=[accuracy_reward, format_reward]`) and a rollout is
    correct when that function's raw reward is >= `success_threshold`. DATPO uses the verdict for the adaptive
    budget, V_root = the fraction of the prompt's scorable base rollouts that are correct (the mean of the paper's
    0/1 rewards, Eq. 1-2), and for `datpo/pass_rate`. Leaf values and block advantages (Eq. 3, 7) keep TRL's
    weighted total reward of all reward functions (raw with `multi_objective_aggregation="sum_then_normalize"`,
    standardized per function over each tree's leaves with `"normalize_then_sum"`), so a format reward still
    shapes learning but cannot make a wrong answer count as solved. A rollout every reward function scored `None`
    (unscorable) gets advantage 0 on every token, does not fork, and is left out of every value, V_root and rate.

    Branches continue from prompt + base prefix, which by default (`fork_position="after_token"`, paper Alg. 1/3)
    ends with the fork token: the first token of a high-entropy sentence. With `branch_budget="remaining"`
    (default) a branch gets `max_completion_length` minus its prefix's length in new tokens, so a leaf (prefix +
    branch) is a response that respects `max_completion_length` like every GRPO rollout; `"full"` gives every branch `max_completion_length`
    new tokens (the authors' code), so a leaf can reach 2·`max_completion_length` - 1 tokens (with vLLM, make
    `vllm_max_model_length` or the server's context at least prompt + that). Token entropies for forking are
    recorded while HF `generate` samples the base rollouts; with vLLM or continuous batching they come from one
    extra no-grad forward pass over the base rollouts (`datpo/entropy_from_sampler` says which ran). Evaluation
    (`eval_strategy`) runs plain GRPO scoring on base rollouts; the tree is a training-time construct.

    Loss normalization: micro-batches hold a variable number of rows (trees differ in size) and processes pad to
    equal row counts with empty filler rows, so every loss type is normalized against the whole generation batch on
    all processes: `dapo` (default, the paper's Eq. 9), `cispo`, `vespo` and `bnpo`: the mean over every loss token;
    `grpo`, `sapo`: the mean over every row of its token mean; `luspo`: the mean over rows of their token sums;
    `dr_grpo`: the token sum over rows × `max_completion_length`. Every row then weighs the same whatever the split,
    the number of processes or the fillers (2 processes give the 1-process loss), and for equal micro-batches this
    is TRL's value. Each micro-batch runs in forwards of at most `rows_per_forward` rows with the same total loss.
    The entropy bonus (`entropy_coef`) is refused (it would be rescaled with the loss).
    """

    def __post_init__(self):
        self._validate_success_arguments()
        adopt_activation_checkpointing(self)  # TRL's default under transformers' new name: no FutureWarning
        super().__post_init__()
        self._check_datpo_after_grpo()
