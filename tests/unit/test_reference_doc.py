"""The HTTP reference pages (docs/reference/http-<protocol>.md) list exactly what the code serves.

Routes: every route a protocol's router registers appears in its page's route tables, and every
route a page names is served. Fields: each table announced by `<!-- fields: MODULE.CLASS [- BASE] -->`
names exactly the request model's fields (less those of BASE, documented in their own table).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from fastapi import UploadFile
from fastapi.routing import APIRoute
from pydantic import BaseModel

from kinetic.config.settings import ServerSettings
from kinetic.engine.llama import LlamaEngine
from tests.scripted import single_model_app

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
PROTOCOLS = sorted(p.parent.name for p in (ROOT / "kinetic" / "protocols").glob("*/routes.py"))
ROUTE_CELL = re.compile(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`\s]*)`")
FIELDS_MARKER = re.compile(r"<!-- fields: ([\w.]+)(?: - ([\w.]+))? -->")
Route = tuple[str, str]


def routes_of(router_routes: list) -> set[Route]:
    """(method, path) pairs, looking through the routers FastAPI wraps on include."""
    found: set[Route] = set()
    for route in router_routes:
        if hasattr(route, "original_router"):
            found |= routes_of(route.original_router.routes)
        elif isinstance(route, APIRoute):
            found |= {(method, route.path) for method in route.methods if method not in ("HEAD", "OPTIONS")}
    return found


def protocol_routes(protocol: str) -> set[Route]:
    return routes_of(importlib.import_module(f"kinetic.protocols.{protocol}.routes").router.routes)


def documented_routes(page: Path) -> set[Route]:
    lines = [line for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    return {match for line in lines for match in ROUTE_CELL.findall(line.split(" | ")[0])}


def field_tables(page: Path) -> list[tuple[str, str | None, list[str]]]:
    """(model, base or None, names in the table) for each marked table of a page."""
    lines = page.read_text(encoding="utf-8").splitlines()
    tables = []
    for index, line in enumerate(lines):
        marker = FIELDS_MARKER.fullmatch(line.strip())
        if not marker:
            continue
        names = []
        for row in lines[index + 3:]:  # skip the header and the |---| rule
            if not row.startswith("| "):
                break
            names.append(row.split(" | ")[0].strip("| `"))
        tables.append((marker.group(1), marker.group(2), names))
    return tables


def model_class(dotted: str) -> type[BaseModel]:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(f"kinetic.protocols.{module}"), name)


def wire_names(model: type[BaseModel]) -> set[str]:
    return {info.alias or name for name, info in model.model_fields.items()}


def test_every_protocol_has_a_reference_page() -> None:
    assert set(PROTOCOLS) >= {"openai", "llamacpp", "anthropic"}
    for protocol in PROTOCOLS:
        assert (REFERENCE / f"http-{protocol}.md").is_file(), f"docs/reference/http-{protocol}.md is missing"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_reference_page_lists_exactly_the_protocols_routes(protocol: str) -> None:
    served = protocol_routes(protocol)
    documented = documented_routes(REFERENCE / f"http-{protocol}.md")
    assert served, f"no routes found in kinetic.protocols.{protocol}.routes"
    assert not served - documented, f"served but not in http-{protocol}.md: {sorted(served - documented)}"
    assert not documented - served, f"in http-{protocol}.md but not served: {sorted(documented - served)}"


def web_routes() -> set[Route]:
    """The server's own pages (kinetic/web), documented in docs/classroom.md."""
    return routes_of(importlib.import_module("kinetic.web.routes").router.routes)


def test_the_app_serves_exactly_the_protocol_routers() -> None:
    """So a router the app includes without a protocol package (or the reverse) is noticed."""
    app = single_model_app(ServerSettings(), LlamaEngine(Path("unused.gguf")))
    assert routes_of(app.routes) == set().union(*(protocol_routes(p) for p in PROTOCOLS)) | web_routes()


def test_the_web_pages_doc_names_every_web_route() -> None:
    text = (ROOT / "docs" / "classroom.md").read_text(encoding="utf-8")
    for _, path in web_routes():
        assert path.replace("{name}", "") in text, path


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_field_tables_name_exactly_the_models_fields(protocol: str) -> None:
    tables = field_tables(REFERENCE / f"http-{protocol}.md")
    assert tables, f"http-{protocol}.md has no <!-- fields: ... --> table"
    for model, base, names in tables:
        assert len(names) == len(set(names)), f"{model}: a field is listed twice"
        expected = wire_names(model_class(model)) - (wire_names(model_class(base)) if base else set())
        assert not expected - set(names), f"{model}: not documented: {sorted(expected - set(names))}"
        assert not set(names) - expected, f"{model}: documented but not a field: {sorted(set(names) - expected)}"


def test_every_request_model_of_a_route_has_a_field_table() -> None:
    """A route whose body is a pydantic model has that model documented on its protocol's page."""
    documented = {model_class(model) for protocol in PROTOCOLS
                  for model, _, _ in field_tables(REFERENCE / f"http-{protocol}.md")}
    for protocol in PROTOCOLS:
        router = importlib.import_module(f"kinetic.protocols.{protocol}.routes").router
        for route in router.routes:
            if isinstance(route, APIRoute) and route.body_field is not None:
                body = route.body_field.field_info.annotation
                # a model that only renames another (same fields, e.g. the input_tokens body) counts as documented
                same_fields = any(issubclass(body, d) and wire_names(body) == wire_names(d) for d in documented)
                # a multipart body FastAPI assembles from a form model and the uploads: the form model is documented
                parts = [info.annotation for info in body.model_fields.values()]
                form = any(part in documented for part in parts) and all(
                    part in documented or part is UploadFile for part in parts)
                assert body in documented or same_fields or form, f"{route.path}: {body.__name__} has no field table"
