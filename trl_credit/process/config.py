"""The process credit's fields (docs/process.md), mixed into :class:`~trl_credit.config.CreditConfig` (credit
``process``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl_credit.core.steps import STEP_UNITS
from trl_credit.process.step_rewards import STEP_REWARDS

__all__ = ["ProcessFields", "OUTCOME_MODES"]

#: How the reward functions' outcome enters the process credit.
OUTCOME_MODES = {
    "none": "the paper's process supervision: advantages from the step rewards only",
    "final_step": "TRL's weighted total reward of the completion joins the step rewards as one more step ending at "
                  "its last token",
}


@dataclass
class ProcessFields:
    """The process credit's fields and their checks (credit ``process``)."""

    process_step_reward: str | None = field(
        default=None,
        metadata={
            "help": "The step-reward function, a registered name (built-in: 'chain', the chain task's step checker, "
            "'sums', the tiny testbed's: 1 up to the first wrong step, 0 from it on, and 'environment', the turn "
            "rewards an environment_factory's environment keeps in turn_rewards). (prompt, completion, "
            "steps, **row) -> one float or None "
            "per step. A callable goes to ProcessCredit(step_reward=...), or register it "
            "(trl_credit.process.register_step_reward) and name it here."
        },
    )
    process_thought_delimiter: str = field(
        default="\n",
        metadata={
            "help": "Text ending a step (SRPO's thought splitting on the sampled tokens). A completion without it is "
            "one step. With rollout='resets', set it to thought_delimiter so a reset point is a step boundary."
        },
    )
    process_steps: str = field(
        default="auto",
        metadata={
            "help": "What a step is: 'auto' (each model turn under TRL's tool loop (tools, environment_factory) or in a "
            "completion holding environment tokens (a rollout_func's env_mask); thoughts ended by "
            "process_thought_delimiter otherwise), 'turns' (each model turn; a "
            "single-turn completion is one step) or 'thoughts' (thoughts, split inside each model turn). Tool results "
            "are in no step (docs/multiturn.md#process-credit)."
        },
    )
    process_outcome: str = field(
        default="none",
        metadata={
            "help": "How the reward functions' outcome enters: 'none' (the paper: step rewards only; the reward "
            "functions decide unscorable rows and the verifier's success) or 'final_step' (TRL's weighted total "
            "reward joins the step rewards as a last step ending at the completion's last token)."
        },
    )

    def _check_process_fields(self) -> None:
        """Validate the process fields (run before GRPOConfig's ``__post_init__``)."""
        name = self.process_step_reward
        if name is not None and (not isinstance(name, str) or name not in STEP_REWARDS):
            raise ValueError(
                f"process_step_reward must be None or one of the registered step-reward functions "
                f"{sorted(STEP_REWARDS)} (a callable goes to ProcessCredit(step_reward=...), or register it with "
                f"trl_credit.process.register_step_reward), got {name!r}."
            )
        delimiter = self.process_thought_delimiter
        if not isinstance(delimiter, str) or not delimiter:
            raise ValueError(f"process_thought_delimiter must be a non-empty string, got {delimiter!r}.")
        # A literal "\n" from the command line or a YAML recipe means a newline.
        self.process_thought_delimiter = delimiter.replace("\\n", "\n")
        if self.process_steps not in STEP_UNITS:
            accepted = ", ".join(f"{unit!r} ({meaning})" for unit, meaning in STEP_UNITS.items())
            raise ValueError(f"process_steps must be one of {accepted}; got {self.process_steps!r}.")
        if self.process_outcome not in OUTCOME_MODES:
            accepted = ", ".join(f"{mode!r} ({meaning})" for mode, meaning in OUTCOME_MODES.items())
            raise ValueError(f"process_outcome must be one of {accepted}; got {self.process_outcome!r}.")
