"""The one registry of parts (docs/design.md#the-registry): every rollout, credit and modifier registers itself with
:func:`register_part` in its own module, declaring its config fields, their checks and which parts of the other
kinds it works with. The composition (:mod:`trl_credit.config`: the union config, building parts by name, the
refusals) reads this registry and nothing else, so a new method is its own folder plus one registration.

This module sits below every method package and imports none of them (nor TRL): a parts module imports it for the
decorator, and the composition imports the built-in parts modules once to fill it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

__all__ = ["KINDS", "PartSpec", "Only", "only", "register_part", "registered", "registered_in_order", "part_spec",
           "part_names", "take_fields"]

#: The kinds of parts, named as the config argument that selects them (``CreditConfig.rollout``, ...).
KINDS = ("rollout", "credit", "modifiers")


@dataclasses.dataclass(frozen=True)
class Only:
    """Of the parts of one kind, the only ones a part works with (``names``), and why (``why``, for the refusal)."""

    names: tuple[str, ...]
    why: str


def only(*names: str, why: str) -> Only:
    """``accepts={"credit": only("blocks", why="...")}``: every other part of that kind is refused, with ``why``."""
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ValueError(f"only(*names): give one or more part names, got {names!r}.")
    if not isinstance(why, str) or not why:
        raise ValueError(f"only(why=...): say why the other parts are refused, got {why!r}.")
    return Only(tuple(names), why)


@dataclasses.dataclass(frozen=True)
class PartSpec:
    """One registration: what :func:`register_part` was given."""

    kind: str
    name: str
    cls: type
    help: str
    """One line: what the part is (the config's help and error messages list it)."""
    fields: type | None = None
    """The dataclass mixin of the part's config fields (joined into ``CreditConfig``), or None."""
    check: str | Callable | None = None
    """Validates the part's fields before ``GRPOConfig.__post_init__``: the name of a method of ``fields`` (called on
    the config) or a function of the config."""
    check_after_grpo: str | Callable | None = None
    """Likewise, after ``GRPOConfig.__post_init__``."""
    accepts: Mapping[str, Only] = dataclasses.field(default_factory=dict)
    """Kind -> :class:`Only`: the parts of that kind this part works with; the others are refused."""

    def run_check(self, config, after_grpo: bool) -> None:
        """Run this part's ``check`` (or ``check_after_grpo``) on ``config``, if it has one."""
        check = self.check_after_grpo if after_grpo else self.check
        if isinstance(check, str):  # looked up on the config now: a subclass's override is the one that runs
            getattr(config, check)()
        elif check is not None:
            check(config)

    @property
    def where(self) -> str:
        return f"{self.cls.__module__}.{self.cls.__qualname__}"


# The method each kind's parts are called through (trl_credit/core/trainer.py), checked by name: this module imports no part.
_ENTRY_POINTS = {"rollout": "generate_and_score", "credit": "advantages", "modifiers": "apply"}
_BASES = {"rollout": "Rollout", "credit": "Credit", "modifiers": "Modifier"}

_REGISTRY: dict[str, dict[str, PartSpec]] = {kind: {} for kind in KINDS}
_ORDER: list[tuple[str, str]] = []  # (kind, name) across kinds, in registration order: the union's field order
# Set by the composition when it builds CreditConfig from the registered fields: fields registered later could not
# join it (a dataclass's fields are fixed when it is built), so such a registration is refused rather than ignored.
_fields_taken_by: list[str] = []


def register_part(kind: str, name: str, *, help: str, fields: type | None = None, check: str | Callable | None = None,
                  check_after_grpo: str | Callable | None = None, accepts: Mapping[str, Only] | None = None):
    """Class decorator: register a :class:`~trl_credit.core.trainer.Part` subclass as the part ``name`` of ``kind``.

    ``kind`` is "rollout", "credit" or "modifiers"; ``help`` says in one line what it is; ``fields`` is the dataclass
    mixin of its config fields (set only when the part is selected) with ``check`` / ``check_after_grpo``, run on the
    config before / after ``GRPOConfig.__post_init__`` (the name of a method of ``fields``, or a function of the
    config); ``accepts`` maps another kind to :func:`only` the parts of it this part works with. The class gets
    ``name`` as its ``name``. A name registered twice is refused (a re-import of the same class replaces its
    registration).
    """
    if kind not in KINDS:
        raise ValueError(f"register_part: kind={kind!r}; accepted: {', '.join(map(repr, KINDS))}.")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_part: name={name!r} must be an identifier-like string (it is typed on the "
                         "command line and in YAML recipes).")
    if not isinstance(help, str) or not help:
        raise ValueError(f"register_part({kind!r}, {name!r}): help must be a non-empty string, got {help!r}.")
    if fields is not None and not dataclasses.is_dataclass(fields):
        raise TypeError(f"register_part({kind!r}, {name!r}): fields must be a dataclass (the mixin of the part's "
                        f"config fields), got {fields!r}.")
    for argument, value in (("check", check), ("check_after_grpo", check_after_grpo)):
        if isinstance(value, str):
            if fields is None or not callable(getattr(fields, value, None)):
                raise ValueError(f"register_part({kind!r}, {name!r}): {argument}={value!r} must name a method of "
                                 f"fields ({getattr(fields, '__name__', fields)}).")
        elif value is not None and not callable(value):
            raise TypeError(f"register_part({kind!r}, {name!r}): {argument} must be a method name of fields or a "
                            f"function of the config, got {value!r}.")
    accepts = dict(accepts or {})
    for other, rule in accepts.items():
        if other not in KINDS or other == kind:
            raise ValueError(f"register_part({kind!r}, {name!r}): accepts key {other!r}; accepted: the other kinds "
                             f"{[k for k in KINDS if k != kind]}.")
        if not isinstance(rule, Only):
            raise TypeError(f"register_part({kind!r}, {name!r}): accepts[{other!r}] must be only(*names, why=...), "
                            f"got {rule!r}.")

    def register(cls: type) -> type:
        if not isinstance(cls, type) or not callable(getattr(cls, _ENTRY_POINTS[kind], None)):
            raise TypeError(f"register_part({kind!r}, {name!r}) decorates a part class with a "
                            f"`{_ENTRY_POINTS[kind]}` method (a subclass of trl_credit.core.trainer's {_BASES[kind]}), "
                            f"got {cls!r}.")
        spec = PartSpec(kind, name, cls, help, fields, check, check_after_grpo, accepts)
        previous = _REGISTRY[kind].get(name)
        if previous is not None and previous.where != spec.where:
            raise ValueError(f"register_part: the {kind} {name!r} is already registered by {previous.where}; "
                             f"{spec.where} cannot take the same name: choose another name.")
        if fields is not None and _fields_taken_by and previous is None:
            raise RuntimeError(
                f"register_part: the {kind} {name!r} ({spec.where}) declares config fields ({fields.__name__}), but "
                f"{_fields_taken_by[0]} was already built from the registered parts' fields: import the module that "
                "registers it before trl_credit.config (or register it without fields and give its settings to "
                "the part's constructor)."
            )
        if fields is not None:
            mine = {f.name for f in dataclasses.fields(fields)}
            for other in registered():
                if other.fields is not None and other.where != spec.where:
                    shared = sorted(mine & {f.name for f in dataclasses.fields(other.fields)})
                    if shared:
                        raise ValueError(f"register_part: the fields {shared} of the {kind} {name!r} ({spec.where}) "
                                         f"are already fields of the {other.kind} {other.name!r} ({other.where}).")
        declared = cls.__dict__.get("name")
        if declared is not None and declared != name:
            raise ValueError(f"register_part: {spec.where}.name is {declared!r} but it registers as {name!r}.")
        cls.name = name
        if previous is None:
            _ORDER.append((kind, name))
        _REGISTRY[kind][name] = spec
        return cls

    return register


def registered(kind: str | None = None) -> list[PartSpec]:
    """The registrations of ``kind`` (all kinds when None), in registration order."""
    kinds = KINDS if kind is None else (kind,)
    return [spec for k in kinds for spec in _REGISTRY[k].values()]


def part_spec(kind: str, name: str) -> PartSpec | None:
    """The registration of the part ``name`` of ``kind``, or None."""
    return _REGISTRY[kind].get(name)


def part_names(kind: str) -> dict[str, str]:
    """Name -> help of the parts of ``kind``, in registration order."""
    return {spec.name: spec.help for spec in _REGISTRY[kind].values()}


def take_fields(owner: str) -> None:
    """Called by ``owner`` (the composition) when it builds its config from the registered fields: a part registered
    later with fields is refused (:func:`register_part` says why) instead of its fields being silently absent."""
    if not _fields_taken_by:
        _fields_taken_by.append(owner)


def registered_in_order() -> list[PartSpec]:
    """Every registration across kinds, in the order the registrations ran (fields join the union in this order)."""
    return [_REGISTRY[kind][name] for kind, name in _ORDER if name in _REGISTRY[kind]]
