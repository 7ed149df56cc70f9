"""A route's model is leased for the whole request, its stream included, and given back however the request ends
(deps.get_served: the request's record returns the lease when the ledger middleware is done with it); and no request
gets through before the readiness line."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx
from fastapi import FastAPI

from kinetic.config.settings import ServerSettings
from kinetic.errors import ServerError
from kinetic.model_registry.deps import server_state
from kinetic.model_registry.registry import ModelRegistry
from kinetic.server.app import create_app, start_models
from tests.scripted import ReadyClient, ScriptedEngine, ScriptedServer, single_model_backend


def wait_for(done: Callable[[], bool]) -> bool:
    """Whether `done` came true within a second (the server thread returns the lease after its last write)."""
    deadline = time.monotonic() + 1
    while not done() and time.monotonic() < deadline:
        time.sleep(0.005)
    return done()


def _client(engine: ScriptedEngine) -> tuple[ReadyClient, ModelRegistry]:
    engine.loaded.set()
    registry = ModelRegistry.single(ServerSettings(), single_model_backend(ServerSettings(), engine, "scripted"))
    return ReadyClient(create_app(registry)), registry


def test_the_lease_lasts_the_stream_and_ends_with_it() -> None:
    engine = ScriptedEngine(["a", "b"], stall=True)  # the stream stays open until the engine is closed
    engine.loaded.set()
    with ScriptedServer(engine) as server:
        app = server.server.config.app
        assert isinstance(app, FastAPI)
        entry = server_state(app).registry.only
        with httpx.stream("POST", server.url + "/v1/completions", json={"prompt": "x", "stream": True},
                          timeout=10) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ") and entry.leases == 1  # held while the stream is open
            engine.close(ServerError("unloaded"))
            rest = [line for line in lines if line]
        assert any("unloaded" in line for line in rest) and wait_for(lambda: entry.leases == 0)


def test_the_lease_ends_with_a_failed_request() -> None:
    client, registry = _client(ScriptedEngine(["a", ServerError("the engine failed")]))
    entry = registry.only
    with client:
        streamed = client.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert "the engine failed" in streamed.text and entry.leases == 0
        whole = client.post("/v1/completions", json={"prompt": "x"})
        assert whole.status_code == 500 and json.loads(whole.text)["error"]["message"] == "the engine failed"
        assert entry.leases == 0
        refused = client.post("/v1/completions", json={"prompt": "x", "n_probs": "many"})
        assert refused.status_code == 400 and entry.leases == 0


def test_requests_wait_for_the_readiness_line() -> None:
    """The load's end wakes the app's start a loop turn or two later: until "listening on" is out, the gate still
    answers "Loading model" (a /health in between once answered 200 before the line a lab waits for)."""
    engine = ScriptedEngine([])
    engine.loaded.set()
    registry = ModelRegistry.single(ServerSettings(), single_model_backend(ServerSettings(), engine, "scripted"))
    app = create_app(registry)
    seen: list[bool] = []

    async def start() -> None:
        await start_models(registry, app, lambda: seen.append(registry.ready), None)

    asyncio.run(start())
    assert seen == [False] and registry.ready  # not yet while the line is printed, at once after it
