"""DATPOConfig: GRPOConfig plus the DATPO tree, forking, value and diversity settings (SPEC §3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from trl import GRPOConfig

from trl_credit.success import SuccessArguments

from .diversity import ALPHA_SCHEDULES
from .forks import FORK_METHODS
from .tree import VALUE_ESTIMATES

__all__ = ["DATPOConfig"]


@dataclass
class DATPOConfig(GRPOConfig, SuccessArguments):
    r"""
    Configuration for [`DATPOTrainer`]: difficulty-adaptive tree rollouts with sentence-entropy forking, block-level
    advantages and an annealed sibling-diversity bonus (Yu et al., 2026). Defaults are the paper's
    ((N, K_max, B_max) = (4, 3, 4), α: 0.2 → 0, token-level loss, clip 0.2, no KL). Every [`~trl.GRPOConfig`]
    field keeps its meaning; `num_generations` is the number N of base rollouts per prompt.

    Rewards are TRL's weighted sum of the reward functions, used raw (DATPO does not normalize them): V_root and
    the block values assume rewards in [0, 1] (the paper's 0/1 verifiable reward), so `scale_rewards` is unused.

    Branches continue from prompt + base prefix with up to `max_completion_length` new tokens (as the authors'
    code), so a branch row can reach prompt + 2·`max_completion_length` - 1 tokens; with vLLM, make
    `vllm_max_model_length` (or the server's context) at least that. Token entropies for forking come from one
    extra no-grad forward pass over the base rollouts. Evaluation (`eval_strategy`) runs plain GRPO scoring on
    base rollouts; the tree is a training-time construct.

    Loss normalization: with `loss_type="dapo"` (default, the paper's Eq. 9) the loss is the mean over every loss
    token of the generation batch on all processes, exactly, whatever the row counts. Loss types that average per
    sequence (`grpo`, `sapo`, `luspo`, `dr_grpo`) average within each micro-batch as in TRL, where micro-batches
    now differ in size and may contain empty filler rows (rows are evened out across processes because TRL gathers
    per-row metrics); prefer `dapo` or `bnpo`.
    """

    num_generations: int | None = field(
        default=4,
        metadata={"help": "N, the number of base rollouts per prompt (phase 1). Paper: 4."},
    )
    loss_type: str = field(
        default="dapo",
        metadata={"help": "TRL loss aggregation. DATPO uses the token-level loss over all tokens of the batch (Eq. 9)."},
    )
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
    value_estimate: str = field(
        default="subtree",
        metadata={"help": f"V(node), one of {VALUE_ESTIMATES}. subtree (paper Eq. 7): mean reward of all leaves "
                          "under the node. own_branches (the authors' code, SPEC §3.4): "
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
        metadata={"help": "Default False (SPEC §3.5: blocks that start at the same fork are siblings; the root is "
                          "not a fork). True: also count the first blocks of the N base rollouts (all starting at "
                          "the root) as siblings, as the authors' code does."},
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
    branch_chunk_size: int | None = field(
        default=None,
        metadata={"help": "Branch rollouts per generation call and process (phase 2), to bound memory (paper: 384 "
                          "for 3B, 64 for 4B). None: all branches of the generation batch in one call."},
    )

    def __post_init__(self):
        self._validate_success_arguments()
        super().__post_init__()
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
        if self.embedding_batch_size < 1:
            raise ValueError(f"`embedding_batch_size` must be >= 1, got {self.embedding_batch_size!r}")
        if self.branch_chunk_size is not None and self.branch_chunk_size < 1:
            raise ValueError(f"`branch_chunk_size` must be None or >= 1, got {self.branch_chunk_size!r}")
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "DATPO uses the raw weighted sum of the reward functions as the leaf reward, so "
                "`multi_objective_aggregation` must be 'sum_then_normalize' (its normalization step is not used), "
                f"got {self.multi_objective_aggregation!r}"
            )
