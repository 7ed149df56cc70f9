"""The upstream backend through the real app, its upstream an httpx MockTransport speaking OpenAI's SSE:
the SSE reader takes the whole format, tool calls arrive as structure in every protocol, and what an
upstream cannot do is a 501 that names the route, in the protocol's own error envelope."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from kinetic.backends.config import ModelConfig
from kinetic.backends.sources import ModelSpec, UpstreamSpec
from kinetic.backends.upstream.backend import UpstreamBackend
from kinetic.backends.upstream.stream import sse_chunks
from kinetic.config.settings import ServerSettings
from kinetic.errors import ServerError
from kinetic.model_registry.registry import ModelRegistry
from kinetic.server.app import create_app

CHAT = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def streamed(body: str) -> httpx.Response:
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


def chunks_of(body: str) -> list[dict[str, Any]]:
    async def read() -> list[dict[str, Any]]:
        return [chunk async for chunk in sse_chunks(streamed(body))]

    return asyncio.run(read())


def test_the_sse_reader_takes_the_whole_format() -> None:
    """Multi-line `data:` (joined by newlines), comments, `event:` lines, CRLF line ends, `[DONE]`."""
    body = (": keep-alive comment\r\n\r\n"
            'event: message\r\ndata: {"choices":\r\ndata: [{"delta": {"content": "a"}}]}\r\n\r\n'
            'data: {"choices": [{"delta": {"content": "b"}}]}\n\n'
            "data: [DONE]\n\n"
            'data: {"choices": [{"delta": {"content": "after the end"}}]}\n\n')
    assert [c["choices"][0]["delta"]["content"] for c in chunks_of(body)] == ["a", "b"]


def test_the_sse_reader_raises_an_error_event() -> None:
    with pytest.raises(ServerError, match="upstream: overloaded"):
        chunks_of('event: error\ndata: {"message": "overloaded"}\n\n')
    with pytest.raises(ServerError, match="upstream: boom"):
        chunks_of('data: {"error": {"message": "boom"}}\n\n')
    with pytest.raises(ServerError, match="without streaming"):
        asyncio.run(anext(sse_chunks(httpx.Response(200, json={"choices": []}))))  # type: ignore[arg-type]


def tool_call_stream() -> str:
    """What an OpenAI server streams for one call: id and name first, the arguments in pieces."""
    deltas = [{"index": 0, "id": "call_up1", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
              {"index": 0, "function": {"arguments": '{"city": '}}, {"index": 0, "function": {"arguments": '"Paris"}'}}]
    chunks = [{"choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]} for delta in deltas]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                   "usage": {"prompt_tokens": 12, "completion_tokens": 9}})
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"


@pytest.fixture()
def forwarded() -> list[dict[str, Any]]:
    return []


@pytest.fixture()
def client(forwarded: list[dict[str, Any]]) -> Iterator[TestClient]:
    """A router serving `remote` from one upstream, which answers every chat with one tool call."""

    def upstream(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":  # the health probe
            return httpx.Response(200, json={"object": "list", "data": []})
        forwarded.append({"path": request.url.path, **json.loads(request.content)})
        return streamed(tool_call_stream())

    def factory(spec: ModelSpec, lock: object) -> UpstreamBackend:
        backend = UpstreamBackend(spec, ModelConfig())
        backend.pool._client = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
        return backend

    settings = ServerSettings()
    spec = ModelSpec(name="remote", upstreams=(UpstreamSpec(url="http://upstream:8000/v1", model="up"),))
    with TestClient(create_app(ModelRegistry(settings, [spec], factory, router=True))) as test_client:
        yield test_client


def test_tool_calls_through_an_upstream_arrive_as_structure(client: TestClient,
                                                            forwarded: list[dict[str, Any]]) -> None:
    request = {"model": "remote", "messages": CHAT, "tools": [WEATHER], "tool_choice": "auto"}
    reply = client.post("/v1/chat/completions", json=request).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"] == [{"id": "call_up1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    # the upstream got the tools as OpenAI structure, not a rendered prompt
    assert forwarded[0]["path"] == "/v1/chat/completions" and forwarded[0]["tools"][0]["function"]["name"] == \
        "get_weather" and forwarded[0]["tool_choice"] == "auto" and forwarded[0]["model"] == "up"

    with client.stream("POST", "/v1/chat/completions", json={**request, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    calls = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls") or [] if c["choices"]]
    assert calls[0]["id"] == "call_up1" and calls[0]["function"]["name"] == "get_weather"
    assert json.loads("".join(call["function"]["arguments"] for call in calls)) == {"city": "Paris"}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"

    message = client.post("/v1/messages", json={"model": "remote", "max_tokens": 64, "messages": CHAT, "tools": [
        {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]}).json()
    assert message["stop_reason"] == "tool_use"
    assert [(b["type"], b["id"], b["name"], b["input"]) for b in message["content"]] == \
        [("tool_use", "toolu_call_up1", "get_weather", {"city": "Paris"})]  # Anthropic's id prefix

    ollama = client.post("/api/chat", json={"model": "remote", "messages": CHAT, "tools": [WEATHER],
                                            "stream": False}).json()
    [call] = ollama["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and call["function"]["arguments"] == {"city": "Paris"}


@pytest.mark.parametrize("method, path, body, envelope", [
    ("POST", "/infill", {"input_prefix": "def f(", "input_suffix": ")"}, "openai"),
    ("POST", "/v1/chat/completions/input_tokens", {"messages": CHAT}, "openai"),
    ("POST", "/v1/responses/input_tokens", {"input": "hi"}, "openai"),
    ("GET", "/props", None, "openai"),
    ("GET", "/slots", None, "openai"),
    ("POST", "/api/show", {}, "ollama"),
])
def test_what_an_upstream_cannot_do_is_a_501_naming_the_route(client: TestClient, method: str, path: str,
                                                               body: dict[str, Any] | None, envelope: str) -> None:
    route = path.partition("?")[0]
    if method == "GET":
        response = client.get(route, params={"model": "remote"})
    else:
        query = path.partition("?")[2]
        url = route + "?" + "&".join(filter(None, [query, "model=remote"]))
        response = client.post(url, json={**(body or {}), "model": "remote"})
    assert response.status_code == 501, response.text
    if envelope == "ollama":
        assert list(response.json()) == ["error"] and route in response.json()["error"]
    else:
        error = response.json()["error"]
        assert error["type"] == "not_supported_error" and error["code"] == 501
        assert "model 'remote' cannot serve" in error["message"] and route in error["message"]
