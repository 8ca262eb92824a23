"""The package's shape: layered modules with no import circle, and a top level a newcomer reads in a minute.

The import graph counts every import of a fedbench module wherever it sits in a file (a function-local
import is still a dependency: it only hides a circle from the interpreter), except under
`if TYPE_CHECKING:`, which never runs. An edge goes to the module named (`from fedbench.x import y` is an
edge to fedbench.x, or to fedbench.x.y when y is itself a module).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fedbench"
MAX_TOP_LEVEL_MODULES = 8 + 1  # + leaderboard.py: the public fedbench.leaderboard.load


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The fedbench modules `tree` imports, anywhere but under `if TYPE_CHECKING:`."""
    found: set[str] = set()

    def resolve(base: str, names: list[str]) -> None:
        for alias in names:
            sub = f"{base}.{alias}"
            found.add(sub if sub in known else base)

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "fedbench")
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                parts = name.split(".")
                parts = parts if is_package else parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == "fedbench":
                resolve(base, [a.name for a in node.names])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {
        name: _imports(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
        for name, path in modules.items()
    }


def test_no_import_circle():
    graph = import_graph()
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        cycle = exc.args[1]
        pytest.fail("import circle: " + " -> ".join(cycle))


def test_the_walker_sees_function_local_imports_and_skips_type_checking():
    """The walker is not blind: a circle hidden in a function counts, a TYPE_CHECKING one does not."""
    known = {"fedbench.a", "fedbench.b", "fedbench.c"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from fedbench.c import X\n"
        "def f():\n    from fedbench.b import y\n"
    )
    assert _imports(ast.parse(source), "fedbench.a", False, known) == {"fedbench.b"}
    graph = {"fedbench.a": {"fedbench.b"}, "fedbench.b": {"fedbench.a"}}
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter(graph).static_order())


def test_top_level_is_small():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(modules)} modules directly under fedbench/: {modules}"
    )


def test_presets_folder_says_what_it_holds():
    readme = ROOT / "registry" / "README.md"
    assert readme.is_file(), "registry/README.md explains the top-level registry/ folder"
    assert "preset" in readme.read_text().lower()
