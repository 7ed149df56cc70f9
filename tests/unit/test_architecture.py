"""The layering docs/architecture.md describes, checked on the source: protocols never import each
other, translators never reach an engine or a backend, routes never touch an engine, nothing probes
an engine's or a backend's capabilities by attribute, and only the llama engine imports llama_cpp
at module level."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from kinetic.engine.base import Tokenizer
from tests.unit.test_import_layers import RANK

PACKAGE = Path(__file__).resolve().parents[2] / "kinetic"
PROTOCOLS = sorted(p.name for p in (PACKAGE / "protocols").iterdir() if p.is_dir() and p.name != "__pycache__")


def module_imports(path: Path, *, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("protocol", [p for p in PROTOCOLS if p != "common"])
def test_protocols_import_no_other_protocol(protocol: str) -> None:
    others = [p for p in PROTOCOLS if p not in (protocol, "common")]
    for path in (PACKAGE / "protocols" / protocol).glob("*.py"):
        for name in module_imports(path):
            assert not any(name.startswith(f"kinetic.protocols.{other}") for other in others), (path, name)


# A translator is pure (docs/architecture.md): it maps wire models to neutral requests and engine
# events back, so it imports none of what holds a model: the llama engine, the chat layer's
# preparation, the backends or the registry above the engines, or the app.
NOT_FOR_TRANSLATORS = ("kinetic.engine.llama", "llama_cpp", "kinetic.chat.prepare", "kinetic.backends",
                       "kinetic.model_registry", "kinetic.server.app", "kinetic.model_registry.deps")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_translators_never_reach_an_engine_or_a_backend(protocol: str) -> None:
    # translate.py and the modules it is split into (Ollama's replies.py, model_facts.py): all but the routes
    for path in (PACKAGE / "protocols" / protocol).glob("*.py"):
        if path not in route_modules():
            for name in module_imports(path):
                assert not name.startswith(NOT_FOR_TRANSLATORS), (path, name)


def route_modules() -> list[Path]:
    return sorted([*(PACKAGE / "protocols").glob("*/routes.py"), *(PACKAGE / "protocols").glob("*/*_routes.py"),
                   *(PACKAGE / "protocols").glob("*/cors_proxy.py"), PACKAGE / "web" / "routes.py"])


def engine_touches(path: Path) -> list[int]:
    """Lines where the module reads an attribute named `engine` (`backend.engine`, `service.engine`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "engine"]


# What an engine is to the layers above it: a route that reaches one of these, by any name, touches it
ENGINE_TYPES = ("kinetic.engine.base.Engine", "kinetic.engine.base.Tokenizer")


def member_types(cls: type, scope: tuple[str, ...]) -> dict[str, Any]:
    """The declared types of a class's public attributes, and what its public methods and properties return."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith(scope):
            found.update({k: v for k, v in typing.get_type_hints(klass).items() if not k.startswith("_")})
    for name, value in vars(cls).items():
        function = value.fget if isinstance(value, property) else value
        if not name.startswith("_") and callable(function):
            found[name] = typing.get_type_hints(function).get("return")
    return found


def engine_paths(root: type, scope: tuple[str, ...] = ("kinetic.",)) -> list[str]:
    """Each way from `root`'s members, through the kinetic types they hold or return, to an engine."""
    paths: list[str] = []
    seen: set[type] = set()

    def visit(hint: Any, path: str) -> None:
        for arg in typing.get_args(hint):
            visit(arg, path)
        origin = typing.get_origin(hint) or hint
        if not isinstance(origin, type) or not origin.__module__.startswith(scope):
            return
        if f"{origin.__module__}.{origin.__qualname__}" in ENGINE_TYPES or origin.__module__.startswith(
                "kinetic.engine.llama"):
            paths.append(path)
        elif origin not in seen:
            seen.add(origin)
            for name, member in member_types(origin, scope).items():
                visit(member, f"{path}.{name}")

    visit(root, root.__name__)
    return paths


