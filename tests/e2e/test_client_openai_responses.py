"""Client row "OpenAI Responses API": `client.responses.create` / `.stream` / `.parse` of the real
openai SDK against `POST /v1/responses` of `kinetic serve` on the bundled (base) model: text,
`text.format` json_schema, forced function calls, a function_call_output round trip, usage and
timings; and LangChain's `ChatOpenAI(use_responses_api=True)` on the same route. A stream that fails
midway needs the scripted engine: tests/unit/test_stream_faults_in_clients.py.

Forced calls and schemas are grammar-constrained, so even this small model answers validly; free
text is never checked for wording."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.conftest import MODEL_ALIAS
from tests.server import KineticServer

ASK = "What is the weather in Rome?"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}
TIME = {"type": "function", "name": "get_time", "description": "Current time in a timezone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                       "required": ["zone"], "additionalProperties": False}, "strict": True}
PARAMETERS = {"get_weather": WEATHER["parameters"], "get_time": TIME["parameters"]}
CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                         "population": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "population"], "additionalProperties": False}


class City(BaseModel):
    name: str = Field(max_length=12)
    population: int = Field(ge=0, le=99)


# ------------------------------------------------------------------------------ text


def test_create_with_instructions_and_items(openai_client: openai.OpenAI) -> None:
    r = openai_client.responses.create(model="gpt-4.1", instructions="Answer briefly.", max_output_tokens=8,
                                       input=[{"role": "system", "content": "Book"},
                                              {"role": "user", "content": "What is the best book"}])
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.model == MODEL_ALIAS
    (message,) = r.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert r.output_text == message.content[0].text and r.output_text
    usage = r.usage
    assert 0 < usage.output_tokens <= 8 and usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # a cached prefix never covers the whole prompt: the last prompt token is always evaluated
    assert usage.input_tokens_details.cached_tokens < usage.input_tokens
    if usage.output_tokens == 8:
        assert r.incomplete_details.reason == "max_output_tokens"


def test_string_input_usage_matches_input_tokens_and_the_cache(openai_client: openai.OpenAI,
                                                                live_server: KineticServer) -> None:
    body = {"input": "Count this prompt for the Responses route, please.", "instructions": "Be brief."}
    counted = httpx.post(live_server.url + "/v1/responses/input_tokens", json=body).json()
    assert counted["object"] == "response.input_tokens" and counted["input_tokens"] > 0
    first = openai_client.responses.create(model="m", max_output_tokens=2, **body)
    again = openai_client.responses.create(model="m", max_output_tokens=2, **body)
    assert first.usage.input_tokens == again.usage.input_tokens == counted["input_tokens"]
    assert again.usage.input_tokens_details.cached_tokens > 0
    timings = httpx.post(live_server.url + "/v1/responses", json={**body, "max_output_tokens": 2}).json()["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == counted["input_tokens"]


def test_raw_stream_events_in_order(openai_client: openai.OpenAI) -> None:
    events = list(openai_client.responses.create(model="m", input="What is the best book", max_output_tokens=8,
                                                 stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    message_id = events[2].item.id
    assert message_id.startswith("msg_")
    assert all(e.item_id == message_id for e in events[3:-2])
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    completed = events[-1].response
    assert completed.id == events[0].response.id and completed.output_text == text == events[-4].text
    assert 0 < completed.usage.output_tokens <= 8


def test_stream_helper_and_timings_on_the_wire(openai_client: openai.OpenAI, live_server: KineticServer) -> None:
    with openai_client.responses.stream(model="m", input="What is the best book", max_output_tokens=8) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and final.usage.output_tokens <= 8
    body = {"input": "What is the best book", "max_output_tokens": 4, "stream": True}
    with httpx.stream("POST", live_server.url + "/v1/responses", json=body, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-2] == "event: response.completed" and "data: [DONE]" not in lines
    completed = json.loads(lines[-1].removeprefix("data: "))
    assert completed["timings"]["predicted_n"] == completed["response"]["usage"]["output_tokens"]


def test_stream_with_prompt_progress_and_timings_per_token(live_server: KineticServer) -> None:
    """llama-server's telemetry on a Responses stream: `return_progress` puts prompt_progress on
    response.in_progress events, `timings_per_token` the timings on each token's delta."""
    body = {"input": "This is a test " * 40, "max_output_tokens": 4, "stream": True, "return_progress": True,
            "timings_per_token": True, "cache_prompt": False}
    with httpx.stream("POST", live_server.url + "/v1/responses", json=body, timeout=120) as r:
        data = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line.startswith("data: ")]
    progress = [d for d in data if "prompt_progress" in d]
    assert progress and all(d["type"] == "response.in_progress" for d in progress)
    assert all(d["prompt_progress"]["total"] > 0 and d["prompt_progress"]["processed"] >= d["prompt_progress"]["cache"]
               for d in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    deltas = [d for d in data if d["type"] == "response.output_text.delta" and "timings" in d]
    assert deltas and all("prompt_per_second" in d["timings"] and "predicted_per_second" in d["timings"]
                          for d in deltas)
    assert data[-1]["type"] == "response.completed" and "usage" in data[-1]["response"] and "timings" in data[-1]


# ------------------------------------------------------------------------ structured output


def test_text_format_json_schema(openai_client: openai.OpenAI) -> None:
    r = openai_client.responses.create(model="m", input="Name a city and its population.", max_output_tokens=40,
                                       temperature=0, text={"format": {"type": "json_schema", "name": "city",
                                                                       "schema": CITY, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), CITY)


def test_parse_with_a_pydantic_model(openai_client: openai.OpenAI) -> None:
    r = openai_client.responses.parse(model="m", input="Name a city and its population.", max_output_tokens=40,
                                      temperature=0, text_format=City)
    assert isinstance(r.output_parsed, City) and 0 <= r.output_parsed.population <= 99


# ------------------------------------------------------------------------------- tools


def test_required_function_call(openai_client: openai.OpenAI) -> None:
    r = openai_client.responses.create(model="m", input=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                       temperature=0, max_output_tokens=40)
    (call,) = r.output
    assert call.type == "function_call" and call.status == "completed" and call.name in PARAMETERS
    assert call.call_id.startswith("call_") and call.id == "fc_" + call.call_id.removeprefix("call_")
    jsonschema.validate(json.loads(call.arguments), PARAMETERS[call.name])


def test_named_function_call_streamed(openai_client: openai.OpenAI) -> None:
    with openai_client.responses.stream(model="m", input=ASK, tools=[WEATHER, TIME], temperature=0,
                                        tool_choice={"type": "function", "name": "get_time"},
                                        max_output_tokens=30) as stream:
        events = list(stream)
        final = stream.get_final_response()
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_time"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == deltas and done.item_id == added.item.id
    (call,) = final.output
    assert call.name == "get_time" and call.arguments == deltas
    jsonschema.validate(json.loads(call.arguments), TIME["parameters"])


def test_function_call_output_round_trip(openai_client: openai.OpenAI, live_server: KineticServer) -> None:
    first = openai_client.responses.create(model="m", input=ASK, tools=[WEATHER], temperature=0,
                                           tool_choice={"type": "function", "name": "get_weather"},
                                           max_output_tokens=40)
    (call,) = first.output

    def conversation(result: str) -> list[Any]:
        return [{"role": "user", "content": ASK},
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": result}]

    def input_tokens(result: str) -> int:
        body = {"input": conversation(result), "tools": [WEATHER]}
        return httpx.post(live_server.url + "/v1/responses/input_tokens", json=body).json()["input_tokens"]

    long_result = "sunny, 24 degrees, light wind from the north-west, humidity 40 percent"
    assert input_tokens(long_result) > input_tokens("sunny") + 10  # the result is in the prompt
    r = openai_client.responses.create(model="m", input=conversation(long_result), tools=[WEATHER],
                                       max_output_tokens=6)
    assert r.usage.input_tokens == input_tokens(long_result) and r.status == "completed"
    assert r.output and all(item.type in {"message", "function_call"} for item in r.output)


# ------------------------------------------------------------------------ LangChain on /v1/responses


def test_langchain_use_responses_api(live_server: KineticServer) -> None:
    """ChatOpenAI switches to /v1/responses with use_responses_api=True (and for some options)."""
    from langchain_openai import ChatOpenAI

    def chat(max_tokens: int) -> ChatOpenAI:
        return ChatOpenAI(base_url=live_server.url + "/v1", api_key="x", model="local", use_responses_api=True,
                          max_tokens=max_tokens, temperature=0, max_retries=0)

    reply = chat(6).invoke("What is the best book?")
    assert reply.response_metadata["id"].startswith("resp_") and 0 < reply.usage_metadata["output_tokens"] <= 6
    chunks = list(chat(6).stream("What is the best book?"))
    streamed = sum(chunks[1:], chunks[0])  # LangChain adds chunks up into one message
    assert 0 < streamed.usage_metadata["output_tokens"] <= 6
    llm = chat(40)
    called = llm.bind_tools([{"type": "function", "function": {"name": WEATHER["name"],
                                                               "parameters": WEATHER["parameters"]}}],
                            tool_choice="get_weather").invoke(ASK)
    (call,) = called.tool_calls
    assert call["name"] == "get_weather" and not called.invalid_tool_calls
    jsonschema.validate(call["args"], WEATHER["parameters"])
    city = llm.with_structured_output(City, method="json_schema", strict=True).invoke("Name a city.")
    assert isinstance(city, City) and 0 <= city.population <= 99


# ------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("fields, param", [
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"tool_choice": "required"}, "tool_choice"),  # required, and no tools to call
])
def test_bad_fields_are_400_naming_the_field(openai_client: openai.OpenAI, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.responses.create(model="m", input="hi", **fields)
    error = info.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == param and param in error["message"]


def test_missing_input_and_unknown_items_are_400(live_server: KineticServer) -> None:
    r = httpx.post(live_server.url + "/v1/responses", json={"model": "m"})
    assert r.status_code == 400 and "input" in r.json()["error"]["message"]
    r = httpx.post(live_server.url + "/responses", json={"input": [{"type": "item_reference", "id": "x"}]})
    assert r.status_code == 400 and "type of the item" in r.json()["error"]["message"]
