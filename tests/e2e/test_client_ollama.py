"""The Ollama API through the official `ollama` Python client, on the bundled model.

The bundled model is a base model: answers are checked for shape, counts and constrained
validity, never wording. Ollama has no forced tool call, so with `tools` the model may or may
not call; the call's shape is asserted when it does (the parsing itself is unit-tested).
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import UTC, datetime

import httpx
import ollama
import pytest
from pydantic import BaseModel, Field

from kinetic.backends.bundled import gemma_model_path
from tests.conftest import MODEL_ALIAS
from tests.server import KineticServer

HI = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 8}
METRICS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
           "eval_duration")


@pytest.fixture()
def client(live_server: KineticServer) -> ollama.Client:
    return ollama.Client(host=live_server.url, timeout=120)


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: the city's name
    """
    return "sunny"


def assert_final(response: ollama.ChatResponse | ollama.GenerateResponse, limit: int) -> None:
    assert response.done is True and response.done_reason in {"stop", "length"}
    assert all(isinstance(getattr(response, name), int) for name in METRICS)
    assert response.prompt_eval_count > 0 and 0 < response.eval_count <= limit
    if response.done_reason == "length":
        assert response.eval_count == limit


# ------------------------------------------------------------------------ model routes


def test_list_shows_the_alias_with_the_gguf_facts(client: ollama.Client) -> None:
    models = client.list().models
    assert [m.model for m in models] == [MODEL_ALIAS]
    model = models[0]
    path = gemma_model_path()
    assert model.size == path.stat().st_size
    assert model.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert model.details.format == "gguf" and model.details.family == "gemma3"
    assert model.details.parameter_size == "268.10M" and model.details.quantization_level == "Q4_K_M"
    assert model.modified_at is not None and model.modified_at.tzinfo is not None


def test_show_reports_model_info_parameters_and_capabilities(client: ollama.Client) -> None:
    shown = client.show(MODEL_ALIAS)
    assert shown.modelinfo["general.architecture"] == "gemma3"
    assert shown.modelinfo["gemma3.context_length"] == 32768 and shown.modelinfo["gemma3.embedding_length"] == 640
    assert shown.modelinfo["general.parameter_count"] == 268098176
    assert "num_ctx" in shown.parameters and "2048" in shown.parameters
    assert "<start_of_turn>" in shown.template
    assert set(shown.capabilities) >= {"completion", "tools", "embedding"} and "thinking" not in shown.capabilities
    assert client.show(f"{MODEL_ALIAS}:latest").details.family == "gemma3"


def test_show_accepts_the_legacy_name_key(live_server: KineticServer) -> None:
    r = httpx.post(live_server.url + "/api/show", json={"name": MODEL_ALIAS})
    assert r.status_code == 200 and r.json()["model_info"]["general.architecture"] == "gemma3"
    missing = httpx.post(live_server.url + "/api/show", json={})
    assert missing.status_code == 400 and missing.json() == {"error": "model is required"}


def test_ps_shows_the_resident_model(client: ollama.Client) -> None:
    models = client.ps().models
    assert [m.model for m in models] == [MODEL_ALIAS]
    assert models[0].context_length == 2048 and models[0].size_vram == 0
    assert models[0].expires_at > datetime.now(UTC)


def test_version_and_tags_answer_head(live_server: KineticServer) -> None:
    assert httpx.get(live_server.url + "/api/version").json()["version"].count(".") == 2
    for path in ("/api/version", "/api/tags"):
        r = httpx.head(live_server.url + path)
        assert r.status_code == 200 and r.content == b""


# ------------------------------------------------------------------------------- chat


def test_chat_not_streamed(client: ollama.Client) -> None:
    r = client.chat(model=MODEL_ALIAS, messages=HI, options=GREEDY)
    assert r.model == MODEL_ALIAS and r.message.role == "assistant" and isinstance(r.message.content, str)
    assert r.message.thinking is None and r.message.tool_calls is None
    assert_final(r, GREEDY["num_predict"])


