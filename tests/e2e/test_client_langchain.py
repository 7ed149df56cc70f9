"""Client row "LangChain ChatOpenAI": chat with n=1, bind_tools with tool_choice and
parallel_tool_calls=False (also streamed), with_structured_output(method="json_schema", strict=True),
and a tool result sent back, through langchain-openai against `kinetic serve` (bundled base model)."""

from __future__ import annotations

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.server import KineticServer

QUESTION = [HumanMessage("What is the weather in Rome?")]


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"Sunny in {city}"


class Answer(BaseModel):
    """A short structured answer."""

    city: str = Field(max_length=16)
    sunny: bool


@pytest.fixture()
def llm(live_server: KineticServer) -> ChatOpenAI:
    return ChatOpenAI(base_url=live_server.url + "/v1", api_key="sk-test", model="local", temperature=0,
                      max_tokens=40, max_retries=0, timeout=120, n=1)


def test_plain_chat(llm: ChatOpenAI) -> None:
    reply = llm.invoke(QUESTION, max_tokens=4)
    assert isinstance(reply, AIMessage) and isinstance(reply.content, str)
    assert reply.usage_metadata["output_tokens"] <= 4


def test_bind_tools_auto_without_parallel_calls(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools([get_weather], tool_choice="auto", parallel_tool_calls=False)
    # With "auto" the base model answers in free text (it never writes a call by itself, checked
    # greedily on the bundled model): the text stays content and no call is made up from it.
    free = bound.invoke(QUESTION, max_tokens=8)
    assert isinstance(free, AIMessage) and free.tool_calls == [] and free.invalid_tool_calls == []
    assert isinstance(free.content, str) and free.content.strip()
    assert free.response_metadata["finish_reason"] in {"stop", "length"}
    # A reply whose text is a call (here made certain by a grammar on the same "auto" request) is
    # parsed out of the text and reaches LangChain as a well-formed tool call.
    call_shape = {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                      "required": ["city"], "additionalProperties": False}}}
    reply = bound.invoke(QUESTION, extra_body={"json_schema": call_shape})
    assert reply.response_metadata["finish_reason"] == "tool_calls" and not reply.content
    assert reply.invalid_tool_calls == []
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str) and call["id"]


@pytest.mark.parametrize("choice", ["any", "get_weather"])
def test_bind_tools_forced_call(llm: ChatOpenAI, choice: str) -> None:
    reply = llm.bind_tools([get_weather], tool_choice=choice, parallel_tool_calls=False).invoke(QUESTION)
    assert reply.response_metadata["finish_reason"] == "tool_calls"
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str) and call["id"]


def test_bind_tools_streamed(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    chunks = list(bound.stream(QUESTION))
    assert sum(1 for c in chunks if c.tool_call_chunks) >= 2  # name first, then argument pieces
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    (call,) = merged.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    assert merged.invalid_tool_calls == []


def test_structured_output_json_schema_strict(llm: ChatOpenAI) -> None:
    structured = llm.with_structured_output(Answer, method="json_schema", strict=True)
    answer = structured.invoke([HumanMessage("Is it sunny in Rome? Answer as JSON.")])
    assert isinstance(answer, Answer)


def test_tool_result_sent_back(llm: ChatOpenAI, live_server: KineticServer) -> None:
    bound = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    call_message = bound.invoke(QUESTION)
    call = call_message.tool_calls[0]

    def input_tokens(result: str) -> int:
        reply = llm.bind_tools([get_weather]).invoke(
            QUESTION + [call_message, ToolMessage(result, tool_call_id=call["id"])], max_tokens=1)
        assert isinstance(reply, AIMessage)
        return reply.usage_metadata["input_tokens"]

    def n_tokens(text: str) -> int:
        body = {"content": text, "add_special": False}
        return len(httpx.post(live_server.url + "/tokenize", json=body).json()["tokens"])

    # the result reached the prompt word for word: the prompt grows by exactly its extra tokens
    short = get_weather.invoke(call["args"])
    long = short + ", 24 degrees, a light wind from the west and no rain expected before the evening"
    assert input_tokens(long) - input_tokens(short) == n_tokens(long) - n_tokens(short) > 10
    # and the call itself is in it too
    alone = llm.bind_tools([get_weather]).invoke(QUESTION, max_tokens=1)
    assert input_tokens(short) > alone.usage_metadata["input_tokens"] + n_tokens(short) + 5
