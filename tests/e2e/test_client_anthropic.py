"""Client row "Anthropic Python SDK": tool use (forced through `tool_choice` any / tool, created and
streamed), a tool result sent back, `thinking`, and a wrong key, through the real anthropic SDK
against `kinetic serve` on the bundled (base) model.

Forced calls are grammar-constrained, so even this small model gives a valid `tool_use` input;
free text is never checked for wording."""

from __future__ import annotations

import anthropic
import httpx
import jsonschema
import pytest

from tests.server import KEYED_SERVER_KEY, KineticServer

KEY = KEYED_SERVER_KEY  # the session's keyed_server (tests/conftest.py)
ASK = [{"role": "user", "content": "What is the weather in Rome?"}]
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                            "required": ["city"], "additionalProperties": False}}
TIME = {"name": "get_time", "description": "Current time in a timezone",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
                         "required": ["zone"], "additionalProperties": False}}
# anthropic 2.10 has no `temperature` argument; the server reads it from the body
GREEDY = {"temperature": 0}
SCHEMAS = {"get_weather": WEATHER["input_schema"], "get_time": TIME["input_schema"]}


@pytest.fixture()
def client(live_server: KineticServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live_server.url, api_key="nokey", max_retries=0, timeout=120)


# --------------------------------------------------------------------------- tool use


def test_tool_choice_any_gives_a_valid_tool_use_block(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model="local", max_tokens=40, messages=ASK, tools=[WEATHER, TIME],
                               tool_choice={"type": "any"}, extra_body=GREEDY)
    assert r.stop_reason == "tool_use"
    (block,) = r.content
    assert block.type == "tool_use" and block.id.startswith("toolu_") and block.name in SCHEMAS
    jsonschema.validate(block.input, SCHEMAS[block.name])


def test_tool_choice_tool_calls_that_tool(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model="local", max_tokens=30, messages=ASK, tools=[WEATHER, TIME],
                               tool_choice={"type": "tool", "name": "get_time"}, extra_body=GREEDY)
    assert r.stop_reason == "tool_use"
    (block,) = [b for b in r.content if b.type == "tool_use"]
    assert block.name == "get_time"
    jsonschema.validate(block.input, TIME["input_schema"])


def test_stream_helper_assembles_the_streamed_tool_use(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="local", max_tokens=40, messages=ASK, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}, extra_body=GREEDY) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts] == ["tool_use"] and starts[0].content_block.name == "get_weather"
    partial = "".join(e.delta.partial_json for e in events
                      if e.type == "content_block_delta" and e.delta.type == "input_json_delta")
    assert partial  # the input came as input_json_delta pieces
    assert kinds.count("content_block_stop") == 1
    (block,) = final.content
    assert block.type == "tool_use" and block.id == starts[0].content_block.id
    jsonschema.validate(block.input, WEATHER["input_schema"])
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0


