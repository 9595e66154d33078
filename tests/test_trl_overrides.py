"""Every TRL method trl_credit overrides is overridden once, by the credit core (docs/design.md, "Design
principles" and "How the core hooks into GRPOTrainer").

The scan reads trl_credit's source (no import of the method packages' code paths): a method of ``GRPOTrainer`` or
its bases (``transformers.Trainer``) counts as overridden where a class body ``def``\\ s it or assigns it (an
annotated assignment is a dataclass field, not a method), and as
swapped in where code assigns it as an attribute (``cls._generate = ...``, ``self._generate_single_turn = ...``,
``setattr(obj, "_generate", ...)``): the class-creation and instance-level rewrites that made a name overridden
twice without a second ``def``. Dunder methods (``__init__``, ``__init_subclass__``) are cooperative constructors,
not overrides of TRL's behaviour, and are left out.

The second scan: credits and modifiers return advantages and never write TRL's batch dict (docs/design.md, "The
credit core"); the core does, once. The third: a method package reads no private attribute of the trainer
(``trainer._tokenizer``, ``getattr(trainer, "_step")``); it calls trl_credit/trl_bridge/privates.py, which names each one.
"""

from __future__ import annotations

import ast
import pathlib
from collections import defaultdict

import pytest
from trl import GRPOTrainer

REPO = pathlib.Path(__file__).resolve().parent.parent


def trl_method_names() -> set[str]:
    return {name for name in dir(GRPOTrainer) if not name.startswith("__") and callable(getattr(GRPOTrainer, name))}


def trl_name_definitions(root: pathlib.Path, names: set[str]):
    """``(overrides, rewrites)``: ``overrides[name]`` lists ``"path:Class"`` for each class body defining or assigning
    ``name``; ``rewrites`` lists ``"path:line name"`` for each attribute assignment or ``setattr`` of ``name``."""
    overrides, rewrites = defaultdict(list), []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(root.parent).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        defined = [statement.name]
                    elif isinstance(statement, ast.Assign):
                        # annotated ones are dataclass fields (a Block's ``end``, a config's ``num_examples``)
                        defined = [target.id for target in statement.targets if isinstance(target, ast.Name)]
                    else:
                        defined = []
                    for name in defined:
                        if name in names:
                            overrides[name].append(f"{where}:{node.name}")
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr in names:
                        rewrites.append(f"{where}:{node.lineno} {target.attr}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
                  and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
                rewrites.append(f"{where}:{node.lineno} {node.args[1].value}")
    return dict(overrides), sorted(rewrites, key=lambda place: (place.split(':')[0], int(place.split(':')[1].split()[0])))


def _core_classes() -> set[str]:
    """``"module path:Class"`` of the credit core and the trl_credit mixins it is built from."""
    from trl_credit.core.trainer import CreditTrainer

    classes = set()
    for klass in CreditTrainer.__mro__:
        module = klass.__module__
        if module.startswith("trl_credit"):
            classes.add(f"{module.replace('.', '/')}.py:{klass.__name__}")
    return classes


def test_every_trl_override_is_written_once_in_the_core():
    overrides, rewrites = trl_name_definitions(REPO / "trl_credit", trl_method_names())
    twice = {name: places for name, places in overrides.items() if len(places) > 1}
    assert twice == {}, f"TRL methods overridden more than once: {twice}"
    core = _core_classes()
    outside = {name: places for name, places in overrides.items() if not set(places) <= core}
    assert outside == {}, f"TRL methods overridden outside CreditTrainer and its mixins ({sorted(core)}): {outside}"
    # One swap is allowed, for the length of TRL's `_generate` only: the empty-completion check wraps whatever
    # `_generate_single_turn` is on the instance (the core's override, a user's subclass override, or a function the
    # user set on the instance) and restores it, so a 0-token completion emptied above the core meets the named error
    # instead of TRL's IndexError. A class-body override would run below a user's subclass and miss it.
    allowed = {("trl_credit/core/mixins.py", "_generate_single_turn")}
    swapped = [r for r in rewrites if (r.split(":")[0], r.split(" ")[-1]) not in allowed]
    assert swapped == [], f"TRL methods swapped in by assignment instead of one override: {swapped}"
    assert len(rewrites) - len(swapped) <= 2  # the swap and its restore, nowhere else in that module
    # the two that were written twice before (a mixin's and the core's), now the core's alone
    assert overrides["_generate"] == ["trl_credit/core/trainer.py:CreditTrainer"]
    assert overrides["_generate_and_score_completions"] == ["trl_credit/core/trainer.py:CreditTrainer"]


def _write(tmp_path, text: str) -> pathlib.Path:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "module.py").write_text(text)
    return root


