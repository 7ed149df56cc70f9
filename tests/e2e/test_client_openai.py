"""Client row "OpenAI Python SDK": tools, structured output, logprobs, other fields and embeddings,
through the real openai SDK against `kinetic serve` on the bundled (base) model.

Forced tool calls and schemas are grammar-constrained, so even this small model answers validly;
free text is never checked for wording. max_tokens stays small: each constrained token is slow."""

from __future__ import annotations

import json
import math

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import MODEL_ALIAS

ASK = [{"role": "user", "content": "What is the weather in Rome?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                   "required": ["zone"], "additionalProperties": False}}}


# ------------------------------------------------------------------------------ tools


def test_required_tool_call(openai_client: openai.OpenAI) -> None:
    r = openai_client.chat.completions.create(model="local", messages=ASK, tools=[WEATHER, TIME],
                                              tool_choice="required", temperature=0, max_tokens=40)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and len(call.id) == 32 and call.id.isalnum()
    assert call.function.name in {"get_weather", "get_time"}
    arguments = json.loads(call.function.arguments)
    schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"]
    jsonschema.validate(arguments, schema)


def test_named_tool_choice_calls_that_tool(openai_client: openai.OpenAI) -> None:
    r = openai_client.chat.completions.create(
        model="local", messages=ASK, tools=[WEATHER, TIME], temperature=0, max_tokens=30,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments)["zone"] in {"UTC", "CET"}


def test_parallel_tool_calls_allow_a_list(openai_client: openai.OpenAI) -> None:
    r = openai_client.chat.completions.create(
        model="local", messages=ASK, tools=[TIME], tool_choice="required", parallel_tool_calls=True,
        temperature=0, max_tokens=60)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) >= 1
    assert len({c.id for c in calls}) == len(calls)
    assert all(c.function.name == "get_time" and json.loads(c.function.arguments)["zone"] in {"UTC", "CET"}
               for c in calls)


def test_streamed_tool_call_with_sdk_stream_helper(openai_client: openai.OpenAI) -> None:
    with openai_client.chat.completions.stream(model="local", messages=ASK, tools=[WEATHER],
                                               tool_choice="required", temperature=0, max_tokens=40) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    deltas = [e.chunk.choices[0].delta.tool_calls for e in events
              if e.type == "chunk" and e.chunk.choices and e.chunk.choices[0].delta.tool_calls]
    assert len(deltas) >= 2, "arguments should arrive in pieces"
    first = deltas[0][0]
    assert first.index == 0 and first.id and first.function.name == "get_weather"
    assert all(d[0].id is None and d[0].function.name is None for d in deltas[1:])
    (call,) = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls" and call.id == first.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert any(e.type == "tool_calls.function.arguments.done" for e in events)


def test_tool_result_is_sent_back_through_template(openai_client: openai.OpenAI, base_url: str) -> None:
    first = openai_client.chat.completions.create(model="local", messages=ASK, tools=[WEATHER],
                                                  tool_choice="required", temperature=0, max_tokens=40)
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees"}]
    r = openai_client.chat.completions.create(model="local", messages=messages, tools=[WEATHER], max_tokens=6)
    assert r.choices[0].finish_reason in {"stop", "length", "tool_calls"}
    # the prompt this request used is the rendered conversation, with the call and its result in it
    prompt = httpx.post(base_url + "/apply-template", json={"messages": messages, "tools": [WEATHER]}).json()["prompt"]
    assert "Sunny, 24 degrees" in prompt
    assert prompt.count('"get_weather"') == 2  # once in the tool list, once in the model's earlier call
    tokens = httpx.post(base_url + "/tokenize", json={"content": prompt}).json()["tokens"]
    assert r.usage.prompt_tokens == len(tokens)


def test_tool_choice_errors(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model="local", messages=ASK, tools=[WEATHER], max_tokens=5,
                                              tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "tool_choice" in info.value.message


def test_auto_tools_stream_matches_non_stream(openai_client: openai.OpenAI) -> None:
    # With "auto" the text is streamed through the call detector; nothing may be lost or duplicated.
    kwargs = dict(model="local", messages=ASK, tools=[WEATHER], tool_choice="auto", temperature=0, max_tokens=8,
                  extra_body={"cache_prompt": False})  # both runs evaluate the prompt whole: same logits
    whole = openai_client.chat.completions.create(**kwargs)
    chunks = list(openai_client.chat.completions.create(stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == (whole.choices[0].message.content or "")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]


def test_logprobs_with_streamed_tools_is_400(openai_client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model="local", messages=ASK, tools=[WEATHER], max_tokens=2,
                                              stream=True, logprobs=True)
    assert info.value.body["message"] == "logprobs is not supported with tools + stream"


# ------------------------------------------------------------------ structured output


class City(BaseModel):
    name: str = Field(max_length=16)
    population_millions: int = Field(ge=0, le=99)


def test_parse_with_pydantic_model(openai_client: openai.OpenAI) -> None:
    r = openai_client.chat.completions.parse(
        model="local", temperature=0, max_tokens=40, response_format=City,
        messages=[{"role": "user", "content": "Name a large city as JSON."}])
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, City)
    assert City.model_validate_json(r.choices[0].message.content) == parsed


def test_json_schema_dict_result_validates(openai_client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100},
                                               "unit": {"enum": ["cm", "m"]}},
              "required": ["answer", "unit"], "additionalProperties": False}
    r = openai_client.chat.completions.create(
        model="local", temperature=0, max_tokens=30,
        messages=[{"role": "user", "content": "How tall is a door?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "height", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_top_level_json_schema_field(openai_client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    r = openai_client.chat.completions.create(model="local", messages=ASK, temperature=0, max_tokens=12,
                                              extra_body={"json_schema": schema})
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


@pytest.mark.parametrize("fmt, words", [
    ({"type": "yaml"}, "response_format type must be one of"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": 123}}, "invalid JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "hiccup"}}}, "invalid JSON schema"),
])
def test_bad_response_format_is_400(openai_client: openai.OpenAI, fmt: dict, words: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model="local", messages=ASK, max_tokens=4, response_format=fmt)
    assert words in info.value.message and "response_format" in info.value.body["param"]


