"""Request validation that needs no model: which field each bad request names."""

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from kinetic.errors import InvalidRequestError
from kinetic.protocols.common import translate as sampling
from kinetic.protocols.openai.translate import to_chat_request, validate_chat
from kinetic.protocols.openai.types import ChatCompletionRequest
from kinetic.server.app import validation_message

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, field, words", [
    ({"messages": USER, "n": 3}, "n", "1 <= value <= 1, but got 3"),
    ({"messages": []}, "messages", "at least one message"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "must contain 'content'"),
    ({"messages": [{"role": "assistant"}]}, "messages[0]", "either 'content' or 'tool_calls'"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs", "requires logprobs"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "0 <= value <= 20"),
    ({"messages": USER, "reasoning_format": "loud"}, "reasoning_format", "must be one of"),
])
def test_validate_chat_names_the_field(body: dict, field: str, words: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        to_chat_request(ChatCompletionRequest.model_validate(body))
    assert info.value.param == field and words in info.value.message and info.value.status == 400


def test_valid_chat_passes_and_keeps_unknown_fields() -> None:
    request = ChatCompletionRequest.model_validate({"messages": USER, "n": 1, "mystery": 1})
    validate_chat(request)
    assert request.model_extra == {"mystery": 1}


@pytest.mark.parametrize("value, ok", [(0.0, True), (2.0, True), (2.01, False), (-0.1, False), (float("nan"), False)])
def test_check_range(value: float, ok: bool) -> None:
    if ok:
        sampling.check_range("temperature", value, 0.0, 2.0)
    else:
        with pytest.raises(InvalidRequestError, match="Field 'temperature'"):
            sampling.check_range("temperature", value, 0.0, 2.0)


def test_stop_list_drops_empty_strings() -> None:
    assert sampling.stop_list(None) == () and sampling.stop_list("") == ()
    assert sampling.stop_list(["a", "", "b"]) == ("a", "b") and sampling.stop_list("x") == ("x",)


@pytest.mark.parametrize("body, field", [
    ({"messages": USER, "stream_options": {"include_usage": "maybe"}}, "stream_options.include_usage"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": 5}}]}, "tools.0.function.name"),
    # a union's branch names (str, list[...]) are pydantic's, not the client's: left out of the path
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
])
def test_validation_message_names_nested_field(body: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(body)
    error = RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()])
    message, named = validation_message(error)
    assert named == field and message.startswith(f"Field '{field}': ")
