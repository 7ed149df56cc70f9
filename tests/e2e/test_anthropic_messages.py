"""/v1/messages through the real anthropic SDK (the lab's Anthropic variant), on the bundled model."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.server import KineticServer

MESSAGES = [{"role": "user", "content": "What is llama.cpp?"}]
# this SDK version has no temperature argument; the field still goes out in the body
GREEDY = {"temperature": 0}


@pytest.fixture()
def client(live_server: KineticServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live_server.url, api_key="nokey", max_retries=0)


def test_create_message_shape_and_usage(client: anthropic.Anthropic) -> None:
    r = client.messages.create(model="local", max_tokens=12, system="Be brief.", messages=MESSAGES,
                               extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_") and r.model == "local"
    assert r.stop_reason in {"end_turn", "max_tokens"} and r.stop_sequence is None
    assert 0 < r.usage.output_tokens <= 12 and r.usage.input_tokens > 0
    # the greedy answer to this prompt is text (checked on the bundled model), so there is a block to check
    assert r.content and all(block.type == "text" for block in r.content)
    assert "".join(block.text for block in r.content).strip()
    if r.stop_reason == "max_tokens":
        assert r.usage.output_tokens == 12


def test_repeat_reads_the_cache(client: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "Cache this prompt for the Anthropic route, please."}]
    client.messages.create(model="local", max_tokens=2, messages=messages)
    r = client.messages.create(model="local", max_tokens=2, messages=messages)
    assert r.usage.cache_read_input_tokens > 0
    total = r.usage.input_tokens + r.usage.cache_read_input_tokens
    assert total == client.messages.count_tokens(model="local", messages=messages).input_tokens


def test_stream_helper_accumulates_text(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="local", max_tokens=10, messages=MESSAGES,
                                extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == "".join(b.text for b in final.content if b.type == "text")
    assert final.stop_reason in {"end_turn", "max_tokens"} and final.usage.output_tokens <= 10


def test_raw_stream_event_order(client: anthropic.Anthropic) -> None:
    events = [e.type for e in client.messages.create(model="local", max_tokens=5, messages=MESSAGES, stream=True)]
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    assert events.count("content_block_start") == events.count("content_block_stop")


def test_stop_sequence_is_reported(client: anthropic.Anthropic) -> None:
    # Greedy decoding is deterministic: read the answer first, then stop on a piece of its middle,
    # which is therefore certain to come up again. The logits of a prompt resumed from the KV cache
    # are not bit-identical to a whole evaluation (and this route has no cache_prompt), so a first
    # call caches the prompt and both compared runs resume from it alike.
    client.messages.create(model="local", max_tokens=1, messages=MESSAGES, extra_body=GREEDY)
    probe = client.messages.create(model="local", max_tokens=12, messages=MESSAGES, extra_body=GREEDY)
    text = "".join(b.text for b in probe.content if b.type == "text")
    assert probe.stop_reason == "max_tokens" and len(text) >= 12, text  # the bundled model's greedy answer
    stop = text[len(text) // 2:len(text) // 2 + 3]
    r = client.messages.create(model="local", max_tokens=12, messages=MESSAGES, stop_sequences=["NEVER!", stop],
                               extra_body=GREEDY)
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert "".join(b.text for b in r.content if b.type == "text") == text[:text.index(stop)]
    assert r.usage.output_tokens < probe.usage.output_tokens


def tool_round_trip(result: str) -> list[dict]:
    return [{"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Rome"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}]}]


def test_tool_round_trip_is_rendered(client: anthropic.Anthropic, live_server: KineticServer) -> None:
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    short, long = "sunny", "Sunny, 24 degrees, light wind from the west, no rain expected today"

    def counted(result: str) -> int:
        return client.messages.count_tokens(model="local", tools=tools, messages=tool_round_trip(result)).input_tokens

    def n_tokens(text: str) -> int:
        tokens = httpx.post(live_server.url + "/tokenize", json={"content": text, "add_special": False}).json()
        return len(tokens["tokens"])

    # The prompt grows by exactly the tool result's own tokens: the result is in it, word for word.
    assert counted(long) - counted(short) == n_tokens(long) - n_tokens(short) > 10
    r = client.messages.create(model="local", max_tokens=3, tools=tools, messages=tool_round_trip(long),
                               extra_body=GREEDY)
    assert r.usage.output_tokens <= 3
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == counted(long)  # the request read that prompt


def test_errors_use_the_anthropic_envelope(client: anthropic.Anthropic, live_server: KineticServer) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="local", max_tokens=0, messages=MESSAGES)
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in info.value.body["error"]["message"]
    r = httpx.post(live_server.url + "/v1/messages", json={"model": "x", "messages": MESSAGES})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    image = [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                       "data": "AAAA"}}]}]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="local", max_tokens=3, messages=image)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in info.value.body["error"]["message"]
