"""Open WebUI in Ollama mode, replayed: the requests its backend (0.12.x) sends to an Ollama base
URL, with the same paths, bodies and headers, and the responses read the way its code reads them.

Open WebUI itself is a large web application with a database and is not installed here. What it
sends was read from its source (routers/ollama.py, utils/payload.py, utils/response.py): the model
id gets `:latest` appended when it has no tag, the OpenAI-style chat is converted with
`convert_payload_openai_to_ollama` (user parameters into `options`, `max_tokens` -> `num_predict`),
and every streamed line is `json.loads`-ed on its own and converted to an OpenAI chunk.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import httpx

from tests.conftest import MODEL_ALIAS
from tests.server import KineticServer

OWUI_MODEL = f"{MODEL_ALIAS}:latest"  # Open WebUI appends the default tag before it posts
HEADERS = {"Content-Type": "application/json", "X-OpenWebUI-User-Name": "Student", "X-OpenWebUI-User-Id": "u-1",
           "X-OpenWebUI-User-Email": "student@example.org", "X-OpenWebUI-User-Role": "user",
           "X-OpenWebUI-Chat-Id": "c-1"}
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Why is the sky blue?"}]


def converted_line(data: dict[str, Any]) -> dict[str, Any]:
    """What Open WebUI's convert_streaming_response_ollama_to_openai reads out of one line."""
    message = data.get("message", {})
    converted: dict[str, Any] = {"content": message.get("content", None), "reasoning": message.get("thinking", None),
                                 "tool_calls": message.get("tool_calls", None), "done": data.get("done", False)}
    if converted["tool_calls"]:
        converted["tool_calls"] = [{"index": call.get("index", call.get("function", {}).get("index", 0)),
                                    "id": call.get("id", "call_x"), "type": "function",
                                    "function": {"name": call["function"].get("name", ""),
                                                 "arguments": json.dumps(call["function"].get("arguments", {}))}}
                                   for call in converted["tool_calls"]]
    if converted["done"]:
        # convert_ollama_usage_to_openai, with its own guard against zero durations
        converted["usage"] = {
            "input_tokens": int(data.get("prompt_eval_count", 0)), "output_tokens": int(data.get("eval_count", 0)),
            "response_token/s": round(data["eval_count"] / (data["eval_duration"] / 10_000_000) * 100, 2)
            if data.get("eval_duration", 0) > 0 else "N/A"}
        converted["finish_reason"] = data.get("done_reason")
    return converted


