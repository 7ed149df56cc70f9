"""Client row "LlamaIndex OpenAILike": chat with response_format json_object, content as a list of
text parts, and max_completion_tokens, through llama-index-llms-openai-like against `kinetic serve`.

An httpx hook records the bodies the client really sends, so the test proves the fields went out."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
from llama_index.llms.openai_like import OpenAILike

from tests.conftest import MODEL_ALIAS
from tests.server import KineticServer


@pytest.fixture()
def sent() -> list[dict[str, Any]]:
    return []


@pytest.fixture()
def llm(live_server: KineticServer, sent: list[dict[str, Any]]) -> OpenAILike:
    def record(request: httpx.Request) -> None:
        if request.content:
            sent.append(json.loads(request.content))

    client = httpx.Client(event_hooks={"request": [record]}, timeout=120)
    return OpenAILike(model="local", api_base=live_server.url + "/v1", api_key="sk-test", is_chat_model=True,
                      context_window=2048, temperature=0, max_retries=0, http_client=client)


def test_response_format_json_object(llm: OpenAILike, sent: list[dict[str, Any]]) -> None:
    messages = [ChatMessage(role=MessageRole.USER, content="Describe Rome as a JSON object.")]
    reply = llm.chat(messages, response_format={"type": "json_object"}, max_tokens=60)
    assert sent[-1]["response_format"] == {"type": "json_object"}
    text = reply.message.content
    if reply.raw.choices[0].finish_reason == "stop":
        json.loads(text)  # any JSON value, as llama.cpp's json_object allows
    else:  # cut at max_tokens: the start of one JSON value, never free text
        assert text.lstrip()[:1] in set('{["-0123456789tfn')
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


def test_text_blocks_and_max_completion_tokens(llm: OpenAILike, sent: list[dict[str, Any]]) -> None:
    # llama-index-llms-openai 0.8.3 sends a content-part list only when a non-text block is present;
    # text-only blocks go out joined into one string. (Text-part lists themselves are tested with the
    # openai SDK in test_client_openai.py.)
    message = ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text="What is the weather "),
                                                         TextBlock(text="in Rome?")])
    reply = llm.chat([message], max_completion_tokens=3)
    body = sent[-1]
    assert body["max_completion_tokens"] == 3 and "max_tokens" not in body
    assert body["messages"][0]["content"] == "What is the weather in Rome?"
    assert reply.raw.usage.completion_tokens <= 3 and reply.raw.model == MODEL_ALIAS
    assert isinstance(reply.message.content, str)


def test_image_block_is_refused_with_a_message(llm: OpenAILike, sent: list[dict[str, Any]]) -> None:
    from llama_index.core.base.llms.types import ImageBlock
    from openai import BadRequestError

    message = ChatMessage(role=MessageRole.USER, blocks=[TextBlock(text="What is this?"),
                                                         ImageBlock(url="https://example.com/cat.png")])
    with pytest.raises(BadRequestError) as info:
        llm.chat([message], max_completion_tokens=3)
    assert [p["type"] for p in sent[-1]["messages"][0]["content"]] == ["text", "image_url"]
    assert "text only" in info.value.message


def test_streamed_chat(llm: OpenAILike) -> None:
    chunks = list(llm.stream_chat([ChatMessage(role=MessageRole.USER, content="Hello!")], max_tokens=4))
    assert chunks and chunks[-1].message.content == "".join(c.delta or "" for c in chunks)
