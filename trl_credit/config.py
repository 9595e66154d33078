"""The composition (docs/composition.md): CreditConfig, the union of the registered parts' fields (issue 22), and
the choice of one rollout, one credit and modifiers by name, with the refusals of parts that do not combine.

It sits above the method packages and no method package imports it: it imports the built-in parts modules once
(:data:`BUILT_IN`), whose ``@register_part`` fills the registry (:mod:`trl_credit.core.registry`), and reads everything
else from the registry: the names, the fields, their checks and what each part accepts. A method is one rollout, one
credit and zero or more modifiers (docs/design.md#the-credit-core). ``rollout``, ``credit`` and ``modifiers``
select them; every part's fields are present (same names, defaults and help as in the method configs), and only the
selected parts' fields may leave their defaults, so a setting can never be silently ignored. Usable from Python,
from the command line (``--rollout resets --credit oppo --modifiers cue``) and from a YAML recipe
(``modifiers: [cue]``).
"""

from __future__ import annotations

import importlib
from dataclasses import MISSING, dataclass, field, fields

from trl import GRPOConfig

from trl_credit.core.registry import KINDS, PartSpec, part_spec, registered_in_order, take_fields
from trl_credit.core.success import SuccessArguments
from trl_credit.core.viz import CreditLoggingArguments
from trl_credit.trl_bridge.compat import adopt_activation_checkpointing

__all__ = ["CreditConfig", "BUILT_IN", "DEFAULT_PARTS", "accepted_parts", "build_part", "refusal", "selected_parts"]

#: The modules that register the built-in parts, imported once here. Their order is the order of the parts' fields
#: in CreditConfig (a new method appends its fields, so no field moves) and of the names in help texts; parts
#: registered by other modules (imported before this one) follow, in registration order.
BUILT_IN = (
    "trl_credit.core.trainer",
    "trl_credit.srpo.parts",
    "trl_credit.datpo.parts",
    "trl_credit.oppo.parts",
    "trl_credit.cue_grpo.parts",
    "trl_credit.process.parts",
    "trl_credit.prime.parts",
)
for _module in BUILT_IN:
    importlib.import_module(_module)

#: The parts used when neither the config nor the trainer names one (GRPO's).
DEFAULT_PARTS = {"rollout": "groups", "credit": "outcome"}


def _ordered() -> list[PartSpec]:
    """Every registered part, the built-in modules' first in :data:`BUILT_IN`'s order (independent of which module
    happened to be imported first), then the others in registration order."""
    specs = registered_in_order()
    rank = {module: i for i, module in enumerate(BUILT_IN)}
    return sorted(specs, key=lambda spec: rank.get(spec.cls.__module__, len(BUILT_IN)))  # stable: ties keep order


def accepted_parts(kind: str) -> dict[str, str]:
    """Name -> one-line help of the registered parts of ``kind`` ("rollout", "credit" or "modifiers")."""
    return {spec.name: spec.help for spec in _ordered() if spec.kind == kind}


def _accepted(kind: str) -> str:
    return ", ".join(f"{name!r} ({meaning})" for name, meaning in accepted_parts(kind).items())


def _default(f):
    return f.default_factory() if f.default_factory is not MISSING else f.default


def refusal(rollout: str, credit: str, modifiers: list[str]) -> str | None:
    """Why the parts of these names cannot form one method, or None: a repeated modifier, or a part of one kind that
    a selected part does not accept (its registration's ``accepts``). docs/composition.md explains each rule. Names
    that are not registered (a part passed built) declare no rule."""
    seen = list(modifiers)
    if len(set(seen)) != len(seen):
        repeated = sorted({name for name in seen if seen.count(name) > 1})
        return f"modifiers={seen!r} repeats {repeated}; each modifier applies at most once."
    chosen = {"rollout": [rollout], "credit": [credit], "modifiers": seen}
    for kind in KINDS:
        for name in chosen[kind]:
            spec = part_spec(kind, name)
            for other, rule in (spec.accepts.items() if spec is not None else ()):
                if all(n in rule.names for n in chosen[other]):
                    continue
                if other == "modifiers":
                    shown, needs = repr(seen), f"takes no modifier but {list(rule.names)}"
                else:
                    names = repr(rule.names[0]) if len(rule.names) == 1 else f"one of {list(rule.names)}"
                    shown, needs = repr(chosen[other][0]), f"needs {other}={names}"
                return f"{kind}={name!r} with {other}={shown}: {kind}={name!r} {needs} ({rule.why})."
    return None


def build_part(kind: str, name: str):
    """The registered part ``name`` of ``kind`` ("rollout", "credit" or "modifiers"), with its default constructor."""
    spec = part_spec(kind, name)
    if spec is None:
        raise ValueError(f"{kind}={name!r}; accepted: {_accepted(kind)}.")
    return spec.cls()


def selected_parts(args, rollout, credit, modifiers) -> tuple:
    """The parts passed, else those the config selects by name (a ``CreditConfig``), else GRPO's. A part passed with a
    config that selects another is refused: the config's checks and field refusals follow its selection."""
    selection = {kind: getattr(args, kind, None) for kind in KINDS}
    chosen = {"rollout": rollout, "credit": credit, "modifiers": None if modifiers is None else list(modifiers)}
    for kind in ("rollout", "credit"):
        name = selection[kind]
        if chosen[kind] is None:
            chosen[kind] = build_part(kind, name if name is not None else DEFAULT_PARTS[kind])
        elif name is not None and chosen[kind].name != name:
            raise ValueError(f"{kind}={chosen[kind].name!r} (the part passed) but args.{kind}={name!r}: set "
                             f"args.{kind}={chosen[kind].name!r} so its fields are validated for it.")
    if chosen["modifiers"] is None:
        chosen["modifiers"] = [build_part("modifiers", name) for name in selection["modifiers"] or []]
    elif selection["modifiers"] is not None and [m.name for m in chosen["modifiers"]] != list(selection["modifiers"]):
        raise ValueError(f"modifiers={[m.name for m in chosen['modifiers']]} (the parts passed) but "
                         f"args.modifiers={list(selection['modifiers'])}: set args.modifiers to the same names.")
    return chosen["rollout"], chosen["credit"], chosen["modifiers"]