def stream_chat(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Posts like Open WebUI's send_post_request and splits the body on newlines, as aiohttp's
    line iterator does: every piece must be one JSON object."""
    with httpx.stream("POST", url + "/api/chat", content=json.dumps(body), headers=HEADERS, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        raw = b"".join(r.iter_bytes())
    assert raw.endswith(b"\n")
    pieces = raw.split(b"\n")[:-1]
    assert all(pieces), "a blank line breaks Open WebUI's json.loads"
    return [converted_line(json.loads(piece)) for piece in pieces]


def test_verify_connection(live_server: KineticServer) -> None:
    r = httpx.get(live_server.url + "/api/version", headers=HEADERS)
    assert r.status_code == 200 and isinstance(r.json()["version"], str)


def test_model_list_from_tags_then_ps(live_server: KineticServer) -> None:
    tags = httpx.get(live_server.url + "/api/tags", headers=HEADERS).json()
    # get_all_models: {id: model, name: name, ...} with plain subscripts (a missing key is a KeyError)
    models = [{"id": m["model"], "name": m["name"], "object": "model", "owned_by": "ollama", "ollama": m}
              for m in tags["models"]]
    assert [m["id"] for m in models] == [MODEL_ALIAS]
    ps = httpx.get(live_server.url + "/api/ps", headers=HEADERS).json()
    expires = {m["model"]: datetime.fromisoformat(m["expires_at"]) for m in ps["models"]}
    assert set(expires) == {MODEL_ALIAS}


def test_streamed_chat_with_user_parameters(live_server: KineticServer) -> None:
    # A chat whose user set temperature, max tokens, a seed and a stop word in Advanced Params.
    body = {"model": OWUI_MODEL, "messages": MESSAGES, "stream": True,
            "options": {"temperature": 0.7, "seed": 3, "stop": ["\n\n\n"], "num_predict": 16, "num_ctx": 2048},
            "keep_alive": "5m"}
    lines = stream_chat(live_server.url, body)
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    final = lines[-1]
    assert final["finish_reason"] in {"stop", "length"} and final["content"] == ""
    assert 0 < final["usage"]["output_tokens"] <= 16 and final["usage"]["input_tokens"] > 0
    assert isinstance(final["usage"]["response_token/s"], float)
    assert all(isinstance(line["content"], str) and line["reasoning"] is None for line in lines)


def test_streamed_chat_with_only_the_default_fields_then_stop(live_server: KineticServer) -> None:
    """With no parameters set Open WebUI sends only model, messages and stream; its stop button
    closes the connection, which frees the slot."""
    body = {"model": OWUI_MODEL, "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", live_server.url + "/api/chat", content=json.dumps(body), headers=HEADERS,
                      timeout=120) as r:
        assert r.status_code == 200
        first = [json.loads(line) for _, line in zip(range(3), r.iter_lines(), strict=False)]
    assert all(line["done"] is False and line["message"]["role"] == "assistant" for line in first)
    after = httpx.post(live_server.url + "/api/chat", content=json.dumps({**body, "stream": False,
                                                                         "options": {"num_predict": 1}}),
                       headers=HEADERS, timeout=120)
    assert after.status_code == 200 and after.json()["done"] is True


def test_tool_history_in_its_shape(live_server: KineticServer) -> None:
    # convert_messages_openai_to_ollama: calls with index, id and decoded arguments, content "" beside
    # them; the tool turn carries tool_call_id. Tools stay in OpenAI's shape.
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Rome?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    body = {"model": OWUI_MODEL, "messages": messages, "stream": True, "tools": tools, "options": {"num_predict": 8}}
    lines = stream_chat(live_server.url, body)
    assert lines[-1]["done"] is True
    for line in lines:
        for call in line["tool_calls"] or []:
            assert isinstance(json.loads(call["function"]["arguments"]), dict)


def test_task_request_not_streamed(live_server: KineticServer) -> None:
    # Title and tag generation: one JSON object; message.content and done_reason are read.
    body = {"model": OWUI_MODEL, "stream": False, "options": {"num_predict": 12},
            "messages": [{"role": "user", "content": "### Task:\nGenerate a concise, 3-5 word title for the "
                                                     "chat.\n### Chat History:\nUSER: Why is the sky blue?"}]}
    r = httpx.post(live_server.url + "/api/chat", content=json.dumps(body), headers=HEADERS, timeout=120)
    data = r.json()
    assert r.status_code == 200 and isinstance(data["message"]["content"], str)
    assert data["done_reason"] in {"stop", "length"}


def test_rag_embeddings(live_server: KineticServer) -> None:
    body = {"input": ["Rayleigh scattering", "The sky is blue"], "model": OWUI_MODEL, "truncate": True}
    r = httpx.post(live_server.url + "/api/embed", content=json.dumps(body), headers=HEADERS, timeout=120)
    embeddings = r.json()["embeddings"]
    assert len(embeddings) == 2 and len(embeddings[0]) == 640


def test_unload_button(live_server: KineticServer) -> None:
    body = {"model": OWUI_MODEL, "keep_alive": 0, "prompt": ""}  # no `stream`: read with one json parse
    r = httpx.post(live_server.url + "/api/generate", content=json.dumps(body), headers=HEADERS)
    assert r.status_code == 200 and json.loads(r.content)["done_reason"] == "unload"


def test_errors_show_the_error_key(live_server: KineticServer) -> None:
    # Open WebUI shows `Ollama: {error}` when the body is JSON with an `error` key.
    body = {"model": "llama3:latest", "messages": MESSAGES, "stream": True}
    r = httpx.post(live_server.url + "/api/chat", content=json.dumps(body), headers=HEADERS)
    assert r.status_code == 404 and r.json() == {"error": 'model "llama3:latest" not found'}