@pytest.mark.parametrize("source, expected", [
    # a second def in a mixin: the shape of the old RolloutCaptureMixin / EmptyCompletionCheckMixin pair
    ("class A:\n    def _generate(self, prompts): ...\nclass B:\n    def _generate(self, prompts): ...\n",
     {"_generate": ["pkg/module.py:A", "pkg/module.py:B"]}),
    # a class attribute built by a wrapper (the core's get_off_policy_mask) is an override too
    ("class A:\n    get_off_policy_mask = staticmethod(len)\n", {"get_off_policy_mask": ["pkg/module.py:A"]}),
    # dunders, names TRL does not have and dataclass fields that share a Trainer method's name are not overrides
    ("class A:\n    def __init__(self): ...\n    def advantages(self): ...\n    num_examples: int = 8\n", {}),
])
def test_the_scan_finds_class_body_overrides(tmp_path, source, expected):
    overrides, rewrites = trl_name_definitions(_write(tmp_path, source), trl_method_names())
    assert overrides == expected and rewrites == []


def test_the_scan_finds_names_swapped_in_at_class_creation_or_on_an_instance(tmp_path):
    # the old OneWeightPushMixin.__init_subclass__ and EmptyCompletionCheckMixin._generate did exactly these
    source = ("class A:\n    def __init_subclass__(cls):\n        cls._generate_and_score_completions = None\n"
              "def patch(trainer):\n    trainer._generate_single_turn = None\n"
              "    setattr(trainer, 'compute_loss', None)\n    trainer.rollout_func = None\n")
    overrides, rewrites = trl_name_definitions(_write(tmp_path, source), trl_method_names())
    assert overrides == {}
    assert rewrites == ["pkg/module.py:3 _generate_and_score_completions", "pkg/module.py:5 _generate_single_turn",
                        "pkg/module.py:6 compute_loss"]


# ------------------------------------------------------------------------------ credits return, the core writes
CREDIT_BASES = {"Credit", "Modifier", "GroupOutcome"}