# Mixins before GRPOConfig: dataclass fields follow the reversed MRO, so GRPOConfig's fields keep their positions
# (`CreditConfig("my_run")` is the output dir); the shared mixins' fields, the parts' fields (in _ordered's order:
# SRPO, DATPO, OPPO, Cue-GRPO, process) and the selection come after them.
_PART_FIELDS = [spec.fields for spec in _ordered() if spec.fields is not None]
take_fields("trl_credit.config.CreditConfig")


@dataclass
class CreditConfig(*reversed(_PART_FIELDS), CreditLoggingArguments, SuccessArguments, GRPOConfig):
    r"""GRPOConfig plus the fields of every registered part, and the choice of parts: ``rollout``, ``credit``,
    ``modifiers``.

    The parts are the registered ones (:mod:`trl_credit.core.registry`; docs/composition.md's table lists the built-in
    ones and what they combine with): ``rollout="groups"`` and ``credit="outcome"`` (GRPO's) by default, no
    modifiers. Each part's fields are those of its registration's fields mixin (the method configs document them:
    :class:`~trl_credit.srpo.SRPOConfig` for the ``resets`` rollout, ...); ``--help`` lists every name with its
    one-line help. Each modifier at most once.

    Validation runs the selected parts' checks (their registrations' ``check`` before GRPOConfig's
    ``__post_init__``, ``check_after_grpo`` after it), in the order rollout, credit, modifiers, and refuses a field of
    a part that is not selected when it is set to anything but its default. Every GRPOConfig field keeps GRPOConfig's
    default; the success fields (``success_reward``, ``success_threshold``) and ``log_credit_rows`` are shared by
    every part.
    """

    rollout: str = field(
        default=DEFAULT_PARTS["rollout"],
        metadata={"help": f"How rows are sampled: {_accepted('rollout')}.", "choices": list(accepted_parts("rollout"))},
    )
    credit: str = field(
        default=DEFAULT_PARTS["credit"],
        metadata={"help": f"How advantages are assigned: {_accepted('credit')}.",
                  "choices": list(accepted_parts("credit"))},
    )
    modifiers: list[str] = field(
        default_factory=list,
        metadata={"help": f"Advantage modifiers applied after the credit, in order, each at most once: "
                          f"{_accepted('modifiers')}. Command line: `--modifiers cue`; YAML: `modifiers: [cue]`.",
                  "choices": list(accepted_parts("modifiers"))},
    )

    def __post_init__(self):
        self._validate_success_arguments()
        adopt_activation_checkpointing(self)  # TRL's default under transformers' new name: no FutureWarning
        self._check_selection()
        selected = [part_spec("rollout", self.rollout), part_spec("credit", self.credit),
                    *(part_spec("modifiers", name) for name in self.modifiers)]
        for spec in selected:
            spec.run_check(self, after_grpo=False)
        super().__post_init__()
        for spec in selected:
            spec.run_check(self, after_grpo=True)

    def _check_selection(self) -> None:
        for kind in ("rollout", "credit"):
            if part_spec(kind, getattr(self, kind)) is None:
                raise ValueError(f"{kind}={getattr(self, kind)!r}; accepted: {_accepted(kind)}.")
        if self.modifiers is None:  # YAML `modifiers:` with no value
            self.modifiers = []
        # A bare string would be read letter by letter; YAML `modifiers: cue` arrives as one.
        if isinstance(self.modifiers, str) or not isinstance(self.modifiers, (list, tuple)):
            raise ValueError(
                f"modifiers={self.modifiers!r}; accepted: a list of names from {_accepted('modifiers')}, e.g. "
                "modifiers=['cue'] (command line: --modifiers cue; YAML: modifiers: [cue])."
            )
        self.modifiers = list(self.modifiers)
        for name in self.modifiers:
            if part_spec("modifiers", name) is None:
                raise ValueError(f"modifiers={self.modifiers!r}: unknown {name!r}; accepted: "
                                 f"{_accepted('modifiers')}.")
        reason = refusal(self.rollout, self.credit, self.modifiers)
        if reason is not None:
            raise ValueError(reason)
        for spec in _ordered():
            if spec.fields is None:
                continue
            if spec.kind == "modifiers":
                if spec.name in self.modifiers:
                    continue
                part, why, select = (f"{spec.name!r} modifier", f"which is not in modifiers={self.modifiers!r}",
                                     f"add {spec.name!r} to modifiers")
            else:
                if getattr(self, spec.kind) == spec.name:
                    continue
                part, why, select = (f"{spec.name!r} {spec.kind}", f"but {spec.kind}={getattr(self, spec.kind)!r}",
                                     f"set {spec.kind}={spec.name!r}")
            for f in fields(spec.fields):
                if getattr(self, f.name) != _default(f):
                    raise ValueError(
                        f"{f.name} is a field of the {part}, {why}: {select} or leave {f.name} at its default "
                        f"({_default(f)!r})."
                    )
