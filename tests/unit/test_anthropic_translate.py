"""The Anthropic translator, both directions, with no model."""

from __future__ import annotations

import json

import pytest

from kinetic.chat.types import AnswerFormat, MediaPart, TextPart, ToolCall, ToolChoice
from kinetic.engine.types import Finished, TextDelta, Timings, Usage
from kinetic.errors import (
    ContextOverflowError,
    InvalidRequestError,
    KineticError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    RequestTimeoutError,
    ServerError,
    UnauthorizedError,
    UnavailableError,
)
from kinetic.protocols.anthropic import translate
from kinetic.protocols.anthropic.types import CountTokensRequest, MessagesRequest

TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def messages(**fields: object) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "claude-x", "max_tokens": 64,
                                           "messages": [{"role": "user", "content": "hi"}], **fields})


def finished(text: str) -> Finished:
    return Finished(finish_reason="stop", stop_type="eos", stopping_word="", text=text, tokens=[],
                    usage=Usage(prompt_tokens=10, completion_tokens=4, cached_tokens=6),
                    timings=Timings(cache_n=6, prompt_n=4, prompt_ms=1.0, predicted_n=4, predicted_ms=1.0),
                    id_slot=0, tokens_cached=0, truncated=False)


def answer_format(mode: str = "none") -> AnswerFormat:
    return AnswerFormat(starts_in_reasoning=False, reasoning_format="auto",
                        tool_mode=mode, tool_names=("get_weather",) if mode != "none" else ())  # type: ignore[arg-type]


def test_tool_round_trip_becomes_calls_and_a_tool_turn() -> None:
    req = translate.to_chat_request(messages(system="be brief", messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Rome"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "text", "text": "and tomorrow?"}]}]))
    roles = [m.role for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert req.messages[2].tool_calls == (ToolCall(name="get_weather", arguments={"city": "Rome"}, id="toolu_1"),)
    assert req.messages[3].tool_call_id == "toolu_1" and req.messages[3].text == "sunny"
    assert req.messages[4].text == "and tomorrow?"


def test_consecutive_user_turns_merge_and_their_images_are_kept() -> None:
    req = translate.to_chat_request(messages(messages=[
        {"role": "user", "content": "a"},
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "aGk="}}]}]))
    assert len(req.messages) == 1
    assert req.messages[0].parts == (TextPart("a\n\n"), MediaPart("image", "image", data=b"hi",
                                                                    param="messages[1].content[0].source.data"))


def test_an_image_url_source_is_kept_for_the_backend_to_load() -> None:
    req = translate.to_chat_request(messages(messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is it"},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}]))
    assert req.messages[0].parts == (TextPart("what is it"), MediaPart(
        "image", "image", url="https://example.com/cat.png", param="messages[0].content[1].source.url"))


def test_a_plain_text_document_is_its_text_and_a_pdf_stays_a_document() -> None:
    req = translate.to_chat_request(messages(messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "the notes"}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "aGk="}}]}]))
    assert req.messages[0].parts == (TextPart("the notes"), MediaPart("document", "document",
                                                                      param="messages[0].content[1].source"))


