"""The OpenAI translator, both directions, with no model: wire request -> neutral request, and
engine events -> OpenAI JSON."""

from __future__ import annotations

import base64
import json
import struct

import pytest
from pydantic import ValidationError

from kinetic.chat.types import AnswerFormat, MediaPart, TextPart, ToolCall, ToolChoice
from kinetic.engine.types import Finished, TextDelta, Timings, TokenLogprob, Usage
from kinetic.errors import ContextOverflowError, InvalidRequestError, UnauthorizedError
from kinetic.protocols.openai import translate
from kinetic.protocols.openai.types import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

USER = {"role": "user", "content": "hi"}


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [USER], **fields})


def finished(text: str, *, reason: str = "stop", stop_type: str = "eos") -> Finished:
    return Finished(finish_reason=reason, stop_type=stop_type, stopping_word="", text=text, tokens=[1, 2],  # type: ignore[arg-type]
                    usage=Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=3),
                    timings=Timings(cache_n=3, prompt_n=4, prompt_ms=2.0, predicted_n=2, predicted_ms=1.0),
                    id_slot=0, tokens_cached=9, truncated=False)


def answer_format(**fields: object) -> AnswerFormat:
    values: dict = {"starts_in_reasoning": False, "reasoning_format": "auto", "tool_mode": "none", "tool_names": ()}
    return AnswerFormat(**{**values, **fields})


def test_to_chat_request_maps_messages_with_parts_and_calls() -> None:
    req = translate.to_chat_request(ChatCompletionRequest.model_validate({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]}))
    system, user, assistant, tool = req.messages
    assert system.role == "system" and system.text == "be brief"
    assert user.parts == (TextPart("a"), MediaPart("image_url", "image", data=b"hi",
                                                    param="messages[1].content[1].image_url.url"))
    assert assistant.parts is None and assistant.tool_calls == (ToolCall(name="f", arguments={"x": 1}, id="c1"),)
    assert tool.role == "tool" and tool.tool_call_id == "c1" and tool.text == "42"


def test_to_chat_request_sampling_limits_and_tools() -> None:
    req = translate.to_chat_request(chat(
        temperature=0.5, top_k=-3, seed=7, max_tokens=50, max_completion_tokens=20, stop=["x", ""],
        logit_bias={"15": -100, "hello": 2}, logprobs=True, top_logprobs=3, cache_prompt=False,
        tools=[{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}],
        tool_choice={"type": "function", "function": {"name": "get_time"}}, chat_template_kwargs={"a": 1}))
    options = req.options
    assert options.sampling.chosen == {"temperature": 0.5, "top_k": 0, "seed": 7}  # nothing else: the server's
    assert options.sampling.logit_bias == {15: -100.0, "hello": 2.0}  # text keys are tokenized below
    assert options.max_tokens == 20  # max_completion_tokens wins over the older max_tokens
    assert options.stop == ("x",) and options.n_probs == 3 and options.cache_prompt is False
    assert req.tool_choice == ToolChoice("required", "get_time") and req.tools[0].name == "get_time"
    assert req.template_kwargs == {"a": 1}


@pytest.mark.parametrize("fields, expected", [
    ({}, (None, None, False)),
    ({"response_format": {"type": "json_object"}}, (None, None, True)),
    ({"response_format": {"type": "json_object"}, "json_schema": {"type": "array"}}, (None, {"type": "array"}, False)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object", "x": 1}}}},
     (None, {"type": "object", "x": 1}, False)),
    ({"grammar": 'root ::= "a"'}, ('root ::= "a"', None, False)),
])
def test_output_constraint(fields: dict, expected: tuple) -> None:
    output = translate.to_chat_request(chat(**fields)).output
    assert (output.grammar, output.schema, output.any_json) == expected


def test_to_prompt_request_accepts_text_ids_and_one_element_lists() -> None:
    assert translate.to_prompt_request(CompletionRequest(prompt=["hello"])).prompt == "hello"
    assert translate.to_prompt_request(CompletionRequest(prompt=[[1, 2, 3]])).prompt == [1, 2, 3]
    with pytest.raises(InvalidRequestError) as err:
        translate.to_prompt_request(CompletionRequest(prompt=["a", "b"]))
    assert err.value.param == "prompt"
    with pytest.raises(InvalidRequestError, match="1 <= value <= 1"):
        translate.to_prompt_request(CompletionRequest(prompt="x", n=2))


def test_embedding_inputs_name_each_field() -> None:
    items, params = translate.embedding_inputs(EmbeddingRequest(input=["a", "b"]))
    assert items == ["a", "b"] and params == ["input[0]", "input[1]"]
    assert translate.embedding_inputs(EmbeddingRequest(input=[[1, 2], [3]]))[0] == [[1, 2], [3]]
    assert translate.embedding_inputs(EmbeddingRequest(input=[5, 6]))[0] == [[5, 6]]
    with pytest.raises(InvalidRequestError) as err:
        translate.embedding_inputs(EmbeddingRequest(input="a", encoding_format="hex"))
    assert err.value.param == "encoding_format"


def test_to_embeddings_base64_is_little_endian_float32() -> None:
    body = translate.to_embeddings(EmbeddingRequest(input="a", encoding_format="base64"), 2, [[0.5, -1.0]], "m")
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert struct.unpack("<2f", raw) == (0.5, -1.0) and body["usage"] == {"prompt_tokens": 2, "total_tokens": 2}