def test_no_route_touches_an_engine() -> None:
    """Routes ask the model's backend (kinetic/backends/base.py), never the engine under it: no route reads
    an `.engine` or imports the engine's interface, and nothing a route is handed (the backend, the
    registry and its entries, the model as served, each role), nor anything they hold or return, is an engine by
    another name."""
    from kinetic.backends.base import LACKS, ModelBackend
    from kinetic.model_registry.registry import ModelEntry, ModelRegistry
    from kinetic.model_registry.served import Served

    assert len(route_modules()) >= 6
    for path in route_modules():
        assert engine_touches(path) == [], path
        assert not any(n.startswith(("kinetic.engine.base", "kinetic.engine.llama")) for n in module_imports(path))
    for handed in (ModelBackend, *LACKS, Served, ModelRegistry, ModelEntry):  # LACKS: every role a route asks for
        assert engine_paths(handed) == [], handed


class ExampleBackend:
    name: str

    @property
    def tokenizer(self) -> Tokenizer: ...


class ExampleHolder:
    backends: dict[str, list[ExampleBackend]]


def test_the_engine_check_finds_an_engine_by_another_name() -> None:
    assert engine_paths(ExampleHolder, ("kinetic.", __name__)) == ["ExampleHolder.backends.tokenizer"]


# The names a module holds an engine or a backend by: what it must not probe with getattr/hasattr.
MODEL_HOLDERS = ("engine", "backend", "service", "model")