def test_stream_sends_ping_after_message_start(live_server: KineticServer) -> None:
    # The SDK drops `ping` events before the caller sees them, so this reads the wire.
    body = {"model": "local", "max_tokens": 30, "messages": ASK, "tools": [TIME], "tool_choice": {"type": "any"},
            "stream": True, "temperature": 0}
    with httpx.stream("POST", live_server.url + "/v1/messages", json=body, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert events[:3] == ["message_start", "ping", "content_block_start"]
    assert events[-2:] == ["message_delta", "message_stop"]


def test_tool_choice_none_answers_in_text(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model="local", max_tokens=8, messages=ASK, tools=[WEATHER],
                               tool_choice={"type": "none"}, extra_body=GREEDY)
    # the greedy answer here is text (checked on the bundled model), so there are blocks to check
    assert r.content and all(b.type == "text" for b in r.content) and r.stop_reason in {"end_turn", "max_tokens"}


def _round_trip(result: str) -> list[dict]:
    return [*ASK,
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Rome"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}]


def test_tool_result_reaches_the_prompt(client: anthropic.Anthropic, live_server: KineticServer) -> None:
    short = client.messages.count_tokens(model="local", tools=[WEATHER], messages=_round_trip("sunny")).input_tokens
    long_result = "sunny, 24 degrees, light wind from the north-west, humidity 40 percent"
    long = client.messages.count_tokens(model="local", tools=[WEATHER], messages=_round_trip(long_result))

    def n_tokens(text: str) -> int:
        body = {"content": text, "add_special": False}
        return len(httpx.post(live_server.url + "/tokenize", json=body).json()["tokens"])

    # the prompt grows by exactly the result's extra tokens: the result is in it word for word
    assert long.input_tokens - short == n_tokens(long_result) - n_tokens("sunny") > 10
    r = client.messages.create(model="local", max_tokens=4, tools=[WEATHER], messages=_round_trip(long_result))
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == long.input_tokens
    # and the model may call again after the result: a forced second call is a valid tool_use
    again = client.messages.create(model="local", max_tokens=40, tools=[WEATHER, TIME], extra_body=GREEDY,
                                   tool_choice={"type": "tool", "name": "get_time"},
                                   messages=_round_trip(long_result))
    (block,) = again.content
    assert block.name == "get_time"
    jsonschema.validate(block.input, TIME["input_schema"])


# --------------------------------------------------------------------------- thinking


@pytest.mark.parametrize("thinking", [{"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}])
def test_thinking_is_accepted(client: anthropic.Anthropic, thinking: dict) -> None:
    # A budget needs max_tokens above it; the stream is closed after its start, which frees the slot.
    with client.messages.stream(model="local", max_tokens=1100, messages=ASK, thinking=thinking) as stream:
        first = next(iter(stream))
    assert first.type == "message_start" and first.message.role == "assistant"
    counted = client.messages.count_tokens(model="local", messages=ASK, thinking=thinking)
    assert counted.input_tokens > 0


def test_a_small_thinking_budget_is_taken_as_llama_server_takes_it(client: anthropic.Anthropic) -> None:
    # llama.cpp's own server tests send budget_tokens 50 with max_tokens 100 (Anthropic's API wants >= 1024).
    reply = client.messages.create(model="local", max_tokens=8, messages=ASK,
                                   thinking={"type": "enabled", "budget_tokens": 4})
    assert reply.type == "message" and reply.usage.output_tokens <= 8


@pytest.mark.parametrize("budget", [0, "50"])
def test_a_bad_thinking_budget_is_refused(client: anthropic.Anthropic, budget: object) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="local", max_tokens=16, messages=ASK,
                               thinking={"type": "enabled", "budget_tokens": budget})  # type: ignore[typeddict-item]
    assert info.value.status_code == 400 and info.value.body["error"]["type"] == "invalid_request_error"
    assert "thinking.budget_tokens" in info.value.body["error"]["message"]


# --------------------------------------------------------------------------- llama-server's leniency, and images


def test_empty_messages_get_an_answer_as_on_llama_server(client: anthropic.Anthropic) -> None:
    # llama-server renders an empty list as just the generation prompt (its tests expect 200).
    reply = client.messages.create(model="local", max_tokens=4, messages=[])
    assert reply.type == "message" and reply.role == "assistant" and 1 <= reply.usage.output_tokens <= 4
    assert reply.usage.input_tokens >= 1


RED_PIXEL = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": RED_PIXEL}}


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": [IMAGE, {"type": "text", "text": "What is this?"}]}],
    [{"role": "user", "content": "What is in this image?"},
     {"role": "assistant", "content": [{"type": "tool_use", "id": "tool_1", "name": "read", "input": {"f": "a.png"}}]},
     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tool_1",
                                   "content": [{"type": "text", "text": "File: a.png"}, IMAGE]}]}],
], ids=["image-block", "image-in-tool-result"])
def test_an_image_on_a_text_model_is_one_400_the_sdk_does_not_retry(live_server: KineticServer,
                                                                     messages: list) -> None:
    # llama-server answers 500 here; kinetic answers 400 on purpose (docs/reference/http-llamacpp.md,
    # "Differences from llama-server"): the SDK retries a 5xx twice, a 400 it raises at once.
    import httpx2  # the anthropic SDK's own HTTP client package

    sent: list[httpx2.Request] = []
    http = httpx2.Client(event_hooks={"request": [sent.append]}, timeout=120)
    sdk = anthropic.Anthropic(base_url=live_server.url, api_key="nokey", max_retries=2, http_client=http)
    with pytest.raises(anthropic.BadRequestError) as info:
        sdk.messages.create(model="local", max_tokens=8, messages=messages)
    assert len(sent) == 1
    error = info.value.body["error"]
    assert error["type"] == "invalid_request_error" and "image input is not supported" in error["message"].lower()


# --------------------------------------------------------------------------- keys


def test_wrong_key_raises_authentication_error(keyed_server: KineticServer) -> None:
    wrong = anthropic.Anthropic(base_url=keyed_server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        wrong.messages.create(model="local", max_tokens=2, messages=ASK)
    assert info.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                          "message": "Invalid API Key"}}
    right = anthropic.Anthropic(base_url=keyed_server.url, api_key=KEY, max_retries=0)
    assert right.messages.create(model="local", max_tokens=2, messages=ASK).usage.output_tokens <= 2
    # the SDK sends the key as x-api-key; a Bearer header is accepted too
    r = httpx.post(keyed_server.url + "/v1/messages/count_tokens", json={"messages": ASK},
                   headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