def test_to_chat_completion_splits_reasoning_and_reports_timings() -> None:
    ctx = translate.chat_context(chat(), answer_format(starts_in_reasoning=True), model="m", fingerprint="b")
    body = translate.to_chat_completion([], finished("thoughts</think>\n\nanswer"), ctx)
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "answer", "reasoning_content": "thoughts"}
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}
    assert body["timings"]["cache_n"] == 3 and body["timings"]["prompt_n"] == 4
    assert body["model"] == "m" and body["object"] == "chat.completion"


def test_chunk_encoder_stream_shape_with_logprobs_and_usage() -> None:
    ctx = translate.chat_context(chat(logprobs=True, top_logprobs=1, stream_options={"include_usage": True}),
                                 answer_format(), model="m", fingerprint="b")
    encoder = translate.ChunkEncoder(ctx)
    logprob = TokenLogprob(id=5, token="Hi", bytes=[72, 105], logprob=-0.1, top_logprobs=[])
    frames = encoder.encode(TextDelta(text="Hi", token_id=5, logprob=logprob)) + encoder.encode(finished("Hi"))
    lines = [f.decode().removeprefix("data: ").strip() for f in frames]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert chunks[1]["choices"][0]["delta"] == {"content": "Hi"}
    assert chunks[1]["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.1
    assert chunks[2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["total_tokens"] == 9 and "timings" in chunks[3]


def test_stream_error_ends_with_done() -> None:
    encoder = translate.ChunkEncoder(translate.chat_context(chat(), answer_format(), model="m", fingerprint="b"))
    frames = encoder.error(ContextOverflowError(10, 5))
    assert frames[-1] == b"data: [DONE]\n\n"
    body = json.loads(frames[0].decode().removeprefix("data: "))
    assert body["error"]["type"] == "exceed_context_size_error" and body["error"]["n_ctx"] == 5


def test_error_body_401_is_exact() -> None:
    assert translate.error_body(UnauthorizedError("Invalid API Key")) == {
        "error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}


def user_parts(*parts: dict) -> tuple:
    req = translate.to_chat_request(ChatCompletionRequest.model_validate(
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": list(parts)}]}))
    return req.messages[1].parts


@pytest.mark.parametrize("part, expected", [
    ({"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,aGk=", "detail": "low"}},
     MediaPart("image_url", "image", data=b"hi", param="messages[1].content[0].image_url.url")),
    ({"type": "image_url", "image_url": "data:image/png;base64,aGk="},  # a bare string is the URL
     MediaPart("image_url", "image", data=b"hi", param="messages[1].content[0].image_url")),
    ({"type": "image_url", "image_url": {"url": "aGk="}},  # raw base64, which llama-server takes
     MediaPart("image_url", "image", data=b"hi", param="messages[1].content[0].image_url.url")),
    ({"type": "image_url", "image_url": {"url": "data:audio/wav;base64,aGk="}},  # the data URL's modality wins
     MediaPart("image_url", "audio", data=b"hi", param="messages[1].content[0].image_url.url")),
    ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
     MediaPart("image_url", "image", url="https://example.com/a.png", param="messages[1].content[0].image_url.url")),
    ({"type": "image_url", "image_url": {"url": "file://mtmd/test-1.jpeg"}},
     MediaPart("image_url", "image", url="file://mtmd/test-1.jpeg", param="messages[1].content[0].image_url.url")),
    ({"type": "input_audio", "input_audio": {"data": "aGk=", "format": "wav"}},
     MediaPart("input_audio", "audio", data=b"hi", param="messages[1].content[0].input_audio.data")),
    ({"type": "input_audio", "input_audio": {"url": "http://example.com/a.mp3"}},
     MediaPart("input_audio", "audio", url="http://example.com/a.mp3", param="messages[1].content[0].input_audio.url")),
    ({"type": "input_video", "input_video": {"url": "data:video/mp4;base64,aGk="}},
     MediaPart("input_video", "video", data=b"hi", param="messages[1].content[0].input_video.url")),
    ({"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
     MediaPart("video_url", "video", url="https://example.com/v.mp4", param="messages[1].content[0].video_url.url")),
    ({"type": "input_video", "input_video": {"data": "aGk="}},
     MediaPart("input_video", "video", data=b"hi", param="messages[1].content[0].input_video.data")),
])
def test_every_media_part_shape(part: dict, expected: MediaPart) -> None:
    assert user_parts(part) == (expected,)


@pytest.mark.parametrize("part, param, message", [
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}},
     "messages[1].content[0].image_url.url", "Invalid base64 value"),
    ({"type": "image_url", "image_url": {"url": "not base64 at all"}},
     "messages[1].content[0].image_url.url", "Invalid base64 value"),
    ({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}},
     "messages[1].content[0].image_url.url", "Invalid uri format: data:text/plain;base64"),
    ({"type": "image_url", "image_url": {"url": "data:image/png,hi"}},
     "messages[1].content[0].image_url.url", "uri must be base64 encoded"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64"}},
     "messages[1].content[0].image_url.url", "Invalid uri-encoded base64 value"),
    ({"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}},
     "messages[1].content[0].image_url.url", "unsupported URL scheme 'ftp'"),
    ({"type": "image_url", "image_url": {}}, "messages[1].content[0].image_url.url", "is required"),
    ({"type": "image_url"}, "messages[1].content[0].image_url", "is required"),
    ({"type": "input_audio", "input_audio": {"format": "wav"}}, "messages[1].content[0].input_audio.data",
     "is required"),
    ({"type": "video_url", "video_url": {"url": ""}}, "messages[1].content[0].video_url.url", "is required"),
])
def test_a_bad_media_part_is_a_400_naming_its_field(part: dict, param: str, message: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        user_parts(part)
    assert err.value.param == param and message in err.value.message and param in err.value.message


def test_an_unknown_content_part_type_fails_validation() -> None:
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [{"type": "image"}]}]})
