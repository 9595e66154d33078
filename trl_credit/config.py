"""CreditConfig: one config for a composed method (issue 22), the union of the four methods' fields.

A method is one rollout, one credit and zero or more modifiers (docs/design.md#the-credit-core). ``rollout``,
``credit`` and ``modifiers`` select them; every part's fields are present (same names, defaults and help as in the
method configs), and only the selected parts' fields may leave their defaults, so a setting can never be silently
ignored. Usable from Python, from the command line (``--rollout resets --credit oppo --modifiers cue``) and from a
YAML recipe (``modifiers: [cue]``).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields

from trl import GRPOConfig

from trl_credit.cue_grpo.config import CueGRPOFields
from trl_credit.datpo.config import DATPOFields
from trl_credit.oppo.config import OPPOFields
from trl_credit.process.config import ProcessFields
from trl_credit.srpo.config import SRPOFields
from trl_credit.success import SuccessArguments
from trl_credit.trl_compat import adopt_activation_checkpointing
from trl_credit.viz import CreditLoggingArguments

__all__ = ["CreditConfig", "ROLLOUTS", "CREDITS", "MODIFIERS"]

ROLLOUTS = {
    "groups": "GRPO's iid groups",
    "resets": "SRPO/RRPO's reset-and-resample groups",
    "trees": "DATPO's difficulty-adaptive trees",
}
CREDITS = {
    "outcome": "GRPO's group-normalized outcome",
    "oppo": "OPPO's token value recursion",
    "blocks": "DATPO's block Monte Carlo advantages",
    "process": "process supervision: per-step rewards as token advantages (DeepSeekMath)",
}
MODIFIERS = {"cue": "Cue-GRPO's rarity weights"}

# The selection that turns each part's fields on: (fields mixin, selecting argument, its value).
PART_FIELDS = (
    (CueGRPOFields, "modifiers", "cue"),
    (OPPOFields, "credit", "oppo"),
    (ProcessFields, "credit", "process"),
    (DATPOFields, "rollout", "trees"),
    (SRPOFields, "rollout", "resets"),
)


def _accepted(names: dict[str, str]) -> str:
    return ", ".join(f"{name!r} ({meaning})" for name, meaning in names.items())


def _default(f):
    return f.default_factory() if f.default_factory is not MISSING else f.default


# Mixins before GRPOConfig: dataclass fields follow the reversed MRO, so GRPOConfig's fields keep their positions
# (`CreditConfig("my_run")` is the output dir); the shared mixins' fields, the parts' fields (SRPO, DATPO, OPPO,
# Cue-GRPO, process) and the selection come after them.
@dataclass
class CreditConfig(ProcessFields, CueGRPOFields, OPPOFields, DATPOFields, SRPOFields, CreditLoggingArguments,
                   SuccessArguments, GRPOConfig):
    r"""GRPOConfig plus the fields of every part, and the choice of parts: ``rollout``, ``credit``, ``modifiers``.

    Parts and the fields they own (see the method configs for each field's meaning):

    - ``rollout="groups"`` (default): GRPO's iid groups. ``"resets"``: SRPO/RRPO (fields of
      :class:`~trl_credit.srpo.SRPOConfig`: ``reset``, ``reset_groups``, ...). ``"trees"``: DATPO (fields of
      :class:`~trl_credit.datpo.DATPOConfig`: ``max_forks``, ...); needs ``credit="blocks"``.
    - ``credit="outcome"`` (default): GRPO's group-normalized outcome. ``"oppo"``: OPPO's value recursion (fields of
      :class:`~trl_credit.oppo.OPPOConfig`: ``oracle``, ``evidence_clip``, ...). ``"blocks"``: DATPO's block Monte
      Carlo advantages; needs ``rollout="trees"``. ``"process"``: process supervision (DeepSeekMath; fields
      ``process_step_reward``, ``process_thought_delimiter``, ``process_outcome``; docs/process.md).
    - ``modifiers`` (default none): ``"cue"``, Cue-GRPO's rarity weights (the ``cue_*`` fields of
      :class:`~trl_credit.cue_grpo.CueGRPOConfig`). Each at most once.

    Validation runs the selected parts' checks, each before or after GRPOConfig's ``__post_init__`` as its method
    config does, and refuses a field of a part that is not selected when it is set to anything but its default.
    Every GRPOConfig field keeps GRPOConfig's default; the success fields (``success_reward``,
    ``success_threshold``) and ``log_credit_rows`` are shared by every part.
    """

    rollout: str = field(
        default="groups",
        metadata={"help": f"How rows are sampled: {_accepted(ROLLOUTS)}.", "choices": list(ROLLOUTS)},
    )
    credit: str = field(
        default="outcome",
        metadata={"help": f"How advantages are assigned: {_accepted(CREDITS)}.", "choices": list(CREDITS)},
    )
    modifiers: list[str] = field(
        default_factory=list,
        metadata={"help": f"Advantage modifiers applied after the credit, in order, each at most once: "
                          f"{_accepted(MODIFIERS)}. Command line: `--modifiers cue`; YAML: `modifiers: [cue]`.",
                  "choices": list(MODIFIERS)},
    )

    def __post_init__(self):
        self._validate_success_arguments()
        adopt_activation_checkpointing(self)  # TRL's default under transformers' new name: no FutureWarning
        self._check_selection()
        if self.rollout == "resets":
            self._check_srpo_fields()
        if self.credit == "process":
            self._check_process_fields()
        super().__post_init__()
        if self.rollout == "resets":
            self._check_srpo_after_grpo()
        if self.rollout == "trees":
            self._check_datpo_after_grpo()
        if self.credit == "oppo":
            self._check_oppo_after_grpo()
        if "cue" in self.modifiers:
            self._check_cue_grpo_after_grpo()
            if self.rollout != "trees" and self.cue_tree_credit != "rows":
                raise ValueError(
                    f"cue_tree_credit={self.cue_tree_credit!r} applies only to DATPO's trees, but "
                    f"rollout={self.rollout!r}: set rollout='trees' or leave cue_tree_credit at 'rows'."
                )

    def _check_selection(self) -> None:
        if self.rollout not in ROLLOUTS:
            raise ValueError(f"rollout={self.rollout!r}; accepted: {_accepted(ROLLOUTS)}.")
        if self.credit not in CREDITS:
            raise ValueError(f"credit={self.credit!r}; accepted: {_accepted(CREDITS)}.")
        if self.modifiers is None:  # YAML `modifiers:` with no value
            self.modifiers = []
        # A bare string would be read letter by letter; YAML `modifiers: cue` arrives as one.
        if isinstance(self.modifiers, str) or not isinstance(self.modifiers, (list, tuple)):
            raise ValueError(
                f"modifiers={self.modifiers!r}; accepted: a list of names from {_accepted(MODIFIERS)}, e.g. "
                "modifiers=['cue'] (command line: --modifiers cue; YAML: modifiers: [cue])."
            )
        self.modifiers = list(self.modifiers)
        for name in self.modifiers:
            if name not in MODIFIERS:
                raise ValueError(f"modifiers={self.modifiers!r}: unknown {name!r}; accepted: {_accepted(MODIFIERS)}.")
        repeated = sorted({name for name in self.modifiers if self.modifiers.count(name) > 1})
        if repeated:
            raise ValueError(f"modifiers={self.modifiers!r} repeats {repeated}; each modifier applies at most once.")
        # DATPO's block advantages are defined on its trees' blocks, and its trees carry no other credit yet.
        if (self.rollout == "trees") != (self.credit == "blocks"):
            raise ValueError(
                f"rollout={self.rollout!r} with credit={self.credit!r}: rollout='trees' needs credit='blocks' and "
                "credit='blocks' needs rollout='trees' (DATPO's block advantages live on its trees)."
            )
        for mixin, argument, value in PART_FIELDS:
            if argument == "modifiers":
                if value in self.modifiers:
                    continue
                part, why, select = (f"{value!r} modifier", f"which is not in modifiers={self.modifiers!r}",
                                     f"add {value!r} to modifiers")
            else:
                if getattr(self, argument) == value:
                    continue
                part, why, select = (f"{value!r} {argument}", f"but {argument}={getattr(self, argument)!r}",
                                     f"set {argument}={value!r}")
            for f in fields(mixin):
                if getattr(self, f.name) != _default(f):
                    raise ValueError(
                        f"{f.name} is a field of the {part}, {why}: {select} or leave {f.name} at its default "
                        f"({_default(f)!r})."
                    )
