"""The layers `ls kinetic/` shows, checked on the whole import graph: every import of every module
(module level, inside functions and under TYPE_CHECKING alike) goes down a layer or stays in its own, and
no modules import each other, directly or round a circle. docs/architecture.md draws the same layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "kinetic"

# Top to bottom. A package may import its own modules and any package below it, never one above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__", "cli"),
    ("server", "grading"),
    ("protocols", "web"),
    ("model_registry",),
    ("backends",),
    ("config",),
    ("chat",),
    ("classroom",),
    ("engine",),
    ("scheduling",),
    ("errors", "__init__"),
)
# Pairs the ranks above allow but the architecture forbids: the first never imports the second.
# The classroom's rules are told neutral counts (classroom/outcome.py), never an engine's types.
NEVER: tuple[tuple[str, str], ...] = (
    ("classroom", "engine"),
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_names(root: Path) -> dict[str, Path]:
    """Each module's dotted name (a package by its __init__'s name) and its file."""
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules this one imports: `from a.b import c` counts as a.b.c when c is a module."""

    def nearest(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]) if node.level \
                else node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found.update(t for target in targets if (t := nearest(target)) is not None and t != name)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    known = module_names(root)
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts with more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in stack:
                low[node] = min(low[node], index[target])
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if RANK[layer_of(target)] < RANK[layer_of(module)])


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in graph.items() for target in targets
                  if (layer_of(module), layer_of(target)) in NEVER)


def test_every_top_level_entry_has_a_layer() -> None:
    entries = {p.stem if p.suffix == ".py" else p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert entries == set(RANK), entries ^ set(RANK)
    assert len(entries) <= 15  # 14, and scheduling: the class's sharing rules below the engines


def test_no_module_imports_back_up_a_layer() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 150 and "kinetic.server.app" in graph["kinetic.cli"] | {
        t for m in graph["kinetic.cli"] for t in graph[m]}
    assert upward_imports(graph) == []


def test_no_pair_the_architecture_forbids_imports_the_other() -> None:
    assert forbidden_imports(import_graph(PACKAGE)) == []


def test_no_modules_import_each_other() -> None:
    assert circles(import_graph(PACKAGE)) == []


@pytest.fixture
def broken_package(tmp_path: Path) -> Path:
    """A kinetic/ in miniature with one of each fault: a circle (one side under TYPE_CHECKING, one inside
    a function, through a relative import), an engine module that imports a protocol, and a classroom module
    that imports the engine."""
    root = tmp_path / "kinetic"
    files = {
        "__init__.py": "",
        "engine/__init__.py": "",
        "engine/types.py": "from kinetic.protocols.common import wire\n",
        "classroom/__init__.py": "",
        "classroom/outcome.py": "from kinetic.engine.types import Finished\n",  # allowed by rank, never by design
        "protocols/common/wire.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from kinetic.protocols.common.codec import Codec\n",
        "protocols/common/codec.py": "def encode():\n    from .wire import x\n",
        "errors.py": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def test_the_checks_catch_a_circle_and_an_upward_import(broken_package: Path) -> None:
    graph = import_graph(broken_package)
    assert graph["kinetic.protocols.common.codec"] == {"kinetic.protocols.common.wire"}
    assert circles(graph) == [["kinetic.protocols.common.codec", "kinetic.protocols.common.wire"]]
    assert upward_imports(graph) == ["kinetic.engine.types -> kinetic.protocols.common.wire"]
    assert forbidden_imports(graph) == ["kinetic.classroom.outcome -> kinetic.engine.types"]
