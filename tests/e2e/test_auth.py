"""--api-key: the exact 401 body, Bearer and x-api-key, /health public, no route outside the gate."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi.routing import APIRoute

from kinetic.config.settings import ServerSettings
from kinetic.engine.llama import LlamaEngine
from tests.scripted import single_model_app
from tests.server import KEYED_SERVER_KEY, KineticServer

KEY = KEYED_SERVER_KEY  # the session's keyed_server (tests/conftest.py)
UNAUTHORIZED = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}


def test_missing_or_wrong_key_gets_exact_401(keyed_server: KineticServer) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"x-api-key": "wrong"}):
        r = httpx.get(keyed_server.url + "/v1/models", headers=headers)
        assert r.status_code == 401 and r.json() == UNAUTHORIZED


def test_health_stays_public(keyed_server: KineticServer) -> None:
    r = httpx.get(keyed_server.url + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_openai_sdk_without_key_raises_authentication_error(keyed_server: KineticServer) -> None:
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="no-key-required", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert str(info.value) == f"Error code: 401 - {UNAUTHORIZED}"


def test_bearer_and_x_api_key_both_work(keyed_server: KineticServer) -> None:
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, max_retries=0)
    r = client.chat.completions.create(model="local", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.usage.completion_tokens <= 2
    models = httpx.get(keyed_server.url + "/v1/models", headers={"x-api-key": KEY})
    assert models.status_code == 200 and models.json()["data"][0]["object"] == "model"


# The web pages and their assets are public as in llama-server (kinetic/web/routes.py): what they
# fetch is not. /dashboard/stats is behind the key (and an admin key: tests/e2e/test_web_pages.py).
PUBLIC = {"/health", "/v1/health", "/", "/dashboard", "/ui/x", "/ui/config.json"}
KEY_HEADERS = ({"Authorization": f"Bearer {KEY}"}, {"Authorization": KEY}, {"X-Api-Key": KEY})


def registered_routes(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(method, path) of every route the app serves, through included routers."""
    for route in routes:
        if hasattr(route, "original_router"):  # FastAPI 0.165+ keeps an included router whole
            yield from registered_routes(route.original_router.routes, prefix + route.include_context.prefix)
        elif isinstance(route, APIRoute):
            for method in sorted(route.methods):
                yield method, re.sub(r"\{[^}]*\}", "x", prefix + route.path)
        else:  # a Mount (static files) or a plain Route: decide whether it is public, then list it here
            raise AssertionError(f"unknown route type {route!r}: teach this test about it")


def app_routes() -> list[tuple[str, str]]:
    return sorted(set(registered_routes(single_model_app(ServerSettings(), LlamaEngine(Path("unused.gguf"))).routes)))


def test_every_route_but_health_is_behind_the_key(keyed_server: KineticServer) -> None:
    routes = app_routes()
    assert ("POST", "/v1/chat/completions") in routes and ("GET", "/health") in routes and len(routes) > 15
    for method, path in routes:
        body = {"json": {}} if method in {"POST", "PUT", "PATCH"} else {}
        without = httpx.request(method, keyed_server.url + path, timeout=60, **body)
        if path in PUBLIC:
            assert without.status_code != 401, (method, path)
        else:
            assert without.status_code == 401, (method, path, without.status_code)
        for headers in KEY_HEADERS:
            with_key = httpx.request(method, keyed_server.url + path, headers=headers, timeout=60, **body)
            assert with_key.status_code != 401, (method, path, headers, with_key.text[:200])