# ------------------------------------------------------------------------- logprobs


def test_logprobs_with_top_alternatives(openai_client: openai.OpenAI) -> None:
    r = openai_client.chat.completions.create(model="local", messages=ASK, max_tokens=4, logprobs=True,
                                              top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    assert "".join(e.token for e in entries) == r.choices[0].message.content
    for entry in entries:
        assert entry.logprob <= 0 and bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        assert len(entry.top_logprobs) == 3
        values = [alt.logprob for alt in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
    zero = openai_client.chat.completions.create(model="local", messages=ASK, max_tokens=2, logprobs=True,
                                                 top_logprobs=0)
    assert all(e.top_logprobs == [] for e in zero.choices[0].logprobs.content)


def test_logprobs_in_stream_chunks(openai_client: openai.OpenAI) -> None:
    chunks = list(openai_client.chat.completions.create(model="local", messages=ASK, max_tokens=4, stream=True,
                                                        logprobs=True, top_logprobs=2))
    with_logprobs = [c for c in chunks if c.choices and c.choices[0].logprobs]
    assert with_logprobs and all(len(c.choices[0].logprobs.content) == 1 for c in with_logprobs)
    assert all(len(c.choices[0].logprobs.content[0].top_logprobs) == 2 for c in with_logprobs)


@pytest.mark.parametrize("fields", [{"logprobs": True, "top_logprobs": 21}, {"top_logprobs": 2}])
def test_logprobs_bounds(openai_client: openai.OpenAI, fields: dict) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model="local", messages=ASK, max_tokens=2, **fields)
    assert "top_logprobs" in info.value.message


def test_completions_logprobs_in_llama_server_shape(openai_client: openai.OpenAI) -> None:
    # llama-server answers /v1/completions logprobs as {"content": [entries]}, not OpenAI's legacy lists
    r = openai_client.completions.create(model="local", prompt="The capital of France is", max_tokens=3,
                                         logprobs=2)
    entries = r.choices[0].logprobs.model_extra["content"]
    assert len(entries) == r.usage.completion_tokens
    assert "".join(e["token"] for e in entries) == r.choices[0].text
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)


# ---------------------------------------------------------------------- other fields


def test_logit_bias_forces_a_token(openai_client: openai.OpenAI, base_url: str) -> None:
    target = httpx.post(base_url + "/tokenize", json={"content": " banana", "add_special": False}).json()["tokens"][0]
    r = openai_client.chat.completions.create(model="local", messages=ASK, max_tokens=3, temperature=0,
                                              logit_bias={str(target): 100}, logprobs=True)
    ids = [entry.model_extra["id"] for entry in r.choices[0].logprobs.content]
    assert ids == [target] * 3


def test_content_parts_user_metadata_store_max_completion_tokens(openai_client: openai.OpenAI) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the weather"},
                                          {"type": "text", "text": "in Rome?"}]}]
    r = openai_client.chat.completions.create(model="local", messages=parts, max_completion_tokens=3, seed=7,
                                              temperature=0, user="u-1", metadata={"k": "v"}, store=False,
                                              extra_body={"cache_prompt": False})
    plain = openai_client.chat.completions.create(
        model="local", messages=[{"role": "user", "content": "What is the weather\nin Rome?"}], max_tokens=3,
        seed=7, temperature=0, extra_body={"cache_prompt": False})
    assert r.usage.completion_tokens <= 3 and r.model == MODEL_ALIAS
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens  # parts are joined with a newline
    assert r.choices[0].message.content == plain.choices[0].message.content


# ------------------------------------------------------------------------ embeddings


def test_embeddings_default_base64(openai_client: openai.OpenAI) -> None:
    r = openai_client.embeddings.create(model="local", input=["The cat sat.", "A dog ran."])
    assert r.model == MODEL_ALIAS and [d.index for d in r.data] == [0, 1]
    for item in r.data:
        assert len(item.embedding) == 640
        assert math.isclose(math.sqrt(sum(x * x for x in item.embedding)), 1.0, rel_tol=1e-4)
    assert r.usage.prompt_tokens == r.usage.total_tokens > 6
    floats = openai_client.embeddings.create(model="local", input="The cat sat.", encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(r.data[0].embedding, abs=1e-6)
