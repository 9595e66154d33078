"""The one registry of parts (trl_credit/core/registry.py) and the composition above the methods (trl_credit/config.py):
parts register themselves with their fields, checks and pair rules; duplicates are refused naming both; the
composition discovers the methods through the registry; no method package imports the composition."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

from trl_credit.config import CreditConfig, accepted_parts, build_part, refusal
from trl_credit.core import registry
from trl_credit.core.registry import only, part_spec, register_part
from trl_credit.core.trainer import Credit, Modifier, Rollout


@pytest.fixture
def scratch_registry(monkeypatch):
    """Registrations made in a test are dropped after it (the session's registry is left as it was)."""
    monkeypatch.setattr(registry, "_REGISTRY", {k: dict(v) for k, v in registry._REGISTRY.items()})
    monkeypatch.setattr(registry, "_ORDER", list(registry._ORDER))
    monkeypatch.setattr(registry, "_fields_taken_by", list(registry._fields_taken_by))


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_built_in_parts_are_registered_with_their_classes():
    expected = {
        ("rollout", "groups"): "trl_credit.core.trainer.GroupRollout",
        ("rollout", "resets"): "trl_credit.srpo.parts.Resets",
        ("rollout", "trees"): "trl_credit.datpo.parts.Trees",
        ("credit", "outcome"): "trl_credit.core.trainer.GroupOutcome",
        ("credit", "oppo"): "trl_credit.oppo.parts.ValueRecursion",
        ("credit", "blocks"): "trl_credit.datpo.parts.BlockCredit",
        ("credit", "process"): "trl_credit.process.parts.ProcessCredit",
        ("credit", "implicit_prm"): "trl_credit.prime.parts.ImplicitPRMCredit",
        ("modifiers", "cue"): "trl_credit.cue_grpo.parts.RarityWeights",
    }
    for (kind, name), where in expected.items():
        assert part_spec(kind, name).where == where
        assert part_spec(kind, name).cls.name == name
    assert list(accepted_parts("rollout")) == ["groups", "resets", "trees"]
    assert list(accepted_parts("modifiers"))[:1] == ["cue"]
    assert type(build_part("credit", "oppo")).__name__ == "ValueRecursion"
    with pytest.raises(ValueError, match=r"credit='ppo'; accepted: 'outcome' "):
        build_part("credit", "ppo")


def test_no_method_package_imports_the_composition():
    # A method package sits below the composition: importing it (its parts, config and preset) must not import
    # trl_credit.config; the composition imports them.
    out = _run("""
        import importlib, sys
        for package in ("srpo", "datpo", "oppo", "cue_grpo", "process", "prime"):
            for module in ("", ".parts", ".config", ".trainer"):
                try:
                    importlib.import_module(f"trl_credit.{package}{module}")
                except ModuleNotFoundError as error:  # the process credits have no preset
                    assert module == ".trainer" and package in ("process", "prime"), error
        from trl_credit import OPPOTrainer, OPPOConfig, SRPOTrainer, DATPOTrainer, CueGRPOTrainer
        print("trl_credit.config" in sys.modules)
    """)
    assert out.strip() == "False"


def test_the_union_fields_keep_their_order_whatever_was_imported_first():
    code = """
        import dataclasses, sys
        {first}
        from trl_credit.config import CreditConfig
        print(",".join(f.name for f in dataclasses.fields(CreditConfig)))
    """
    plain = _run(code.format(first=""))
    # the process and OPPO parts registered before SRPO's and DATPO's: the field order is BUILT_IN's all the same
    reordered = _run(code.format(first="import trl_credit.process.parts, trl_credit.oppo.parts"))
    assert plain == reordered
    assert plain.strip().split(",")[-3:] == ["rollout", "credit", "modifiers"]
    assert [f.name for f in dataclasses.fields(CreditConfig)] == plain.strip().split(",")


def test_a_duplicate_name_is_refused_naming_both(scratch_registry):
    with pytest.raises(ValueError, match=r"the credit 'oppo' is already registered by trl_credit\.oppo\.parts\."
                                         r"ValueRecursion; tests\.test_registry\..*Impostor cannot take the same name"):
        @register_part("credit", "oppo", help="another OPPO")
        class Impostor(Credit):
            pass


def test_the_same_class_registered_again_replaces_itself(scratch_registry):
    # a re-import (importlib.reload) builds a new class object of the same module and name: not a duplicate
    def make():
        @register_part("modifiers", "twice", help="a modifier registered twice")
        class Twice(Modifier):
            pass
        return Twice

    first, second = make(), make()
    assert part_spec("modifiers", "twice").cls is second is not first


def test_bad_registrations_name_the_argument(scratch_registry):
    @dataclasses.dataclass
    class ToyFields:
        toy_scale: float = 1.0

        def _check_toy(self):
            pass

    cases = [
        (dict(kind="credits", name="x", help="h"), ValueError, r"kind='credits'; accepted: 'rollout', 'credit'"),
        (dict(kind="credit", name="two words", help="h"), ValueError, r"name='two words' must be an identifier"),
        (dict(kind="credit", name="x", help=""), ValueError, r"help must be a non-empty string"),
        (dict(kind="credit", name="x", help="h", fields=dict), TypeError, r"fields must be a dataclass"),
        (dict(kind="credit", name="x", help="h", fields=ToyFields, check="_missing"), ValueError,
         r"check='_missing' must name a method of fields \(ToyFields\)"),
        (dict(kind="credit", name="x", help="h", check_after_grpo=3), TypeError, r"check_after_grpo must be"),
        (dict(kind="credit", name="x", help="h", accepts={"credit": only("oppo", why="w")}), ValueError,
         r"accepts key 'credit'; accepted: the other kinds \['rollout', 'modifiers'\]"),
        (dict(kind="credit", name="x", help="h", accepts={"rollout": ("groups",)}), TypeError,
         r"accepts\['rollout'\] must be only\(\*names, why=...\)"),
    ]
    for kwargs, error, message in cases:
        kind, name = kwargs.pop("kind"), kwargs.pop("name")
        with pytest.raises(error, match=message):
            register_part(kind, name, **kwargs)
    with pytest.raises(TypeError, match=r"register_part\('credit', 'x'\) decorates a part class with an? "
                                        r"`advantages` method \(a subclass of trl_credit.core.trainer's Credit\)"):
        register_part("credit", "x", help="h")(Modifier)
    with pytest.raises(ValueError, match="say why"):
        only("groups", why="")
    # fields that another part already owns would be merged silently into one dataclass field: refused
    registry._fields_taken_by.clear()  # as before CreditConfig was built (the fixture restores it)
    OPPOLike = dataclasses.make_dataclass("OPPOLike", [("evidence_clip", float, dataclasses.field(default=1.0))])
    with pytest.raises(ValueError, match=r"the fields \['evidence_clip'\] of the credit 'copy' .* are already fields "
                                         r"of the credit 'oppo' \(trl_credit\.oppo\.parts\.ValueRecursion\)"):
        register_part("credit", "copy", help="h", fields=OPPOLike)(type("Copy", (Credit,), {}))


def test_fields_registered_after_the_union_was_built_are_refused(scratch_registry):
    @dataclasses.dataclass
    class LateFields:
        late_scale: float = 1.0

    with pytest.raises(RuntimeError, match=r"the credit 'late' .* declares config fields \(LateFields\), but "
                                           r"trl_credit\.config\.CreditConfig was already built .* import the module "
                                           r"that registers it before trl_credit\.config"):
        @register_part("credit", "late", help="registered too late", fields=LateFields)
        class Late(Credit):
            pass


def test_pair_rules_come_from_the_registrations(scratch_registry, tmp_path):
    # A toy rollout that accepts only the outcome credit and no modifier: the config and the trainer refuse the
    # rest with its reason, from its registration alone.
    @register_part("rollout", "narrow", help="a rollout for one credit",
                   accepts={"credit": only("outcome", why="narrow rows carry one outcome"),
                            "modifiers": only("cue", why="only rarity applies")})
    class Narrow(Rollout):
        pass

    assert refusal("narrow", "outcome", ["cue"]) is None
    assert refusal("narrow", "oppo", []) == ("rollout='narrow' with credit='oppo': rollout='narrow' needs "
                                             "credit='outcome' (narrow rows carry one outcome).")
    with pytest.raises(ValueError, match=r"rollout='narrow' with credit='process': rollout='narrow' needs "
                                         r"credit='outcome' \(narrow rows carry one outcome\)"):
        CreditConfig(str(tmp_path), use_cpu=True, rollout="narrow", credit="process")
    assert CreditConfig(str(tmp_path), use_cpu=True, rollout="narrow").rollout == "narrow"

    @register_part("modifiers", "loud", help="a second modifier")
    class Loud(Modifier):
        pass

    assert refusal("narrow", "outcome", ["cue", "loud"]) == (
        "rollout='narrow' with modifiers=['cue', 'loud']: rollout='narrow' takes no modifier but ['cue'] "
        "(only rarity applies).")
    assert refusal("groups", "outcome", ["loud", "loud"]) == (
        "modifiers=['loud', 'loud'] repeats ['loud']; each modifier applies at most once.")
    # the built-in rules, declared by DATPO's parts
    assert "needs credit='blocks'" in refusal("trees", "oppo", [])
    assert "credit='blocks' needs rollout='trees'" in refusal("resets", "blocks", [])
    assert "takes no modifier but ['cue']" in refusal("trees", "blocks", ["loud"])
    assert refusal("trees", "blocks", ["cue"]) is None


def test_removing_the_process_registration_removes_the_process_credit_cleanly():
    # The process credit is its folder plus one line outside it, its parts module in BUILT_IN. The composition
    # built without that line: no 'process' credit, none of its fields, every other field where it was, and
    # nothing else imports the folder's parts.
    out = _run("""
        import dataclasses, sys, types
        import trl_credit, trl_credit.config as full
        fields_full = [f.name for f in dataclasses.fields(full.CreditConfig)]
        source = open(full.__file__).read()
        line = '    "trl_credit.process.parts",\\n'
        assert source.count(line) == 1
        for name in [m for m in sys.modules if m.startswith("trl_credit")]:
            del sys.modules[name]  # a fresh registry and fresh method packages
        import trl_credit.core.registry
        module = types.ModuleType("trl_credit.config")
        module.__file__ = full.__file__
        sys.modules["trl_credit.config"] = module
        exec(compile(source.replace(line, ""), full.__file__, "exec"), module.__dict__)
        assert "trl_credit.process.parts" not in sys.modules, "another module imports the process credit"
        Config = module.CreditConfig
        names = [f.name for f in dataclasses.fields(Config)]
        process = [name for name in fields_full if name.startswith("process_")]
        assert process and not set(process) & set(names)
        assert names == [name for name in fields_full if name not in process]
        assert "process" not in module.accepted_parts("credit")
        try:
            Config("x", use_cpu=True, credit="process")
        except ValueError as error:
            assert "credit='process'; accepted: 'outcome'" in str(error), error
        else:
            raise AssertionError("credit='process' was accepted without its registration")
        config = Config("x", use_cpu=True, rollout="resets", credit="oppo", modifiers=["cue"])
        print(len(process), config.credit)
    """)
    assert out.split() == ["4", "oppo"]  # process_step_reward, _thought_delimiter, _steps, _outcome


def test_removing_the_prime_registration_removes_the_implicit_prm_credit_cleanly():
    # PRIME is its folder plus one line outside it, its parts module in BUILT_IN: without that line, no
    # 'implicit_prm' credit, none of its fields, every other field where it was, nothing else imports its parts.
    out = _run("""
        import dataclasses, sys, types
        import trl_credit, trl_credit.config as full
        fields_full = [f.name for f in dataclasses.fields(full.CreditConfig)]
        source = open(full.__file__).read()
        line = '    "trl_credit.prime.parts",\\n'
        assert source.count(line) == 1
        for name in [m for m in sys.modules if m.startswith("trl_credit")]:
            del sys.modules[name]
        import trl_credit.core.registry
        module = types.ModuleType("trl_credit.config")
        module.__file__ = full.__file__
        sys.modules["trl_credit.config"] = module
        exec(compile(source.replace(line, ""), full.__file__, "exec"), module.__dict__)
        assert "trl_credit.prime.parts" not in sys.modules, "another module imports the PRIME credit"
        names = [f.name for f in dataclasses.fields(module.CreditConfig)]
        prime = [name for name in fields_full if name.startswith("prime_")]
        assert prime and names == [name for name in fields_full if name not in prime]
        assert "implicit_prm" not in module.accepted_parts("credit") and "process" in module.accepted_parts("credit")
        print(len(prime))
    """)
    assert out.split() == ["14"]  # PRIME's fields (docs/process.md#configuration)
