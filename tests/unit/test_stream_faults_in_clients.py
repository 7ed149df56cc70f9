"""What a client sees of two faults a real model cannot be made to produce on demand, on the real app
served by uvicorn over the scripted engine (tests/scripted.py): a model still loading is a 503 in each
protocol's envelope, and a stream that fails midway ends each protocol's way, the text before the
failure delivered, in the openai, anthropic and ollama client libraries and on the wire.
(tests/unit/test_faults.py checks each stream's last lines and the one-second bound.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from kinetic.errors import ServerError
from tests.error_envelopes import ROUTES, check_envelope
from tests.scripted import ScriptedEngine, ScriptedServer, wait_until_ready


@pytest.mark.parametrize("protocol", ROUTES)
def test_loading_is_503(protocol: str) -> None:
    with ScriptedServer(ScriptedEngine(["x"])) as server:  # never loads until the test ends
        path, good = ROUTES[protocol]
        r = httpx.post(server.url + path, json=good)
        assert r.status_code == 503
        check_envelope(protocol, 503, r.json())
        assert httpx.get(server.url + "/health").status_code == 503


@pytest.fixture()
def failing_server() -> Iterator[ScriptedServer]:
    engine = ScriptedEngine(["Hel", "lo", ServerError("llama_decode failed with status 1 (KV cache full?)")])
    engine.loaded.set()
    with ScriptedServer(engine, alias="m") as server:  # the Ollama routes check the model's name
        wait_until_ready(server.url)
        yield server


def sse_lines(url: str, path: str, body: dict[str, Any]) -> list[str]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        return [line for line in response.iter_lines() if line]


def test_openai_stream_failing_midway_sends_the_error_then_done(failing_server: ScriptedServer) -> None:
    lines = sse_lines(failing_server.url, *ROUTES["openai"])
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2].removeprefix("data: "))
    assert error["error"]["code"] == 500 and "KV cache" in error["error"]["message"]
    client = openai.OpenAI(base_url=failing_server.url + "/v1", api_key="x", max_retries=0)
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    received = ""
    with pytest.raises(openai.APIError, match="KV cache"):
        for chunk in stream:
            received += chunk.choices[0].delta.content or "" if chunk.choices else ""
    assert received == "Hello"  # what was generated before the failure arrived


def test_anthropic_stream_failing_midway_sends_an_error_event(failing_server: ScriptedServer) -> None:
    lines = sse_lines(failing_server.url, *ROUTES["anthropic"])
    assert lines[-2] == "event: error"
    assert json.loads(lines[-1].removeprefix("data: "))["error"]["type"] == "api_error"
    client = anthropic.Anthropic(base_url=failing_server.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIError, match="KV cache"):
        with client.messages.stream(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]) as s:
            for _ in s.text_stream:
                pass


def test_llamacpp_stream_failing_midway_ends_with_the_error(failing_server: ScriptedServer) -> None:
    lines = sse_lines(failing_server.url, *ROUTES["llamacpp"])
    contents = [json.loads(line.removeprefix("data: ")).get("content") for line in lines[:-1]]
    assert "".join(c or "" for c in contents) == "Hello"
    assert json.loads(lines[-1].removeprefix("data: "))["error"]["code"] == 500


def test_ollama_stream_failing_midway_ends_with_an_error_line(failing_server: ScriptedServer) -> None:
    lines = sse_lines(failing_server.url, *ROUTES["ollama"])  # NDJSON lines: one object each
    objects = [json.loads(line) for line in lines]
    assert "".join(o["message"]["content"] for o in objects[:-1]) == "Hello"
    assert objects[-1] == {"error": "llama_decode failed with status 1 (KV cache full?)"}
    client = ollama.Client(host=failing_server.url)
    received = ""
    with pytest.raises(ollama.ResponseError, match="KV cache"):
        for chunk in client.chat(model="m", messages=[{"role": "user", "content": "hi"}], stream=True):
            received += chunk.message.content or ""
    assert received == "Hello"


def test_responses_stream_failing_midway_ends_with_an_error_event(failing_server: ScriptedServer) -> None:
    client = openai.OpenAI(base_url=failing_server.url + "/v1", api_key="x", max_retries=0)
    events = list(client.responses.create(model="m", input="hi", stream=True))
    assert [e.type for e in events][:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    error = events[-1]
    assert error.type == "error" and error.code == "server_error" and "KV cache" in error.message
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello"
    assert not any(e.type == "response.completed" for e in events)