def test_chat_streamed_matches_not_streamed(client: ollama.Client) -> None:
    whole = client.chat(model=MODEL_ALIAS, messages=HI, options=GREEDY)
    chunks = list(client.chat(model=f"{MODEL_ALIAS}:latest", messages=HI, options=GREEDY, stream=True))
    assert all(c.done is False for c in chunks[:-1]) and all(c.model == f"{MODEL_ALIAS}:latest" for c in chunks)
    assert "".join(c.message.content or "" for c in chunks) == whole.message.content
    assert chunks[-1].message.content == ""
    assert_final(chunks[-1], GREEDY["num_predict"])
    assert chunks[-1].eval_count == whole.eval_count


def test_chat_stream_is_ndjson(live_server: KineticServer) -> None:
    body = {"model": MODEL_ALIAS, "messages": HI, "options": {"num_predict": 4}}  # no `stream`: streams
    with httpx.stream("POST", live_server.url + "/api/chat", json=body, timeout=60) as r:
        assert r.headers["content-type"] == "application/x-ndjson"
        raw = b"".join(r.iter_bytes())
    lines = raw.decode().split("\n")
    assert lines[-1] == "" and all(lines[:-1])  # every line one object, no blank lines
    objects = [json.loads(line) for line in lines[:-1]]
    assert [o["done"] for o in objects] == [False] * (len(objects) - 1) + [True]


def test_stop_and_seed_options(client: ollama.Client) -> None:
    options = {"temperature": 1.0, "seed": 7, "num_predict": 12, "top_k": 20, "top_p": 0.9, "min_p": 0.05,
               "repeat_penalty": 1.1, "presence_penalty": 0.1, "frequency_penalty": 0.1}
    first = client.chat(model=MODEL_ALIAS, messages=HI, options=options)
    again = client.chat(model=MODEL_ALIAS, messages=HI, options=options)
    assert first.message.content == again.message.content  # same seed, same sampling
    text = first.message.content.strip()
    assert len(text) >= 3  # seed 7 on the bundled model gives a fixed, longer answer
    stop = text[1:3]
    cut = client.chat(model=MODEL_ALIAS, messages=HI, options={**options, "stop": [stop]})
    assert stop not in cut.message.content and cut.done_reason == "stop"


def test_logprobs(client: ollama.Client) -> None:
    r = client.chat(model=MODEL_ALIAS, messages=HI, options={"num_predict": 3}, logprobs=True, top_logprobs=2)
    assert r.logprobs is not None and len(r.logprobs) == r.eval_count
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 for entry in r.logprobs)


def test_num_ctx_limits_prompt_and_answer(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=MODEL_ALIAS, messages=HI, options={"num_ctx": 8})
    assert info.value.status_code == 400 and "context size (8 tokens)" in info.value.error
    r = client.chat(model=MODEL_ALIAS, messages=HI, options={"num_ctx": 16384, "num_predict": 2})
    assert r.done is True  # a bigger context than loaded is ignored, not a reload


def test_think_false_answers_and_true_is_refused(client: ollama.Client) -> None:
    r = client.chat(model=MODEL_ALIAS, messages=HI, options={"num_predict": 2}, think=False)
    assert r.done is True and r.message.thinking is None
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=MODEL_ALIAS, messages=HI, think=True)
    assert info.value.status_code == 400 and info.value.error == f'"{MODEL_ALIAS}" does not support thinking'


def test_load_and_unload_requests(client: ollama.Client) -> None:
    assert client.chat(model=MODEL_ALIAS, messages=[]).done_reason == "load"
    assert client.generate(model=MODEL_ALIAS).done_reason == "load"
    assert client.generate(model=MODEL_ALIAS, keep_alive=0).done_reason == "unload"
    assert client.list().models  # still served


