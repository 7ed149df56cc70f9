"""The layering docs/architecture.md describes, checked on the source: protocols never import each
other, translators never reach an engine or the service, and only the llama backend imports
llama_cpp at module level."""

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
# events back, so it imports none of what holds a model: the llama backend, the chat layer's
# preparation, the Service or the registry above the engines, or the app.
NOT_FOR_TRANSLATORS = ("kinetic.engine.llama", "llama_cpp", "kinetic.chat.prepare", "kinetic.service",
                       "kinetic.router", "kinetic.app", "kinetic.deps")


@pytest.mark.parametrize("protocol", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="llamacpp/translate.py's props() takes the Service "
                                            "and reads its engine and settings; issue 24 part 1 (a backend that "
                                            "describes itself) removes the import"))
    if p == "llamacpp" else p for p in PROTOCOLS])
def test_translators_never_reach_an_engine_or_the_service(protocol: str) -> None:
    # translate.py and the modules it is split into (Ollama's replies.py, model_facts.py): all but the routes
    for path in (PACKAGE / "protocols" / protocol).glob("*.py"):
        if path.name != "routes.py":
            for name in module_imports(path):
                assert not name.startswith(NOT_FOR_TRANSLATORS), (path, name)


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
    for layer in ("kinetic/transport.py", "kinetic/classroom/", "kinetic/chat/", "kinetic/router/", "kinetic/engine/"):
        assert f"`{layer}`" in page, layer