def writes_to_trls_batch(root: pathlib.Path) -> list[str]:
    """``"path:line Class.method"`` for each write, inside a credit's or modifier's class, to the hook parameter
    ``output`` (TRL's batch dict): an item assignment or deletion, or ``update`` / ``pop`` / ``setdefault``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(root.parent).as_posix()
        for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
            if not {ast.unparse(base).rpartition(".")[2] for base in cls.bases} & CREDIT_BASES:
                continue
            for method in (node for node in cls.body if isinstance(node, ast.FunctionDef)):
                for node in ast.walk(method):
                    targets = []
                    if isinstance(node, (ast.Assign, ast.Delete)):
                        targets = node.targets
                    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                        targets = [node.target]
                    for target in targets:
                        for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                            if isinstance(element, ast.Subscript) and ast.unparse(element.value) == "output":
                                found.append(f"{where}:{node.lineno} {cls.name}.{method.name}")
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and ast.unparse(node.func.value) == "output"
                            and node.func.attr in {"update", "pop", "setdefault"}):
                        found.append(f"{where}:{node.lineno} {cls.name}.{method.name}")
    return found


def test_credits_and_modifiers_return_advantages_and_never_write_trls_batch():
    # The core writes TRL's batch (the advantages through the rollout's training rows, the sequence anchors from the
    # record); a credit or modifier that wrote it too would be a second writer the core cannot order.
    assert writes_to_trls_batch(REPO / "trl_credit") == []


def test_the_write_scan_finds_the_writes_it_forbids(tmp_path):
    # the two shapes OPPO's credit had: an item assignment, and one inside a tuple target
    source = ("class Oppo(core.Credit):\n    def advantages(self, trainer, batch, inputs, output):\n"
              "        output['advantages'] = 1\n        a, output['anchors'] = 2, 3\n        return a\n"
              "class Cue(Modifier):\n    def apply(self, trainer, batch, inputs, output, advantages):\n"
              "        output.update(x=1)\n        return advantages\n"
              "class Rows(Rollout):\n    def training_batch(self, trainer, batch, inputs, output, advantages):\n"
              "        output['advantages'] = advantages\n        return output\n")
    assert writes_to_trls_batch(_write(tmp_path, source)) == [
        "pkg/module.py:3 Oppo.advantages", "pkg/module.py:4 Oppo.advantages", "pkg/module.py:8 Cue.apply"]


def test_only_the_core_writes_trls_completions_table():
    # Parts hand the table's values to the record (RowBatch.log_advantages); the core writes them once, after every
    # part ran, so a modifier's values are never overwritten by an earlier part's and no part touches TRL's _logs.
    writers = sorted(str(path.relative_to(REPO)) for path in (REPO / "trl_credit").rglob("*.py")
                     if "replace_logged_advantages(" in path.read_text() or '_logs["advantages"]' in path.read_text())
    assert writers == ["trl_credit/core/logs.py", "trl_credit/core/trainer.py"]


# The folders of trl_credit that hold a method: every one but the layers below them (the core, the TRL bridge,
# generation hooks, tasks), evaluation and the testbed (which builds toy models, not parts).
NOT_METHODS = {"core", "trl_bridge", "generation", "tasks", "evaluation", "testbed"}
METHOD_PACKAGES = sorted(path for path in (REPO / "trl_credit").iterdir()
                         if (path / "__init__.py").exists() and path.name not in NOT_METHODS)


def _is_trainer(node: ast.expr) -> bool:
    # the parts' hook parameter ``trainer``, or a part's reference to it (``self.trainer``)
    return (isinstance(node, ast.Name) and node.id == "trainer") or (
        isinstance(node, ast.Attribute) and node.attr == "trainer")


def private_trainer_reads(root: pathlib.Path) -> list[str]:
    """``"path:line name"`` for each use of a private attribute (one leading underscore, not a dunder) of the
    trainer: ``trainer._x`` read, written or called, and ``getattr`` / ``hasattr`` / ``setattr(trainer, "_x")``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(root.parent).as_posix()
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and _is_trainer(node.value):
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in {"getattr", "hasattr", "setattr"} and len(node.args) >= 2
                  and _is_trainer(node.args[0]) and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str)):
                name = node.args[1].value
            if name and name.startswith("_") and not name.startswith("__"):
                found.append((where, node.lineno, node.col_offset, name))
    return [f"{where}:{line} {name}" for where, line, _, name in sorted(found)]  # ast.walk is breadth-first


@pytest.mark.parametrize("package", METHOD_PACKAGES, ids=lambda path: path.name)
def test_method_packages_read_the_trainer_through_the_bridge(package):
    # TRL's privates and the core's own move between releases; bridge.py is the one place that follows them.
    assert private_trainer_reads(package) == []


def test_the_private_read_scan_finds_each_kind_of_read(tmp_path):
    source = ("def f(trainer, part):\n"
              "    pad = trainer._tokenizer.pad_token_id\n"
              "    trainer._buffered_inputs = [pad]\n"
              "    ids = part.trainer._tokenize_prompts(['a'])\n"
              "    return getattr(trainer, '_step'), hasattr(trainer, '__dict__')\n"
              "def g(trainer, other):\n"
              "    return trainer.args, other._private, trainer.__class__\n")
    assert private_trainer_reads(_write(tmp_path, source)) == [
        "pkg/module.py:2 _tokenizer", "pkg/module.py:3 _buffered_inputs", "pkg/module.py:4 _tokenize_prompts",
        "pkg/module.py:5 _step"]