def probed_holder(node: ast.Call) -> str | None:
    """`getattr(engine, ...)`, `hasattr(self.backend, ...)`: the name probed, when it holds a model."""
    if not (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") and node.args):
        return None
    target = node.args[0]
    name = target.attr if isinstance(target, ast.Attribute) else target.id if isinstance(target, ast.Name) else ""
    return name if any(name == h or name.endswith("_" + h) for h in MODEL_HOLDERS) else None


def test_no_module_probes_an_engines_or_a_backends_capabilities_by_attribute() -> None:
    """What an engine or a backend can do is declared (the Engine protocol, backends' Capabilities)."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        probes = [(node.lineno, name) for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and (name := probed_holder(node)) is not None]
        assert probes == [], path


def test_the_checks_catch_what_they_name(tmp_path: Path) -> None:
    """Each check fails on a module that breaks its rule."""
    bad = tmp_path / "routes.py"
    bad.write_text("async def r(service):\n    n = service.engine.n_slots\n"
                   "    many = getattr(service.engine, 'submit_many', None)\n    return hasattr(backend, 'x')\n")
    assert engine_touches(bad) == [2, 3]
    calls = [n for n in ast.walk(ast.parse(bad.read_text())) if isinstance(n, ast.Call)]
    assert sorted(filter(None, map(probed_holder, calls))) == ["backend", "engine"]


# Run in a fresh interpreter where `import llama_cpp` fails: every module outside kinetic/engine/llama
# imports, and none of them pulls the llama engine in (a module-level import of it, direct or through
# another module, would load llama.cpp's libraries at startup or fail where llama_cpp is not installed).
LLAMA_CPP_BLOCKED = """
import importlib, json, sys
sys.modules["llama_cpp"] = None
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception as err:
        failed[name] = repr(err)
loaded = sorted(m for m in sys.modules if m.startswith("kinetic.engine.llama"))
print(json.dumps({"failed": failed, "loaded": loaded}))
"""


def modules_outside_the_llama_engine() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[1:3] != ("engine", "llama") and parts[-1] != "__main__":
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imports_without_llama_cpp(names: list[str]) -> dict[str, Any]:
    found = subprocess.run([sys.executable, "-c", LLAMA_CPP_BLOCKED, json.dumps(names)], capture_output=True,
                           text=True, check=True, cwd=PACKAGE.parent, timeout=120)
    result: dict[str, Any] = json.loads(found.stdout.splitlines()[-1])
    return result


def test_only_the_llama_backend_imports_llama_cpp_at_module_level() -> None:
    names = modules_outside_the_llama_engine()
    assert "kinetic.server.app" in names and "kinetic.cli" in names and "kinetic.model_registry.factory" in names
    assert imports_without_llama_cpp(names) == {"failed": {}, "loaded": []}


class MkdocsLoader(yaml.SafeLoader):
    """mkdocs.yml's `!!python/name:` tags name functions of the site's plugins: read as None here."""


MkdocsLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def nav_pages(entries: Any) -> list[str]:
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [page for entry in entries for page in nav_pages(entry)]
    if isinstance(entries, dict):
        return [page for value in entries.values() for page in nav_pages(value)]
    return []


def layer_places(page: str) -> dict[str, list[str]]:
    """The architecture page's layer table: each layer and the kinetic/ paths its row says it lives in."""
    rows = [line for line in page.splitlines() if line.startswith("| ") and "`kinetic/" in line]
    places = {}
    for row in rows:
        layer, where = (cell.strip() for cell in row.strip("|").split("|")[:2])
        places[layer] = re.findall(r"`(kinetic/[\w/.]*)[^`]*`", where)  # `kinetic/protocols/<protocol>/`: the folder
    return places


def unplaced_modules(places: dict[str, list[str]]) -> list[str]:
    """Modules of kinetic/ that no layer of the table holds (a folder holds what is under it)."""
    held = [place for paths in places.values() for place in paths]
    modules = [path.relative_to(PACKAGE.parent).as_posix() for path in PACKAGE.rglob("*.py")
               if path.name not in ("__init__.py", "__main__.py")]
    return sorted(m for m in modules if not any(m == p or (p.endswith("/") and m.startswith(p)) for p in held))


def rows_out_of_layer_order(places: dict[str, list[str]]) -> list[str]:
    """The table's rows whose places sit above an earlier row's in the import layers (test_import_layers),
    and the layers no row names: the page draws the layers top-down, as the imports run."""
    ranks = {layer: [RANK[p.split("/")[1].removesuffix(".py")] for p in paths] for layer, paths in places.items()}
    wrong, lowest = [], 0
    for layer, row in ranks.items():
        if row and min(row) < lowest:
            wrong.append(layer)
        lowest = max([lowest, *row])
    named = {p.split("/")[1].removesuffix(".py") for paths in places.values() for p in paths}
    return wrong + sorted(set(RANK) - named - {"__main__", "__init__"})


def test_the_architecture_page_is_in_the_site_and_places_every_module() -> None:
    """The page is in the site's navigation; its layer table holds every module of kinetic/ in a layer, each
    place it names exists, its rows run down the import layers, and it names every protocol (a module that
    moves, or a new layer, fails here)."""
    root = PACKAGE.parent
    page = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    site = yaml.load((root / "mkdocs.yml").read_text(encoding="utf-8"), Loader=MkdocsLoader)  # noqa: S506
    assert "architecture.md" in nav_pages(site["nav"])
    places = layer_places(page)
    assert len(places) >= 6, places
    missing = [p for paths in places.values() for p in paths if not (root / p).exists()]
    assert missing == [] and unplaced_modules(places) == []
    assert rows_out_of_layer_order(places) == []
    for protocol in PROTOCOLS:
        assert f"`{protocol}`" in page or f"protocols/{protocol}/" in page, protocol


def test_the_page_check_catches_a_module_out_of_place() -> None:
    table = "| Layer | Where | What |\n|---|---|---|\n| Engines | `kinetic/engine/`, `kinetic/server/app.py` | x |\n"
    places = layer_places(table)
    assert places == {"Engines": ["kinetic/engine/", "kinetic/server/app.py"]}
    unplaced = unplaced_modules(places)
    assert "kinetic/server/gate.py" in unplaced and "kinetic/backends/base.py" in unplaced
    upside_down = layer_places("| Layer | Where | What |\n|---|---|---|\n| Engines | `kinetic/engine/` | x |\n"
                               "| Server | `kinetic/server/` | y |\n")
    assert rows_out_of_layer_order(upside_down)[0] == "Server"
    assert not any(m.startswith("kinetic/engine/") or m == "kinetic/server/app.py" for m in unplaced)


MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def test_modules_and_functions_stay_small() -> None:
    """No module of kinetic/ over 500 lines and no function over 80: past that, split by concern."""
    long_modules, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        name = str(path.relative_to(PACKAGE.parent))
        if source.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{name} ({source.count(chr(10))} lines)")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.lineno} {node.name} ({length} lines)")
    assert not long_modules and not long_functions, long_modules + long_functions
