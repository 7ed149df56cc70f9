"""The pure tool-call helpers: the forcing schema, the syntax parsers and the stream assemblers."""

from __future__ import annotations

import json

import pytest

from kinetic.chat.toolcalls import (
    AutoCallStream,
    ForcedCallStreamer,
    parse_forced_calls,
    parse_tool_calls,
    split_arguments,
    tool_call_schema,
)
from kinetic.protocols.openai.translate import call_delta

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def assemble(deltas) -> dict[int, dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        d = call_delta(delta)
        call = calls.setdefault(d["index"], {"id": "", "name": "", "arguments": ""})
        if "id" in d:
            assert not call["id"], "id sent twice for one call"
            call["id"], call["name"] = d["id"], d["function"]["name"]
        else:
            assert "id" not in d["function"]
        call["arguments"] += d["function"]["arguments"]
    return calls


def test_schema_single_tool_names_it_first() -> None:
    schema = tool_call_schema([WEATHER])
    assert list(schema["properties"]) == ["name", "arguments"]
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["properties"]["arguments"]["required"] == ["city"]


def test_schema_several_tools_named_choice_and_parallel() -> None:
    assert len(tool_call_schema([WEATHER, TIME])["anyOf"]) == 2
    named = tool_call_schema([WEATHER, TIME], only="get_time")
    assert named["properties"]["name"] == {"const": "get_time"}
    assert named["properties"]["arguments"] == {"type": "object"}  # no parameters: any object
    single, array = tool_call_schema([WEATHER], parallel=True)["anyOf"]
    assert single == tool_call_schema([WEATHER])
    assert array["type"] == "array" and array["minItems"] == 1 and array["items"] == single
    with pytest.raises(ValueError):
        tool_call_schema([WEATHER], only="nope")


@pytest.mark.parametrize("text, content, calls", [
    ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
     "Sure.", [("get_weather", {"city": "Rome"})]),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>',
     "", [("a", {}), ("b", {"x": 1})]),
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "abc123xyz"}]',
     "", [("get_weather", {"city": "Oslo"})]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time[ARGS]{}',
     "", [("get_weather", {"city": "Oslo"}), ("get_time", {})]),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lima"}}<|eom_id|>',
     "", [("get_weather", {"city": "Lima"})]),
    ('{"name": "get_weather", "parameters": {"city": "Lima"}}', "", [("get_weather", {"city": "Lima"})]),
    ('```json\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n```', "", [("get_weather", {"city": "Rome"})]),
    ('[{"name": "get_weather", "arguments": {"city": "A"}}, {"name": "get_time", "arguments": {}}]',
     "", [("get_weather", {"city": "A"}), ("get_time", {})]),
    ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}', "", [("get_weather", {"city": "Rome"})]),
])
def test_parsers_find_calls(text: str, content: str, calls: list[tuple[str, dict]]) -> None:
    reply = parse_tool_calls(text, ["get_weather", "get_time"])
    assert reply.content == content
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == calls


def test_mistral_keeps_model_id() -> None:
    reply = parse_tool_calls('[TOOL_CALLS][{"name": "get_time", "arguments": {}, "id": "abc123xyz"}]', ["get_time"])
    assert reply.calls[0].id == "abc123xyz"


@pytest.mark.parametrize("text", [
    "The weather in Rome is sunny.",
    '{"name": "Alice", "age": 3}',  # JSON, but not naming a tool
    '{"name": "unknown_tool", "arguments": {}}',
    '<tool_call>not json</tool_call>',
    "",
])
def test_plain_answers_are_content(text: str) -> None:
    reply = parse_tool_calls(text, ["get_weather"])
    assert reply.calls == [] and reply.content == text


def test_forced_calls_parse_or_report_truncation() -> None:
    calls = parse_forced_calls('{ "name": "get_weather", "arguments": { "city": "Rome" } }')
    assert calls is not None and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Rome"}
    assert len(parse_forced_calls('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]') or []) == 2
    assert parse_forced_calls('{ "name": "get_weather", "arguments": { "ci') is None


@pytest.mark.parametrize("text", [
    '{ "name": "get_weather", "arguments": { "city": "Ro\\"me}", "n": [1, {"a": 2}] } }',
    '[{"name": "a", "arguments": {"x": 1}} , {"name": "b", "arguments": {}}]',
    '{"name":"get_time","arguments":{}}',
])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_forced_streamer_matches_whole_parse(text: str, step: int) -> None:
    streamer = ForcedCallStreamer()
    deltas = []
    for i in range(0, len(text), step):
        deltas += streamer.feed(text[i:i + step])
    streamed = assemble(deltas)
    expected = parse_forced_calls(text)
    assert expected is not None
    assert [c["name"] for c in streamed.values()] == [c.name for c in expected]
    assert [json.loads(c["arguments"]) for c in streamed.values()] == [json.loads(c.arguments) for c in expected]
    assert all(len(c["id"]) == 32 and c["id"].isalnum() for c in streamed.values())
    if step == 1:  # arguments arrive in pieces, not in one delta at the end
        assert len(deltas) > len(streamed)


def test_forced_streamer_announces_name_before_arguments_finish() -> None:
    streamer = ForcedCallStreamer()
    first = streamer.feed('{"name": "get_weather", "arguments": {"ci')
    assert [call_delta(d)["function"]["name"] for d in first] == ["get_weather"]
    rest = streamer.feed('ty": "Rome"}}')
    assert first[0].arguments + "".join(d.arguments for d in rest) == '{"city": "Rome"}'


def test_auto_stream_releases_text_and_holds_calls() -> None:
    stream = AutoCallStream(["get_weather"])
    assert stream.push("Let me check. <tool") == "Let me check."
    assert stream.push('_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>') == ""
    content, calls = stream.finish()
    assert content == "" and [c.name for c in calls] == ["get_weather"]


def test_auto_stream_gives_back_text_that_was_not_a_call() -> None:
    stream = AutoCallStream(["get_weather"])
    assert stream.push("a <to") == "a"
    assert stream.push("day") == " <today"
    assert stream.finish() == ("", [])
    bare = AutoCallStream(["get_weather"])
    assert bare.push('{"answer": 4') == ""
    assert bare.push("2}") == ""
    assert bare.finish() == ('{"answer": 42}', [])


def test_split_arguments_keeps_text() -> None:
    pieces = split_arguments('{"city": "Rome"}')
    assert len(pieces) == 2 and "".join(pieces) == '{"city": "Rome"}'
    assert split_arguments("{") == ["{"]
