"""Faults a real model cannot be made to produce on demand, on the real app served by uvicorn over the
scripted engine (tests/scripted.py): an engine that fails or is closed mid-stream ends each protocol's
stream its own way within a second; and the listed bugs of issue 22, each with its test."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from kinetic.backends.config import EngineConfig, ModelConfig
from kinetic.backends.model_file import read_model_file
from kinetic.backends.sources import ModelSpec, UpstreamSpec
from kinetic.backends.upstream.backend import UpstreamBackend
from kinetic.backends.upstream.body import ForwardRequest
from kinetic.config.settings import ServerSettings
from kinetic.errors import RateLimitError, ServerError, UnavailableError
from kinetic.protocols.common.streaming import merge_frames
from kinetic.scheduling.inflight import InFlight
from tests.scripted import ScriptedEngine, ScriptedServer, single_model_backend

CHAT = [{"role": "user", "content": "hi"}]
ERROR = "{error}"  # in an ending: the line that carries the error, as JSON after the text before it


@dataclass(frozen=True)
class Stream:
    """A protocol's streamed request, and the last lines its stream ends with when it fails: each line of
    `ending` is the very text, or holds ERROR where the error's JSON is, its message at `message_at`."""

    path: str
    body: dict[str, Any]
    ending: tuple[str, ...]
    message_at: tuple[str, ...]


STREAMS = {
    "openai": Stream("/v1/chat/completions", {"messages": CHAT, "stream": True},
                     (f"data: {ERROR}", "data: [DONE]"), ("error", "message")),
    "anthropic": Stream("/v1/messages", {"model": "m", "messages": CHAT, "max_tokens": 8, "stream": True},
                        ("event: error", f"data: {ERROR}"), ("error", "message")),
    "responses": Stream("/v1/responses", {"input": "hi", "stream": True},
                        ("event: error", f"data: {ERROR}"), ("message",)),
    "ollama": Stream("/api/chat", {"model": "m", "messages": CHAT, "stream": True}, (ERROR,), ("error",)),
}


def loaded_engine(script: list[Any], **kwargs: Any) -> ScriptedEngine:
    loaded = threading.Event()
    loaded.set()
    return ScriptedEngine(script, loaded=loaded, **kwargs)


def error_of(protocol: str, lines: list[str]) -> str:
    """The error a failed stream ended with, its last lines checked to be that protocol's STREAMS ending."""
    stream = STREAMS[protocol]
    assert len(lines) >= len(stream.ending), lines
    messages = []
    for expected, line in zip(stream.ending, lines[-len(stream.ending):], strict=True):
        before = expected.removesuffix(ERROR)
        if before == expected:
            assert line == expected, lines
            continue
        assert line.startswith(before), lines
        found: Any = json.loads(line.removeprefix(before))
        for key in stream.message_at:
            found = found[key]
        messages.append(found)
    assert len(messages) == 1 and isinstance(messages[0], str), lines
    return messages[0]


