"""The layering docs/architecture.md describes, checked on the source: protocols never import each
other, translators never reach an engine or a backend, routes never touch an engine, nothing probes
an engine's or a backend's capabilities by attribute, and only the llama engine imports llama_cpp
at module level."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
                       "kinetic.model_registry", "kinetic.app", "kinetic.deps")


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


def test_no_route_touches_an_engine() -> None:
    """Routes ask the model's backend (kinetic/backends/base.py), never the engine under it."""
    assert len(route_modules()) >= 6
    for path in route_modules():
        assert engine_touches(path) == [], path


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


def test_only_the_llama_backend_imports_llama_cpp_at_module_level() -> None:
    for path in PACKAGE.rglob("*.py"):
        if "engine/llama" in path.as_posix():
            continue
        assert not any(n.split(".")[0] == "llama_cpp" for n in module_imports(path, top_level_only=True)), path


def test_the_architecture_page_is_in_the_site_and_names_every_protocol() -> None:
    root = PACKAGE.parent
    page = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert "architecture.md" in (root / "mkdocs.yml").read_text(encoding="utf-8")
    for protocol in PROTOCOLS:
        assert f"`{protocol}`" in page or f"protocols/{protocol}/" in page, protocol
    for layer in ("kinetic/transport.py", "kinetic/classroom/", "kinetic/chat/", "kinetic/model_registry/",
                  "kinetic/engine/"):
        assert f"`{layer}`" in page, layer


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
