"""PRIME's fields (docs/process.md, "Implicit process rewards"), mixed into
:class:`~trl_credit.config.CreditConfig` (credit ``implicit_prm``). Defaults: the paper's equations (Cui et al. 2025)
with the hyper-parameters of its released recipe (verl ``recipe/prime/config/prime_trainer.yaml``: ``beta_train:
0.05``, PRM ``lr: 1e-6``, ``update: before``, ``prime_norm: batch_norm``, PRM ``optim.grad_clip: 10.0``, advantages
whitened). The PRM's clip of 10.0 is the recipe file's (verl commit 7406178) and its run script's
(``recipe/prime/run_prime_qwen.sh``: ``reward_model.model.optim.grad_clip=10.0``, as the authors' released run
script); an early version of the recipe file had 1.0, verl's generic default, which the run script overrides."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["PrimeFields", "UPDATE_ORDERS", "PROCESS_NORMS"]

#: When the implicit PRM learns from a batch, relative to scoring it.
UPDATE_ORDERS = {
    "before": "update on the batch, then score it with the updated PRM (verl's default 'before' and the paper's "
              "prose; a second PRM forward)",
    "after": "score the batch, then update on it (Algorithm 1 as printed, verl's 'after'): the rewards come from the "
             "PRM of the previous batches, computed by the update's own forward (one PRM forward)",
}
#: How the token rewards are scaled before the advantage.
PROCESS_NORMS = {
    "batch_max": "divided by the batch's largest |return| (verl's prime_norm='batch_norm', the recipe's default)",
    "none": "beta * log-ratio as it is (the paper's equation)",
}


def _finite_positive(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@dataclass
class PrimeFields:
    """The implicit PRM credit's fields and their checks (credit ``implicit_prm``)."""

    prime_beta: float = field(
        default=0.05,
        metadata={"help": "beta of the implicit rewards r = beta * log pi_phi / pi_ref, in the PRM's cross-entropy and "
                          "in the token rewards (the released recipe: 0.05)."},
    )
    prime_learning_rate: float = field(
        default=1e-6,
        metadata={"help": "Learning rate of the implicit PRM's AdamW (its own optimizer, no weight decay, gradients "
                          "clipped at norm prime_grad_clip; the released recipe: 1e-6). With LoRA the PRM is an "
                          "adapter: raise it as you raise the policy's."},
    )
    prime_grad_clip: float = field(
        default=10.0,
        metadata={"help": "Largest norm of the implicit PRM's gradient (all processes' gradients summed) before its "
                          "AdamW step (the released recipe: 10.0, verl recipe/prime's optim.grad_clip and its run "
                          "script)."},
    )
    prime_update: str = field(
        default="before",
        metadata={"help": "When the PRM learns from a generation batch: 'before' (update on the batch's outcome "
                          "labels, then score it: verl's default and the paper's prose, two PRM forwards) or 'after' "
                          "(score with the PRM of the previous batches, then update: Algorithm 1 as printed, the "
                          "update's forward scores, one PRM forward)."},
    )
    prime_updates_per_batch: int = field(
        default=1,
        metadata={"help": "PRM optimizer steps per generation batch, each over the whole batch (the paper: one PRM "
                          "update per policy batch; 0 freezes the PRM at the policy's initial weights, whose rewards "
                          "are then 0)."},
    )
    prime_process_coef: float = field(
        default=1.0,
        metadata={"help": "Weight of the implicit process rewards' RLOO returns in the advantage (the paper sums the "
                          "two terms; verl's recipe weighs both by 5)."},
    )
    prime_outcome_coef: float = field(
        default=1.0,
        metadata={"help": "Weight of the outcome rewards' RLOO advantage (TRL's weighted total reward, leave-one-out "
                          "baseline over the group)."},
    )
    prime_gamma: float = field(
        default=1.0,
        metadata={"help": "Discount of the process returns sum_{s>=t} gamma^(s-t) (r_s - baseline) (the paper: 1)."},
    )
    prime_process_norm: str = field(
        default="batch_max",
        metadata={"help": "Scaling of the token rewards: 'batch_max' (divided by the batch's largest |return|, the "
                          "released recipe's default) or 'none' (the paper's equation)."},
    )
    prime_whiten: bool = field(
        default=True,
        metadata={"help": "Whiten the advantages over the batch's trained tokens (mean 0, std 1), as the released "
                          "recipe does before the PPO loss; False keeps the paper's equation unscaled."},
    )

    prime_prompt_filter: bool = field(
        default=True,
        metadata={"help": "The paper's prompt filter (Algorithm 1): a training group trains (policy and PRM) only when "
                          "its accuracy is strictly between prime_filter_accuracy_lower and "
                          "prime_filter_accuracy_upper (and, with prime_filter_truncated, it holds no truncated "
                          "row); a dropped group's rows get advantage 0 and no PRM label. TRL's batch is not "
                          "refilled with other prompts (the released code samples 4x the prompts)."},
    )
    prime_filter_accuracy_lower: float = field(
        default=0.2,
        metadata={"help": "The prompt filter's lower bound: a group whose share of rows the verifier accepts is at or "
                          "below it is dropped (the paper: 0.2)."},
    )
    prime_filter_accuracy_upper: float = field(
        default=0.8,
        metadata={"help": "The prompt filter's upper bound: a group whose accuracy is at or above it is dropped (the "
                          "paper: 0.8)."},
    )
    prime_filter_truncated: bool = field(
        default=True,
        metadata={"help": "With prime_prompt_filter, also drop a group holding a truncated row (no EOS within "
                          "max_completion_length), as both released codes do (verl recipe/prime: filter_truncate)."},
    )

    def _check_prime_fields(self) -> None:
        """Validate the PRIME fields (run before GRPOConfig's ``__post_init__``)."""
        for name in ("prime_beta", "prime_learning_rate", "prime_grad_clip"):
            if not _finite_positive(getattr(self, name)):
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}.")
        for name in ("prime_process_coef", "prime_outcome_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}.")
        if self.prime_process_coef == 0 and self.prime_outcome_coef == 0:
            raise ValueError("prime_process_coef and prime_outcome_coef are both 0: the advantages would all be 0.")
        gamma = self.prime_gamma
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 <= gamma <= 1:
            raise ValueError(f"prime_gamma must be a number in [0, 1], got {gamma!r}.")
        steps = self.prime_updates_per_batch
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise ValueError(f"prime_updates_per_batch must be an integer >= 0, got {steps!r}.")
        for name, accepted in (("prime_update", UPDATE_ORDERS), ("prime_process_norm", PROCESS_NORMS)):
            if getattr(self, name) not in accepted:
                listed = ", ".join(f"{key!r} ({meaning})" for key, meaning in accepted.items())
                raise ValueError(f"{name} must be one of {listed}; got {getattr(self, name)!r}.")
        for name in ("prime_whiten", "prime_prompt_filter", "prime_filter_truncated"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}.")
        lower, upper = self.prime_filter_accuracy_lower, self.prime_filter_accuracy_upper
        for name, value in (("prime_filter_accuracy_lower", lower), ("prime_filter_accuracy_upper", upper)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}.")
        if not lower < upper:
            raise ValueError(f"prime_filter_accuracy_lower ({lower!r}) must be below prime_filter_accuracy_upper "
                             f"({upper!r}): the filter keeps accuracies strictly between them.")