def read_stream(url: str, protocol: str, opened: threading.Event | None = None) -> tuple[list[str], float]:
    stream = STREAMS[protocol]
    lines: list[str] = []
    with httpx.stream("POST", url + stream.path, json=stream.body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.strip():
                lines.append(line)
                if opened is not None and len(lines) >= 2:
                    opened.set()
    return lines, time.monotonic()


@pytest.mark.parametrize("protocol", list(STREAMS))
def test_an_engine_error_mid_stream_ends_the_stream_in_the_protocols_way(protocol: str) -> None:
    engine = loaded_engine(["Hel", "lo", ServerError("generation failed: llama_decode failed")])
    with ScriptedServer(engine, alias="m") as server:
        lines, _ = read_stream(server.url, protocol)
        assert "llama_decode failed" in error_of(protocol, lines)
        assert httpx.get(server.url + "/health").status_code == 200  # still serving


@pytest.mark.parametrize("protocol", list(STREAMS))
def test_closing_the_engine_ends_an_open_stream_within_a_second(protocol: str) -> None:
    engine = loaded_engine(["Hel", "lo"], stall=True)
    with ScriptedServer(engine, alias="m") as server:
        opened = threading.Event()
        result: dict[str, Any] = {}
        reader = threading.Thread(target=lambda: result.update(zip(("lines", "ended"),
                                                                   read_stream(server.url, protocol, opened),
                                                                   strict=False)))
        reader.start()
        assert opened.wait(10)
        closed = time.monotonic()
        engine.close(UnavailableError("the model was unloaded"))
        reader.join(10)
        print(f"engine closed: the {protocol} stream ended after {result['ended'] - closed:.2f} s")
        assert result["ended"] - closed < 1.0
        assert "unloaded" in error_of(protocol, result["lines"])


def test_merge_frames_closes_while_its_streams_are_running() -> None:
    """A client leaving a list of prompts closes the merge while each pump is inside its stream:
    aclose() on such a generator raised RuntimeError (asynchronous generator is already running)."""
    closed: list[int] = []

    async def slow(index: int) -> AsyncIterator[bytes]:
        try:
            yield f"{index}-first".encode()
            await asyncio.sleep(60)
            yield b"never"
        finally:
            closed.append(index)

    async def leave_early() -> None:
        merged = merge_frames([slow(0), slow(1)])
        assert (await merged.__anext__()).endswith(b"first")
        await asyncio.sleep(0.05)  # both pumps are now waiting inside their streams
        await merged.aclose()

    asyncio.run(leave_early())
    assert sorted(closed) == [0, 1]


def test_a_failed_digest_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    service = single_model_backend(ServerSettings(), loaded_engine([]), "scripted")
    service.engine.load()
    calls: list[int] = []

    def flaky(path: Path, busy: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("disk hiccup")
        return "digest"

    monkeypatch.setattr("kinetic.backends.local.read_model_file", flaky)

    async def twice() -> list[Any]:
        results: list[Any] = []
        for _ in range(2):
            try:
                results.append(await service.model_file())
            except OSError as exc:
                results.append(exc)
        return results

    first, second = asyncio.run(twice())
    assert isinstance(first, OSError) and second == "digest"  # answered once the read works again


def test_hashing_goes_on_while_the_engine_is_busy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINETIC_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"\0" * (3 << 20))
    done = threading.Event()
    thread = threading.Thread(target=lambda: (read_model_file(model, busy=lambda: True), done.set()), daemon=True)
    thread.start()
    assert done.wait(5), "hashing waited for an engine that is always busy (a class under load)"


def test_infill_carries_the_clients_name(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-alice alice\n", encoding="utf-8")
    engine = loaded_engine(["x"])
    engine.info = replace(engine.info, fim_tokens={"pre": 1, "suf": 2, "mid": 3})
    with ScriptedServer(engine, api_key_file=str(keys)) as server:
        answer = httpx.post(server.url + "/infill", headers={"Authorization": "Bearer sk-alice"},
                            json={"input_prefix": "def f(", "input_suffix": ")", "n_predict": 4})
        assert answer.status_code == 200, answer.text
    assert [r.client for r in engine.requests] == ["alice"]  # not one shared bucket for fairness and limits


# ------------------------------------------------------------------------------ an upstream engine

@pytest.fixture()
def upstream_url() -> Any:
    """The real app over a scripted engine that keeps each answer open: an upstream to forward to."""
    with ScriptedServer(loaded_engine(["a", "b"], stall=True), alias="m") as server:
        yield server.url + "/v1"


def upstream_backend(url: str, *, connections: int = 4, in_flight: InFlight | None = None) -> UpstreamBackend:
    """Not loaded yet: `await backend.load()` on the loop that runs the test."""
    spec = ModelSpec(name="remote", upstreams=(UpstreamSpec(url=url, model="m"),))
    return UpstreamBackend(spec, ModelConfig(engine=EngineConfig(n_parallel=connections)), in_flight=in_flight)


def forward(client: str) -> ForwardRequest:
    return ForwardRequest.of("/chat/completions", {"model": "m", "messages": CHAT, "stream": True}, client=client,
                             priority=0)


def test_a_prompt_list_refused_by_the_key_limit_leaks_nothing(upstream_url: str) -> None:
    """The second prompt of a list refused with 429 cancels the first one's pump before it ever ran;
    its cleanup must still give back the turn, the HTTP response and the key's count."""
    in_flight = InFlight(1)
    engine = upstream_backend(upstream_url, in_flight=in_flight)

    async def refused_list() -> None:
        await engine.load()
        with pytest.raises(RateLimitError):
            await engine.start_together([forward("alice"), forward("alice")])
        await asyncio.sleep(0.2)  # the cancelled pump's cleanup
        assert in_flight.counts() == {} and engine.stats().requests_processing == 0
        assert [m.outstanding for m in engine.pool.members] == [0]
        for _ in range(5):  # more lists than connections: none waits forever
            with pytest.raises(RateLimitError):
                await asyncio.wait_for(engine.start_together([forward("alice"), forward("alice")]), 5)
        engine.close()

    asyncio.run(refused_list())


def test_closing_an_upstream_engine_ends_its_streams_fails_the_waiting_and_closes_its_client(
        upstream_url: str) -> None:
    engine = upstream_backend(upstream_url, connections=1)

    async def close_mid_stream() -> None:
        await engine.load()
        running = await engine.start(forward("alice"))
        waiting = asyncio.ensure_future(engine.start(forward("bob")))  # the one connection is taken
        events = running.events()
        await events.__anext__()
        await asyncio.sleep(0.1)
        assert engine.stats().requests_deferred == 1
        client = engine.pool.client
        closed = time.monotonic()
        engine.close(UnavailableError("model 'remote' was unloaded"))
        with pytest.raises(UnavailableError):
            async for _ in events:
                pass
        with pytest.raises(UnavailableError):
            await waiting
        assert time.monotonic() - closed < 1.0
        await asyncio.sleep(0.1)
        assert client.is_closed  # UpstreamPool.close, at last
        assert engine.stats().requests_processing == 0 and engine.stats().requests_deferred == 0

    asyncio.run(close_mid_stream())
