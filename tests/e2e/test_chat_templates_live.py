"""Templates on the live server as llama-server renders them: assistant prefill and
`continue_final_message` through the openai SDK, `__verbose`, the chat token-count route, and servers
started with `--chat-template command-r --no-jinja` (llama.cpp's format) and with a thinking
template under `--reasoning off`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server import KineticServer

FIXTURES = Path(__file__).parent.parent / "fixtures" / "templates"
QUESTION = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


def verbose_prompt(completion: object) -> str:
    return completion.model_extra["__verbose"]["prompt"]  # type: ignore[attr-defined]


def test_assistant_prefill_is_continued(openai_client: openai.OpenAI) -> None:
    completion = openai_client.chat.completions.create(
        model="m", max_tokens=4, messages=[*QUESTION, {"role": "assistant", "content": "Once upon a"}],
        extra_body={"verbose": True})
    prompt = verbose_prompt(completion)
    assert prompt.endswith("What is the best book<end_of_turn>\n<start_of_turn>model\nOnce upon a")
    assert completion.usage is not None and completion.usage.completion_tokens <= 4


def test_continue_final_message_gives_the_prefill_prompt(openai_client: openai.OpenAI) -> None:
    messages = [*QUESTION, {"role": "assistant", "content": "Once upon a"}]
    asked = openai_client.chat.completions.create(
        model="m", max_tokens=1, messages=messages,
        extra_body={"verbose": True, "continue_final_message": True, "add_generation_prompt": False})
    prefilled = openai_client.chat.completions.create(model="m", max_tokens=1, messages=messages,
                                                      extra_body={"verbose": True})
    assert verbose_prompt(asked) == verbose_prompt(prefilled)
    assert asked.usage is not None and prefilled.usage is not None
    assert asked.usage.prompt_tokens == prefilled.usage.prompt_tokens


@pytest.mark.parametrize("messages, extra, param", [
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
     {"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
     {}, "messages"),
])
def test_impossible_continuations_are_400(openai_client: openai.OpenAI, messages: list, extra: dict,
                                          param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.chat.completions.create(model="m", max_tokens=2, messages=messages, extra_body=extra)
    assert caught.value.status_code == 400 and caught.value.body["param"] == param  # type: ignore[index]


def test_verbose_only_when_asked(openai_client: openai.OpenAI) -> None:
    plain = openai_client.chat.completions.create(model="m", max_tokens=2, messages=QUESTION)
    assert "__verbose" not in (plain.model_extra or {})
    shown = openai_client.chat.completions.create(model="m", max_tokens=2, messages=QUESTION,
                                                  extra_body={"verbose": True})
    native = shown.model_extra["__verbose"]  # type: ignore[index]
    assert native["prompt"].startswith("<bos>") and "Book" in native["prompt"]
    assert native["content"] == shown.choices[0].message.content
    assert native["tokens_evaluated"] == shown.usage.prompt_tokens  # type: ignore[union-attr]
    assert native["generation_settings"]["n_predict"] == 2


def test_verbose_in_a_stream(openai_client: openai.OpenAI) -> None:
    chunks = list(openai_client.chat.completions.create(model="m", max_tokens=3, messages=QUESTION, stream=True,
                                                        extra_body={"verbose": True}))
    verbose = [c.model_extra["__verbose"] for c in chunks if "__verbose" in (c.model_extra or {})]
    assert len(verbose) == 1 and "Book" in verbose[0]["prompt"]
    assert chunks[-1].choices[0].finish_reason == "length"


@pytest.mark.parametrize("path", ["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"])
def test_input_tokens_counts_the_prompt_a_chat_would_take(base_url: str, openai_client: openai.OpenAI,
                                                          path: str) -> None:
    counted = httpx.post(base_url + path, json={"messages": QUESTION}, timeout=60)
    assert counted.status_code == 200
    completion = openai_client.chat.completions.create(model="m", max_tokens=1, messages=QUESTION)
    assert counted.json() == {"input_tokens": completion.usage.prompt_tokens}  # type: ignore[union-attr]
    bad = httpx.post(base_url + path, json={"messages": []}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


# ------------------------------------------------------------------ servers of their own


@pytest.fixture(scope="module")
def command_r(model_lock: None) -> Iterator[str]:
    with KineticServer("-c", "1024", "-np", "1", "--no-jinja", "--chat-template", "command-r") as server:
        yield server.url


def test_llama_cpp_format_by_name(command_r: str) -> None:
    rendered = httpx.post(command_r + "/apply-template", json={"messages": [
        {"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]}, timeout=60)
    assert rendered.json() == {"prompt": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                                         "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                                         "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"}
    props = httpx.get(command_r + "/props", timeout=60).json()
    assert props["chat_template"] == "command-r" and props["chat_template_origin"] == "llama.cpp:command-r"
    chat = httpx.post(command_r + "/v1/chat/completions", timeout=120,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] <= 3


@pytest.fixture(scope="module")
def thinking_off(model_lock: None) -> Iterator[str]:
    template = FIXTURES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
    with KineticServer("-c", "1024", "-np", "1", "--chat-template-file", str(template), "--reasoning", "off") as server:
        yield server.url


def test_reasoning_off_closes_the_think_block(thinking_off: str) -> None:
    def prompt(**extra: object) -> str:
        body = {"messages": [{"role": "user", "content": "What is today?"}], **extra}
        return httpx.post(thinking_off + "/apply-template", json=body, timeout=60).json()["prompt"]

    assert prompt().endswith("<｜Assistant｜><think>\n</think>")
    assert prompt(chat_template_kwargs={"enable_thinking": True}).endswith("<｜Assistant｜><think>\n")
    streamed = httpx.post(thinking_off + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "verbose": True})
    assert json.loads(streamed.text)["__verbose"]["prompt"].endswith("</think>")
