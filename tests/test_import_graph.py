"""No import circles inside trl_credit (docs/design.md, "Shared modules": the layers import downwards only).

The graph counts every import a module makes, at the top or inside a function: a circle hidden behind a
function-level import still makes two modules one unit (neither can be read, tested or moved without the other).
Imports under ``if TYPE_CHECKING:`` are left out (they never run). ``from pkg import name`` counts as an import of
the submodule ``pkg.name`` when there is one, else of ``pkg`` itself; the parent packages Python initialises on the
way (``import a.b`` runs ``a/__init__``) are not counted, since a package importing its own submodules is the
normal layout.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def _module_names(root: pathlib.Path) -> dict[str, pathlib.Path]:
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def import_graph(root: pathlib.Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its body), for the package folder ``root``."""
    modules = _module_names(root)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = _type_checking_nodes(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.add(submodule if submodule in modules else base)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _write_package(tmp_path, files: dict[str, str]) -> pathlib.Path:
    root = tmp_path / "pkg"
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_trl_credit_has_no_import_cycle():
    cycles = import_cycles(import_graph(REPO / "trl_credit"))
    assert cycles == [], f"import circles (each group imports itself through the others): {cycles}"


def test_a_cycle_behind_a_function_level_import_is_found(tmp_path):
    # a -> b at the top, b -> a inside a function: the circle that chain.py <-> data.py was.
    root = _write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from .b import B\n",
        "b.py": "B = 1\n\ndef late():\n    from .a import something\n",
        "c.py": "from pkg import a\n",
    })
    graph = import_graph(root)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert import_cycles(graph) == [["pkg.a", "pkg.b"]]


def test_type_checking_imports_and_own_submodules_are_not_cycles(tmp_path):
    root = _write_package(tmp_path, {
        "__init__.py": "from pkg.sub.model import Model\n",
        "sub/__init__.py": "from pkg.sub.model import Model\n",
        "sub/model.py": "from typing import TYPE_CHECKING\nfrom pkg.sub import helpers\n"
                        "if TYPE_CHECKING:\n    from pkg.user import User\n",
        "sub/helpers.py": "",
        "user.py": "from pkg.sub.model import Model\n",
    })
    assert import_cycles(import_graph(root)) == []


@pytest.mark.parametrize("importer", ["from pkg.sub import NAME\n", "import pkg.sub\n"])
def test_importing_a_name_of_ones_own_package_init_is_a_cycle(tmp_path, importer):
    # pkg/sub/__init__ imports model, and model reads a name from pkg/sub/__init__: a real circle.
    root = _write_package(tmp_path, {
        "__init__.py": "",
        "sub/__init__.py": "from pkg.sub.model import Model\nNAME = 1\n",
        "sub/model.py": importer,
    })
    assert import_cycles(import_graph(root)) == [["pkg.sub", "pkg.sub.model"]]


# The layers of trl_credit's subpackages (docs/design.md#layout): a module imports from its own layer or below.
# Methods may build on each other's pure math.
LAYERS = {
    "models": 0, "tasks": 0, "trl_bridge": 0, "generation": 0, "run_results": 0,
    "core": 1, "model_card": 1,
    "cue_grpo": 2, "oppo": 2, "datpo": 2, "srpo": 2, "process": 2, "prime": 2,
    "config": 3, "evaluation": 3, "scripts": 3, "train": 3, "cli": 3, "testbed": 3, "": 3,
}
# Upward imports kept, each inside a function (never at import time), with the reason written at the import.
UPWARD = {
    # a bare CreditTrainer(args=CreditConfig(...)) builds its parts by name: the composition sits above the methods
    ("trl_credit.core.trainer", "trl_credit.config"),
}


def _layer_of(module: str) -> tuple[str, int]:
    name = module.split(".")[1] if "." in module else ""
    assert name in LAYERS, f"{module}: a new subpackage of trl_credit; give it a layer in LAYERS (docs/design.md#layout)"
    return name, LAYERS[name]


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((source, target) for source, targets in graph.items() for target in targets
                  if _layer_of(target)[1] > _layer_of(source)[1])


def test_subpackages_import_downwards():
    assert [edge for edge in upward_imports(import_graph(REPO / "trl_credit")) if edge not in UPWARD] == []


def test_the_kept_upward_imports_exist_and_sit_inside_functions():
    # an exception that no longer happens is removed from UPWARD; one that moved to the top of a module is a failure
    graph = import_graph(REPO / "trl_credit")
    for source, target in UPWARD:
        assert target in graph[source], (source, target)
        path = REPO / (source.replace(".", "/") + ".py")
        top_level = [node for node in ast.parse(path.read_text()).body if isinstance(node, (ast.Import, ast.ImportFrom))]
        assert all(target not in ast.unparse(node) for node in top_level), (source, target)


def test_an_upward_import_is_found():
    graph = {"trl_credit.tasks.chain": {"trl_credit.srpo.prompts"}, "trl_credit.srpo.prompts": {"trl_credit.tasks.rewards"},
             "trl_credit.tasks.rewards": set()}
    assert upward_imports(graph) == [("trl_credit.tasks.chain", "trl_credit.srpo.prompts")]