# ------------------------------------------------------------------------------ parts get a context, not the trainer
# The method packages (or modules of one) whose parts take a BatchContext at batch time (trl_credit/core/context.py).
# Only ``setup(trainer)`` (construction) and the construction-time helpers named below may hold the trainer; a TRL
# private is read behind the context, never on it (``ctx._trainer``). Every method package (layer 2 of
# tests/test_import_graph.py) is scanned: a new one is covered without being listed.
def _method_packages() -> list[str]:
    from tests.test_import_graph import LAYERS

    return sorted(name for name, layer in LAYERS.items() if layer == 2)


CONTEXT_PACKAGES = _method_packages()
CONSTRUCTION_TIME = {"setup", "__init__"}
CONSTRUCTION_HELPERS = {  # "package/module.py" -> helpers called from setup only
    "cue_grpo/parts.py": {"_load_judge"},  # loads the judge model onto the trainer's device
    "oppo/parts.py": {"causal_lm", "load_teacher"},  # the float32 head / the teacher, prepared at setup
    "datpo/parts.py": {"_load_embedder"},  # loads the sentence embedder onto the trainer's device
}


def trainer_uses_at_batch_time(root: pathlib.Path, helpers: dict[str, set[str]] | None = None) -> list[str]:
    """``"path:line what"`` for each use, in a function other than ``setup`` / ``__init__`` / a named construction
    helper, of the trainer (the name ``trainer``, an attribute ``.trainer``: a way back to it), of
    :mod:`trl_credit.trl_bridge.privates` (whose every function takes the trainer), or of a private attribute of the context
    (``ctx._x``)."""
    helpers = helpers or {}
    found = []
    base = root.parent.parent if root.is_file() else root.parent  # "package/module.py" either way
    for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(base).as_posix()
        allowed = CONSTRUCTION_TIME | helpers.get(where, set())
        functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inside_allowed = {id(inner) for fn in functions if fn.name in allowed for inner in ast.walk(fn)}
        for fn in functions:
            if id(fn) in inside_allowed:
                continue
            for node in ast.walk(fn):
                what = None
                if isinstance(node, ast.Name) and node.id == "trainer":
                    what = "trainer"
                elif isinstance(node, ast.arg) and node.arg == "trainer":
                    what = "trainer parameter"
                elif isinstance(node, ast.Attribute) and node.attr == "trainer":
                    what = ".trainer"
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    if node.value.id == "bridge":
                        what = f"bridge.{node.attr}"
                    elif node.value.id == "ctx" and node.attr.startswith("_"):
                        what = f"ctx.{node.attr}"
                if what:
                    found.append((where, node.lineno, node.col_offset, what))
    return [f"{where}:{line} {what}" for where, line, _, what in sorted(set(found))]


@pytest.mark.parametrize("package", CONTEXT_PACKAGES)
def test_method_packages_use_the_context_not_the_trainer_at_batch_time(package):
    assert trainer_uses_at_batch_time(REPO / "trl_credit" / package, CONSTRUCTION_HELPERS) == []


def test_the_batch_time_scan_finds_each_kind_of_use(tmp_path):
    source = ("class Credit:\n"
              "    def setup(self, trainer):\n"                       # construction: allowed
              "        self.tok = bridge.tokenizer(trainer)\n"
              "        def nested():\n"
              "            return trainer.args\n"
              "    def advantages(self, ctx, batch, inputs, output):\n"
              "        trainer = ctx.trainer\n"                       # a way back to the trainer
              "        ids = bridge.pad_token_id(ctx.trainer)\n"
              "        return ctx._trainer.model, ctx.args, ctx.metric('x/y', 1.0)\n"
              "def _helper(trainer, values):\n"                      # a helper taking the trainer
              "    return values\n"
              "def _load(trainer):\n"                                # a named construction helper: allowed
              "    return trainer.model\n")
    assert trainer_uses_at_batch_time(_write(tmp_path, source), {"pkg/module.py": {"_load"}}) == [
        "pkg/module.py:7 trainer", "pkg/module.py:7 .trainer", "pkg/module.py:8 bridge.pad_token_id",
        "pkg/module.py:8 .trainer", "pkg/module.py:9 ctx._trainer", "pkg/module.py:10 trainer parameter"]