# --------------------------------------------------------------------- structured output


class City(BaseModel):
    name: str = Field(max_length=16)
    population_millions: int = Field(ge=0, le=99)


def test_format_with_a_pydantic_schema_validates(client: ollama.Client) -> None:
    r = client.chat(model=MODEL_ALIAS, messages=[{"role": "user", "content": "Name a large city as JSON."}],
                    format=City.model_json_schema(), options={"temperature": 0, "num_predict": 40})
    City.model_validate_json(r.message.content)


def test_format_json_is_an_object(client: ollama.Client) -> None:
    r = client.generate(model=MODEL_ALIAS, prompt="Describe Rome as JSON.", format="json",
                        options={"temperature": 0, "num_predict": 30})
    assert r.response.lstrip().startswith("{")  # the grammar's root is an object
    if r.done_reason == "stop":  # not cut short by num_predict: a whole object
        assert isinstance(json.loads(r.response), dict)


# ------------------------------------------------------------------------------ tools


def test_tools_answer_in_ollama_shape(client: ollama.Client) -> None:
    ask = [{"role": "user", "content": "What is the weather in Rome?"}]
    r = client.chat(model=MODEL_ALIAS, messages=ask, tools=[get_weather], options={"num_predict": 24})
    assert r.done is True and r.done_reason in {"stop", "length"}
    for call in r.message.tool_calls or []:  # the base model rarely calls; when it does:
        assert call.function.name == "get_weather" and isinstance(call.function.arguments, dict)
    streamed = list(client.chat(model=MODEL_ALIAS, messages=ask, tools=[get_weather], stream=True,
                                options={"num_predict": 24}))
    assert streamed[-1].done is True
    for chunk in streamed:
        for call in chunk.message.tool_calls or []:
            assert isinstance(call.function.arguments, dict)


def test_tool_result_round_trip(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "What is the weather in Rome?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"}]
    r = client.chat(model=MODEL_ALIAS, messages=messages, tools=[get_weather], options={"num_predict": 4})
    without = client.chat(model=MODEL_ALIAS, messages=messages[:1], tools=[get_weather], options={"num_predict": 1})
    assert r.done is True and r.prompt_eval_count > without.prompt_eval_count  # the call and result were rendered


# ----------------------------------------------------------------------------- generate


def test_generate_returns_context_that_continues(client: ollama.Client) -> None:
    first = client.generate(model=MODEL_ALIAS, prompt="Tell me about Rome.", options=GREEDY)
    assert isinstance(first.response, str)
    assert_final(first, GREEDY["num_predict"])
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    second = client.generate(model=MODEL_ALIAS, prompt="And Paris?", context=first.context,
                             options={"num_predict": 2})
    assert second.prompt_eval_count > len(first.context)


def test_generate_streamed_and_raw(client: ollama.Client) -> None:
    chunks = list(client.generate(model=MODEL_ALIAS, prompt="Once upon a time", raw=True, stream=True,
                                  options={"num_predict": 5}))
    assert chunks[-1].done is True and chunks[-1].context is None  # raw answers carry no context
    assert all(isinstance(c.response, str) for c in chunks)
    templated = client.generate(model=MODEL_ALIAS, prompt="Once upon a time", options={"num_predict": 1})
    assert chunks[-1].prompt_eval_count < templated.prompt_eval_count  # no chat template around it


# --------------------------------------------------------------------------- embeddings


def test_embed_string_list_and_dimensions(client: ollama.Client) -> None:
    many = client.embed(model=MODEL_ALIAS, input=["first text", "second text"])
    assert len(many.embeddings) == 2 and all(len(v) == 640 for v in many.embeddings)
    assert all(math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-3) for v in many.embeddings)
    assert many.prompt_eval_count > 0
    one = client.embed(model=MODEL_ALIAS, input="first text")
    assert len(one.embeddings) == 1 and one.embeddings[0] == pytest.approx(many.embeddings[0], abs=1e-3)
    short = client.embed(model=MODEL_ALIAS, input="first text", dimensions=64)
    assert len(short.embeddings[0]) == 64 and math.isclose(sum(x * x for x in short.embeddings[0]), 1.0,
                                                             rel_tol=1e-3)
    assert client.embed(model=MODEL_ALIAS, input="").embeddings == []


