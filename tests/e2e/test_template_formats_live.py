"""The course's templates on the live server: constrained output and forced calls with thinking on
(the templates' default) and off, across the protocols that constrain, and calls held to each
template's own format.

One router serves the bundled model four times, each under another template from llama.cpp's
`models/templates/` (a preset section's `chat-template-file`, as `--chat-template-file` sets it):
Qwen3.5 (opens a think block, XML calls), DeepSeek-R1 (opens a think block, its own call tokens),
Qwen3 (thinks by itself, Hermes calls) and LFM2.5 (Python-style calls, no tool_calls rendering).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from kinetic.backends.bundled import gemma_model_path
from tests.server import KineticServer

FIXTURES = Path(__file__).parent.parent / "fixtures" / "templates"
TEMPLATES = {"qwen35": "Qwen3.5-4B.jinja", "r1": "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
             "qwen3": "Qwen-Qwen3-0.6B.jinja", "lfm2": "LFM2.5-Instruct.jinja"}
THINKING_TEMPLATES = ["qwen35", "r1"]  # their generation prompt opens <think>
# How each template's forced call starts: the grammar holds the model to the template's own shape.
CALL_OPENERS = {"qwen35": "<tool_call>\n<function=get_weather>\n<parameter=city>\n",
                "r1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n",
                "qwen3": '<tool_call>\n{"name": "get_weather", "arguments": ',
                "lfm2": "<|tool_call_start|>[get_weather(city="}
# DeepSeek's call markers are byte pieces in Gemma's vocabulary: its forced call takes about 110 tokens
FORCED_MAX_TOKENS = 160
THINKING = {"on": {}, "off": {"chat_template_kwargs": {"enable_thinking": False}}}
CITIES = ("Rome", "Paris")
SCHEMA = {"type": "object", "properties": {"sunny": {"type": "boolean"}}, "required": ["sunny"]}
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string", "enum": list(CITIES)}},
              "required": ["city"]}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                 "parameters": PARAMETERS}}
QUESTION = [{"role": "user", "content": "Is it sunny in Rome?"}]


@pytest.fixture(scope="module")
def router(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    preset = tmp_path_factory.mktemp("formats") / "models.ini"
    sections = [f"[{name}]\nmodel = {gemma_model_path()}\nchat-template-file = {FIXTURES / file}\n"
                for name, file in TEMPLATES.items()]
    preset.write_text("version = 1\n\n[*]\nctx-size = 2048\n\n" + "\n".join(sections), encoding="utf-8")
    with KineticServer("-np", "1", "--models-preset", str(preset), "--models-max", "4") as server:
        yield server.url


@pytest.fixture()
def client(router: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router + "/v1", api_key="sk-test", max_retries=0, timeout=120)


def check_call(name: str, arguments: str | dict[str, Any]) -> None:
    assert name == "get_weather"
    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert parsed == {"city": parsed.get("city")} and parsed["city"] in CITIES


# ------------------------------------------------------------------------------ OpenAI chat


@pytest.mark.parametrize("thinking", ["on", "off"])
@pytest.mark.parametrize("model", list(TEMPLATES))
def test_json_schema_comes_back_as_content(client: openai.OpenAI, model: str, thinking: str) -> None:
    completion = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=16, temperature=0,  # type: ignore[arg-type]
        response_format={"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}},
        extra_body={**THINKING[thinking], "verbose": True})
    message = completion.choices[0].message
    assert message.content is not None and set(json.loads(message.content)) == {"sunny"}
    assert not (message.model_extra or {}).get("reasoning_content")
    if model in THINKING_TEMPLATES:  # the think block is closed before the constrained answer
        assert completion.model_extra["__verbose"]["prompt"].rstrip().endswith("</think>")  # type: ignore[index]


@pytest.mark.parametrize("thinking", ["on", "off"])
@pytest.mark.parametrize("model", list(TEMPLATES))
def test_a_forced_call_is_written_in_the_templates_format_and_comes_back_as_tool_calls(
        client: openai.OpenAI, model: str, thinking: str) -> None:
    completion = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=FORCED_MAX_TOKENS, temperature=0,  # type: ignore[arg-type]
        tools=[WEATHER_TOOL], tool_choice="required",  # type: ignore[list-item]
        extra_body={**THINKING[thinking], "verbose": True})
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert not (choice.message.model_extra or {}).get("reasoning_content")
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    check_call(choice.message.tool_calls[0].function.name, choice.message.tool_calls[0].function.arguments)
    raw = completion.model_extra["__verbose"]["content"]  # type: ignore[index]
    assert raw.startswith(CALL_OPENERS[model]), raw


@pytest.mark.parametrize("model", list(TEMPLATES))
def test_a_named_forced_call_streams_as_tool_call_deltas(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=FORCED_MAX_TOKENS, temperature=0, stream=True,  # type: ignore
        tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}})  # type: ignore
    name, arguments, content, reasoning, finish = "", "", "", "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for call in delta.tool_calls or ():
            assert call.index == 0
            name += (call.function.name or "") if call.function else ""
            arguments += (call.function.arguments or "") if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "" and reasoning == "" and finish == "tool_calls"
    check_call(name, arguments)


def test_a_past_call_reaches_the_prompt_of_a_template_that_ignores_tool_calls(router: str) -> None:
    messages = [*QUESTION,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                  "arguments": '{"city": "Rome"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    rendered = httpx.post(router + "/apply-template", json={"model": "lfm2", "messages": messages,
                                                            "tools": [WEATHER_TOOL]}, timeout=120)
    assert rendered.status_code == 200
    assert ('<|im_start|>assistant\n<|tool_call_start|>[get_weather(city="Rome")]<|tool_call_end|><|im_end|>'
            in rendered.json()["prompt"])


# ------------------------------------------------------------------ the other protocols


@pytest.mark.parametrize("model", THINKING_TEMPLATES)
def test_responses_text_format_comes_back_as_output_text(client: openai.OpenAI, model: str) -> None:
    response = client.responses.create(
        model=model, input="Is it sunny in Rome?", max_output_tokens=16, temperature=0,
        text={"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}})
    assert set(json.loads(response.output_text)) == {"sunny"}
    assert all(item.type != "reasoning" or not item.content for item in response.output)


@pytest.mark.parametrize("think", [None, False])
@pytest.mark.parametrize("model", THINKING_TEMPLATES)
def test_ollama_format_comes_back_as_content(router: str, model: str, think: bool | None) -> None:
    reply = ollama.Client(host=router, timeout=120).chat(
        model=model, messages=QUESTION, format=SCHEMA, think=think, options={"num_predict": 16, "temperature": 0})
    assert set(json.loads(reply.message.content or "")) == {"sunny"} and not reply.message.thinking


@pytest.mark.parametrize("model, thinking", [("qwen35", None), ("qwen35", {"type": "disabled"}), ("r1", None),
                                             ("lfm2", None)])
def test_anthropic_forced_tool_use_comes_back_as_a_tool_use_block(router: str, model: str,
                                                                   thinking: dict | None) -> None:
    client = anthropic.Anthropic(base_url=router, api_key="sk-test", max_retries=0, timeout=120)
    extra = {"thinking": thinking} if thinking else {}
    message = client.messages.create(
        model=model, max_tokens=FORCED_MAX_TOKENS, messages=QUESTION, tool_choice={"type": "any"},
        extra_body={"temperature": 0},
        tools=[{"name": "get_weather", "description": "Weather in a city", "input_schema": PARAMETERS}], **extra)
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["tool_use"]
    check_call(message.content[0].name, message.content[0].input)  # type: ignore[union-attr]


def test_anthropic_streamed_named_tool_use_on_a_thinking_template(router: str) -> None:
    client = anthropic.Anthropic(base_url=router, api_key="sk-test", max_retries=0, timeout=120)
    with client.messages.stream(
            model="qwen35", max_tokens=FORCED_MAX_TOKENS, messages=QUESTION,  # type: ignore[arg-type]
            tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0},
            tools=[{"name": "get_weather", "description": "Weather in a city", "input_schema": PARAMETERS}]) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert "input_json" in kinds and message.stop_reason == "tool_use"  # the SDK's event for input_json_delta
    assert [block.type for block in message.content] == ["tool_use"]
    check_call(message.content[0].name, message.content[0].input)  # type: ignore[union-attr]
