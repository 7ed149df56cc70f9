"""The OpenAI Responses translator, both directions, with no model."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from kinetic.chat.types import AnswerFormat, MediaPart, TextPart, ToolCall, ToolChoice
from kinetic.engine.types import Finished, PromptProgress, TextDelta, Timings, Usage
from kinetic.errors import InvalidRequestError, ServerError
from kinetic.protocols.responses import translate
from kinetic.protocols.responses.types import ResponsesRequest

TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def request(**fields: object) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "gpt-x", "input": "hi", **fields})


def finished(text: str, reason: str = "stop") -> Finished:
    return Finished(finish_reason=reason, stop_type="eos" if reason == "stop" else "limit",  # type: ignore[arg-type]
                    stopping_word="", text=text, tokens=[],
                    usage=Usage(prompt_tokens=10, completion_tokens=4, cached_tokens=6),
                    timings=Timings(cache_n=6, prompt_n=4, prompt_ms=1.0, predicted_n=4, predicted_ms=1.0),
                    id_slot=0, tokens_cached=0, truncated=False)


def answer_format(mode: str = "none", reasoning: bool = False) -> AnswerFormat:
    return AnswerFormat(starts_in_reasoning=reasoning, reasoning_format="auto",
                        tool_mode=mode, tool_names=("get_weather",) if mode != "none" else ())  # type: ignore[arg-type]


def context(req: ResponsesRequest, prep: AnswerFormat) -> translate.ResponseContext:
    return translate.response_context(req, prep, model="served")


# --------------------------------------------------------------------------------- inward


def test_string_input_and_instructions() -> None:
    req = translate.to_chat_request(request(instructions="be brief", max_output_tokens=7))
    assert [(m.role, m.text) for m in req.messages] == [("system", "be brief"), ("user", "hi")]
    assert req.options.max_tokens == 7


def test_items_become_turns_and_assistant_items_join_one_turn() -> None:
    req = translate.to_chat_request(request(input=[
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "and tomorrow?"},
    ], tools=[TOOL]))
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "user"]
    assistant = req.messages[2]
    assert assistant.text == "Let me look."
    assert assistant.tool_calls == (ToolCall(name="get_weather", arguments={"city": "Rome"}, id="call_1"),)
    assert req.messages[3].tool_call_id == "call_1" and req.messages[3].text == "sunny"
    assert req.tools[0].name == "get_weather" and req.tools[0].parameters == TOOL["parameters"]


def test_a_call_alone_is_an_assistant_turn_and_reasoning_joins_it() -> None:
    req = translate.to_chat_request(request(input=[
        {"role": "user", "content": "x"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "not json"},
    ]))
    (_, assistant) = req.messages
    assert assistant.role == "assistant" and assistant.reasoning_content == "think"
    assert assistant.tool_calls == (ToolCall(name="get_weather", arguments="not json", id="c"),)


def test_images_and_audio_become_media_parts_and_files_are_refused() -> None:
    req = translate.to_chat_request(request(input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is it"},
        {"type": "input_image", "image_url": "data:image/png;base64,aGk=", "detail": "auto"},
        {"type": "input_image", "image_url": "https://example.com/a.png"},
        {"type": "input_audio", "input_audio": {"data": "aGk=", "format": "mp3"}}]}]))
    assert req.messages[0].parts == (
        TextPart("what is it"),
        MediaPart("input_image", "image", data=b"hi", param="input[0].content[1].image_url"),
        MediaPart("input_image", "image", url="https://example.com/a.png", param="input[0].content[2].image_url"),
        MediaPart("input_audio", "audio", data=b"hi", param="input[0].content[3].input_audio.data"))
    with pytest.raises(InvalidRequestError) as err:
        translate.to_chat_request(request(input=[{"role": "user", "content": [{"type": "input_file"}]}]))
    assert err.value.param == "input[0].content[0].type"


def test_an_image_a_tool_returned_is_a_media_part_of_the_tool_turn() -> None:
    req = translate.to_chat_request(request(input=[
        {"type": "function_call_output", "call_id": "c", "output": [
            {"type": "input_image", "image_url": "data:image/png;base64,aGk="}]}]))
    image = MediaPart("input_image", "image", data=b"hi", param="input[0].output[0].image_url")
    assert req.messages[0].parts == (image,)


@pytest.mark.parametrize("part, param", [
    ({"type": "input_image", "file_id": "file-abc"}, "input[0].content[0].file_id"),
    ({"type": "input_image"}, "input[0].content[0].image_url"),
    ({"type": "input_image", "image_url": "data:image/png;base64,!!"}, "input[0].content[0].image_url"),
    ({"type": "input_image", "image_url": "gopher://example.com/a.png"}, "input[0].content[0].image_url"),
    ({"type": "input_audio"}, "input[0].content[0].input_audio.data"),
])
def test_a_bad_image_is_a_400_naming_its_field(part: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        translate.to_chat_request(request(input=[{"role": "user", "content": [part]}]))
    assert err.value.param == param


def test_an_unknown_item_type_fails_validation() -> None:
    with pytest.raises(ValidationError, match="Cannot determine the type of the item"):
        request(input=[{"type": "item_reference", "id": "x"}])


@pytest.mark.parametrize("raw, expected", [
    (None, ToolChoice("auto")), ("none", ToolChoice("none")), ("required", ToolChoice("required")),
    ({"type": "function", "name": "get_weather"}, ToolChoice("required", "get_weather")),
])
def test_tool_choice(raw: object, expected: ToolChoice) -> None:
    assert translate.to_chat_request(request(tools=[TOOL], tool_choice=raw)).tool_choice == expected


def test_only_function_tools_are_kept() -> None:
    req = translate.to_chat_request(request(tools=[{"type": "web_search"}, {**TOOL, "strict": True}]))
    assert [t.name for t in req.tools] == ["get_weather"] and req.tools[0].extra == {"strict": True}


def test_text_format_becomes_the_output_constraint() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    out = translate.to_chat_request(request(text={"format": {"type": "json_schema", "name": "x", "schema": schema,
                                                             "strict": True}})).output
    assert out.schema == schema and out.param == "text.format.schema"
    assert translate.to_chat_request(request(text={"format": {"type": "json_object"}})).output.any_json
    assert not translate.to_chat_request(request(text={"format": {"type": "text"}})).output.is_set


@pytest.mark.parametrize("fields, param", [
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"input": []}, "input"),
    ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation"),
    ({"conversation": {"name": "x"}}, "conversation"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ({"tool_choice": {"type": "function"}}, "tool_choice.name"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "schema": []}}}, "text.format.schema"),
    ({"tools": [{"type": "function"}]}, "tools[0].name"),
])
def test_bad_fields_are_named(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        translate.to_chat_request(request(**fields))
    assert err.value.param == param and param.split("[")[0].split(".")[0] in err.value.message


# -------------------------------------------------------------------------------- outward


def test_text_answer_is_a_message_item_with_usage_and_timings() -> None:
    ctx = context(request(max_output_tokens=4), answer_format())
    body = translate.to_response([], finished("Hello"), ctx)
    assert body["id"].startswith("resp_") and len(body["id"]) == 5 + 32
    assert body["object"] == "response" and body["status"] == "completed" and body["model"] == "served"
    (item,) = body["output"]
    assert item["type"] == "message" and item["id"].startswith("msg_") and item["role"] == "assistant"
    assert item["content"] == [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}]
    assert body["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 6}, "output_tokens": 4,
                             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 14}
    assert body["timings"]["prompt_n"] == 4 and body["incomplete_details"] is None
    assert body["max_output_tokens"] == 4 and body["text"] == {"format": {"type": "text"}}


def test_the_token_limit_is_said_in_incomplete_details() -> None:
    body = translate.to_response([], finished("Hel", "length"), context(request(), answer_format()))
    assert body["status"] == "completed" and body["incomplete_details"] == {"reason": "max_output_tokens"}


def test_forced_call_is_a_function_call_item() -> None:
    ctx = context(request(tools=[TOOL], tool_choice="required"), answer_format("forced"))
    body = translate.to_response([], finished('{"name": "get_weather", "arguments": {"city": "Rome"}}'), ctx)
    (item,) = body["output"]
    assert item["type"] == "function_call" and item["name"] == "get_weather" and item["status"] == "completed"
    assert json.loads(item["arguments"]) == {"city": "Rome"}
    assert item["id"] == "fc_" + item["call_id"].removeprefix("call_")
    assert body["tools"][0]["name"] == "get_weather" and body["tool_choice"] == "required"


def test_reasoning_comes_first_as_its_own_item() -> None:
    body = translate.to_response([], finished("why</think>Paris"),
                                 context(request(), answer_format(reasoning=True)))
    assert [i["type"] for i in body["output"]] == ["reasoning", "message"]
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": "why"}]


def events(frames: list[bytes]) -> list[tuple[str, dict]]:
    out = []
    for frame in frames:
        name_line, data_line = frame.decode().strip().split("\n")
        name = name_line.removeprefix("event: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out


def stream(ctx: translate.ResponseContext, pieces: list[str], last: Finished) -> list[tuple[str, dict]]:
    encoder = translate.EventEncoder(ctx)
    frames = []
    for piece in pieces:
        frames += encoder.encode(TextDelta(text=piece, token_id=0))
    return events(frames + encoder.encode(last))


def test_streamed_text_events_in_order() -> None:
    seen = stream(context(request(), answer_format()), ["Hel", "lo"], finished("Hello"))
    assert [name for name, _ in seen] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [data["sequence_number"] for _, data in seen] == list(range(len(seen)))
    item_id = seen[2][1]["item"]["id"]
    assert all(data["item_id"] == item_id for _, data in seen[3:8])
    assert seen[6][1]["text"] == "Hello" and seen[8][1]["item"]["content"][0]["text"] == "Hello"
    completed = seen[-1][1]
    assert completed["response"]["status"] == "completed" and completed["response"]["usage"]["output_tokens"] == 4
    assert completed["response"]["output"] == [seen[8][1]["item"]] and completed["timings"]["predicted_n"] == 4
    assert seen[0][1]["response"]["status"] == "in_progress" and seen[0][1]["response"]["output"] == []


def test_streamed_forced_call_is_argument_deltas() -> None:
    text = '{"name": "get_weather", "arguments": {"city": "Rome"}}'
    seen = stream(context(request(tools=[TOOL], tool_choice="required"), answer_format("forced")),
                  ['{"name": "get_weather", ', '"arguments": {"ci', 'ty": "Rome"}}'], finished(text))
    names = [name for name, _ in seen]
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert names[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    added = seen[2][1]["item"]
    assert added["type"] == "function_call" and added["name"] == "get_weather" and added["status"] == "in_progress"
    deltas = "".join(data["delta"] for name, data in seen if name == "response.function_call_arguments.delta")
    assert json.loads(deltas) == {"city": "Rome"}
    assert seen[-3][1]["arguments"] == deltas and seen[-3][1]["item_id"] == added["id"]
    (item,) = seen[-1][1]["response"]["output"]
    assert item["call_id"] == added["call_id"] and item["arguments"] == deltas and item["status"] == "completed"


def test_streamed_reasoning_is_its_own_item_before_the_message() -> None:
    seen = stream(context(request(), answer_format(reasoning=True)), ["why", "</think>", "Paris"],
                  finished("why</think>Paris"))
    items = [(name, data["item"]["type"]) for name, data in seen if name.startswith("response.output_item.")]
    assert items == [("response.output_item.added", "reasoning"), ("response.output_item.done", "reasoning"),
                     ("response.output_item.added", "message"), ("response.output_item.done", "message")]
    reasoning = "".join(data["delta"] for name, data in seen if name == "response.reasoning_text.delta")
    assert reasoning == "why" and [d["output_index"] for n, d in seen if n == "response.output_text.delta"] == [1]
    output = seen[-1][1]["response"]["output"]
    assert [i["type"] for i in output] == ["reasoning", "message"] and output[1]["content"][0]["text"] == "Paris"


def test_prompt_progress_is_on_response_in_progress_events_and_timings_on_each_tokens_last_event() -> None:
    """llama-server's return_progress and timings_per_token on a Responses stream (its
    test_responses_stream_with_llama_telemetry): the first progress opens the response, later ones are more
    response.in_progress events; each carries prompt_progress, and with timings_per_token the timings so far."""
    req = request(stream=True, return_progress=True, timings_per_token=True)
    assert translate.to_chat_request(req).options.return_progress
    assert not translate.to_chat_request(request(return_progress=True)).options.return_progress  # a stream's only
    encoder = translate.EventEncoder(context(req, answer_format()))
    frames = encoder.encode(PromptProgress(total=40, cache=0, processed=0, time_ms=0.0))
    frames += encoder.encode(PromptProgress(total=40, cache=0, processed=32, time_ms=5.0))
    frames += encoder.encode(TextDelta(text="Hi", token_id=0, timings=Timings(0, 40, 7.0, 1, 0.0)))
    seen = events(frames + encoder.encode(finished("Hi")))
    progress = [(name, data["prompt_progress"]) for name, data in seen if "prompt_progress" in data]
    assert progress == [("response.in_progress", {"total": 40, "cache": 0, "processed": 0, "time_ms": 0.0}),
                        ("response.in_progress", {"total": 40, "cache": 0, "processed": 32, "time_ms": 5.0})]
    assert [name for name, _ in seen][:3] == ["response.created", "response.in_progress", "response.in_progress"]
    timed = [(name, data["timings"]) for name, data in seen if "timings" in data]
    assert [name for name, _ in timed] == ["response.in_progress", "response.in_progress",
                                           "response.output_text.delta", "response.completed"]
    assert timed[1][1]["prompt_n"] == 32 and timed[1][1]["predicted_n"] == 0 and timed[2][1]["prompt_n"] == 40
    assert all({"prompt_per_second", "predicted_per_second"} <= set(t) for _, t in timed)
    assert [data["sequence_number"] for _, data in seen] == list(range(len(seen)))
    plain = stream(context(request(stream=True), answer_format()), ["Hi"], finished("Hi"))
    assert not any("prompt_progress" in data or name != "response.completed" and "timings" in data
                   for name, data in plain)


def test_a_failure_midway_is_an_error_event() -> None:
    encoder = translate.EventEncoder(context(request(), answer_format()))
    frames = encoder.encode(TextDelta(text="Hi", token_id=0))
    ((name, data),) = events(encoder.error(ServerError("llama_decode failed")))
    assert name == "error" and data["code"] == "server_error" and data["message"] == "llama_decode failed"
    assert data["sequence_number"] == len(frames)


def test_input_tokens_body() -> None:
    assert translate.input_tokens_body(12) == {"object": "response.input_tokens", "input_tokens": 12}