def test_embed_truncates_unless_told_not_to(model_lock: None) -> None:
    """On a server of 512-token slots: a whole 2048-token slot's embedding is 15 s of the suite (every token attends
    to every other), the cut it checks the same."""
    with KineticServer("-c", "512", "-np", "1", "--embeddings", "-a", MODEL_ALIAS) as server:
        client = ollama.Client(host=server.url, timeout=120)
        long = "hello " * 600  # longer than the embedding context
        cut = client.embed(model=MODEL_ALIAS, input=long)
        assert len(cut.embeddings[0]) == 640 and cut.prompt_eval_count == 512
        with pytest.raises(ollama.ResponseError) as info:
            client.embed(model=MODEL_ALIAS, input=long, truncate=False)
    assert info.value.status_code == 400 and "too large" in info.value.error


def test_legacy_embeddings(client: ollama.Client) -> None:
    assert len(client.embeddings(model=MODEL_ALIAS, prompt="first text").embedding) == 640
    assert client.embeddings(model=MODEL_ALIAS, prompt="").embedding == []


# ------------------------------------------------------------------------------- errors


def test_unknown_model_is_404(client: ollama.Client) -> None:
    for call in (lambda: client.chat(model="llama3", messages=HI),
                 lambda: client.generate(model="llama3", prompt="hi"),
                 lambda: client.show("llama3"),
                 lambda: client.embed(model="llama3", input="hi")):
        with pytest.raises(ollama.ResponseError) as info:
            call()
        assert info.value.status_code == 404 and info.value.error == 'model "llama3" not found'


@pytest.mark.parametrize("path, body, field", [
    ("/api/chat", {"model": MODEL_ALIAS, "messages": "hi"}, "messages"),
    ("/api/chat", {"model": MODEL_ALIAS, "messages": HI, "options": {"top_k": "many"}}, "options.top_k"),
    ("/api/chat", {"model": MODEL_ALIAS, "messages": HI, "options": {"temperature": 9}}, "options.temperature"),
    ("/api/chat", {"model": MODEL_ALIAS, "messages": HI, "format": "yaml"}, "format"),
    ("/api/generate", {"model": MODEL_ALIAS, "prompt": 5}, "prompt"),
    ("/api/generate", {"model": MODEL_ALIAS, "prompt": "x", "stream": [1]}, "stream"),
    ("/api/embed", {"model": MODEL_ALIAS, "input": [1, 2]}, "input"),
    ("/api/embed", {"model": MODEL_ALIAS, "input": "x", "dimensions": 4096}, "dimensions"),
])
def test_bad_types_and_values_are_400_naming_the_field(live_server: KineticServer, path: str, body: dict,
                                                       field: str) -> None:
    r = httpx.post(live_server.url + path, json=body, timeout=60)
    assert r.status_code == 400 and list(r.json()) == ["error"] and field in r.json()["error"], r.text


def test_bad_json_and_images_are_400(client: ollama.Client, live_server: KineticServer) -> None:
    r = httpx.post(live_server.url + "/api/chat", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=MODEL_ALIAS, messages=[{"role": "user", "content": "what is this?",
                                                  "images": [b"\x89PNG\r\n"]}])
    assert info.value.status_code == 400 and "image" in info.value.error and "text only" in info.value.error


def test_unknown_api_route_is_404_in_ollama_shape(live_server: KineticServer) -> None:
    r = httpx.post(live_server.url + "/api/nope", json={})
    assert r.status_code == 404 and list(r.json()) == ["error"]
