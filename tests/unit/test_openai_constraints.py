"""Turning response_format, json_schema, grammar and tool_choice into one grammar (no model needed)."""

from __future__ import annotations

from typing import Any

import pytest

from kinetic.chat.constraints import ChatConstraints, bounded_integers
from kinetic.chat.constraints import chat_constraints as neutral_constraints
from kinetic.errors import InvalidRequestError
from kinetic.protocols.openai.translate import to_chat_request
from kinetic.protocols.openai.types import ChatCompletionRequest

MESSAGES = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]


def request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, **fields)


def chat_constraints(req: ChatCompletionRequest) -> ChatConstraints:
    """The OpenAI translator's neutral request, compiled by the chat layer."""
    return neutral_constraints(to_chat_request(req))


def test_no_constraints() -> None:
    c = chat_constraints(request())
    assert c.grammar is None and c.tool_mode == "none" and c.tools is None


def test_json_object_and_schema_make_grammars() -> None:
    assert chat_constraints(request(response_format={"type": "json_object"})).grammar.count("root ::=") == 1
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    json_schema = {"name": "a", "schema": schema, "strict": True}
    grammar = chat_constraints(request(response_format={"type": "json_schema", "json_schema": json_schema})).grammar
    assert grammar is not None and "answer" in grammar
    assert "answer" in (chat_constraints(request(json_schema=schema)).grammar or "")
    assert chat_constraints(request(response_format={"type": "text"})).grammar is None


@pytest.mark.parametrize("fmt, param, words", [
    ({"type": "xml"}, "response_format.type", 'but got: xml'),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": 123}},
     "response_format.json_schema.schema", "invalid JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": 123}}},
     "response_format.json_schema.schema", "invalid JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "hiccup"}}},
     "response_format.json_schema.schema", "hiccup"),
])
def test_bad_response_formats_are_400s_naming_the_field(fmt: dict, param: str, words: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        chat_constraints(request(response_format=fmt))
    assert err.value.status == 400 and err.value.param == param and words in err.value.message


def test_tool_modes() -> None:
    auto = chat_constraints(request(tools=TOOLS))
    assert auto.tool_mode == "auto" and auto.grammar is None and auto.tool_names == ("get_weather", "get_time")
    none = chat_constraints(request(tools=TOOLS, tool_choice="none"))
    assert none.tool_mode == "none" and none.tools is None
    required = chat_constraints(request(tools=TOOLS, tool_choice="required"))
    assert required.tool_mode == "forced" and "get_weather" in required.grammar and "get_time" in required.grammar
    named = chat_constraints(request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert "get_time" in named.grammar and "get_weather" not in named.grammar
    parallel = chat_constraints(request(tools=TOOLS, tool_choice="required", parallel_tool_calls=True))
    assert '"["' in parallel.grammar and '"["' not in required.grammar


@pytest.mark.parametrize("fields, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "grammar": 'root ::= "a"'}, "grammar"),
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "json_schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "hiccup"}}}],
      "tool_choice": "required"}, "tools"),
])
def test_conflicts_and_bad_tools_are_400s(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        chat_constraints(request(**fields))
    assert err.value.param == param


def test_small_integer_ranges_become_enums() -> None:
    schema = {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 3},
        "b": {"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 4},
        "c": {"type": "integer", "minimum": 0, "maximum": 10**6},
        "d": {"type": "integer", "minimum": 0}}}
    props = bounded_integers(schema)["properties"]
    assert props["a"] == {"enum": [0, 1, 2, 3]}
    assert props["b"] == {"enum": [2, 3]}
    assert props["c"] == schema["properties"]["c"] and props["d"] == schema["properties"]["d"]


def test_json_object_without_schema_accepts_any_value() -> None:
    grammar = chat_constraints(request(response_format={"type": "json_object"})).grammar
    assert "root ::= value" in grammar and "value ::= object | array | string" in grammar
    with_schema = chat_constraints(request(response_format={"type": "json_object",
                                                            "schema": {"type": "object"}})).grammar
    assert "root ::= object" in with_schema