@pytest.mark.parametrize("source, param", [
    ({"type": "base64", "media_type": "image/png", "data": "not base64!"}, "messages[0].content[0].source.data"),
    ({"type": "base64", "media_type": "image/png"}, "messages[0].content[0].source.data"),
    ({"type": "url", "url": "ftp://example.com/cat.png"}, "messages[0].content[0].source.url"),
    ({"type": "url"}, "messages[0].content[0].source.url"),
    ({"type": "file", "file_id": "file_1"}, "messages[0].content[0].source.file_id"),
])
def test_a_bad_image_source_is_a_400_naming_it(source: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        translate.to_chat_request(messages(messages=[{"role": "user", "content": [{"type": "image",
                                                                                    "source": source}]}]))
    assert err.value.param == param


@pytest.mark.parametrize("raw, expected", [
    (None, ToolChoice("auto")), ({"type": "any"}, ToolChoice("required")),
    ({"type": "tool", "name": "get_weather"}, ToolChoice("required", "get_weather")),
    ({"type": "none"}, ToolChoice("none")),
])
def test_tool_choice(raw: dict | None, expected: ToolChoice) -> None:
    assert translate.to_chat_request(messages(tools=[TOOL], tool_choice=raw)).tool_choice == expected


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"thinking": {"type": "enabled", "budget_tokens": 0}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": "50"}}, "thinking.budget_tokens"),
])
def test_bad_fields_are_named(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        translate.to_chat_request(messages(**fields))
    assert err.value.param == param


@pytest.mark.parametrize("budget, max_tokens", [(50, 100), (2048, 1100)])
def test_any_positive_thinking_budget_is_taken_as_llama_server_takes_it(budget: int, max_tokens: int) -> None:
    req = translate.to_chat_request(messages(max_tokens=max_tokens, thinking={"type": "enabled",
                                                                              "budget_tokens": budget}))
    assert req.template_kwargs == {"enable_thinking": True}


def test_empty_messages_are_allowed_on_the_anthropic_route_only() -> None:
    assert translate.to_chat_request(messages(messages=[])).allow_empty


def test_an_image_in_a_tool_result_is_kept() -> None:
    req = translate.to_chat_request(messages(messages=[
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "File: a.png"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="}}]}]}]))
    tool = next(m for m in req.messages if m.role == "tool")
    assert tool.parts == (TextPart("File: a.png"), MediaPart("image", "image", data=b"hi",
                                                             param="messages[2].content[0].content[1].source.data"))


def test_thinking_switches_the_template() -> None:
    req = translate.to_chat_request(messages(max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 1024}))
    assert req.template_kwargs == {"enable_thinking": True}
    count = translate.count_tokens_request(CountTokensRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "disabled"}}))
    assert count.template_kwargs == {"enable_thinking": False}


def test_forced_call_comes_back_as_a_tool_use_block() -> None:
    ctx = translate.message_context(messages(), answer_format("forced"))
    body = translate.to_message([], finished('{"name": "get_weather", "arguments": {"city": "Rome"}}'), ctx)
    assert body["stop_reason"] == "tool_use"
    (block,) = body["content"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather" and block["input"] == {"city": "Rome"}
    assert block["id"].startswith("toolu_")
    assert body["usage"] == {"input_tokens": 4, "output_tokens": 4, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 6}


def events(frames: list[bytes]) -> list[tuple[str, dict]]:
    out = []
    for frame in frames:
        name_line, data_line = frame.decode().strip().split("\n")
        out.append((name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    return out


def test_streamed_forced_call_is_input_json_deltas() -> None:
    encoder = translate.EventEncoder(translate.message_context(messages(), answer_format("forced")))
    frames = []
    for piece in ['{"name": "get_weather", ', '"arguments": {"ci', 'ty": "Rome"}}']:
        frames += encoder.encode(TextDelta(text=piece, token_id=0))
    frames += encoder.encode(finished('{"name": "get_weather", "arguments": {"city": "Rome"}}'))
    seen = events(frames)
    names = [name for name, _ in seen]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = next(data for name, data in seen if name == "content_block_start")
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "get_weather"
    partial = "".join(data["delta"]["partial_json"] for name, data in seen
                      if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Rome"}
    assert seen[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert names.count("content_block_start") == names.count("content_block_stop") == 1


@pytest.mark.parametrize("err, kind", [
    (InvalidRequestError("x"), "invalid_request_error"), (ContextOverflowError(9, 4), "invalid_request_error"),
    (UnauthorizedError("x"), "authentication_error"), (NotFoundError("x"), "not_found_error"),
    (RequestTimeoutError("x"), "timeout_error"), (PayloadTooLargeError("x"), "request_too_large"),
    (RateLimitError("x"), "rate_limit_error"), (UnavailableError("x"), "overloaded_error"),
    (ServerError("x"), "api_error"),
])
def test_error_types_by_kind(err: KineticError, kind: str) -> None:
    assert translate.error_body(err) == {"type": "error", "error": {"type": kind, "message": err.message}}
