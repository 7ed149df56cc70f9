"""Chat templates rendered as llama-server renders them: today's date, `enable_thinking` from
--reasoning, llama.cpp's Jinja leniency, llama.cpp's built-in formats by name, and continuing a last
message (assistant prefill, `continue_final_message`). The model templates are llama.cpp's test
copies (tests/fixtures/templates/README.md)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from kinetic.chat.prepare import ChatLayer, ServerDefaults
from kinetic.chat.templates import ChatTemplate, LlamaBuiltinTemplate, choose_template, known_names
from kinetic.chat.types import ChatRequest, Message, TextPart, ToolCall
from kinetic.config.args import parse_serve_args
from kinetic.engine.types import GenerationRequest
from kinetic.errors import InvalidRequestError
from tests.scripted import ScriptedEngine

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
TOOL = {"type": "function", "function": {"name": "ipython", "description": "Runs code",
                                         "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                        "required": ["code"]}}}
QUESTION = [{"role": "user", "content": "What is today?"}]


def rendered_prompt(generation: GenerationRequest) -> str:
    """The prompt prepare_chat rendered: the scripted engine's tokens are its bytes."""
    return bytes(generation.prompt_tokens).decode()


def template(name: str) -> ChatTemplate:
    return choose_template(gguf_template=None, architecture="gemma3", bos_token="<bos>", eos_token="<eos>",
                           override_file=str(TEMPLATES / f"{name}.jinja"))


def layer(name: str, **defaults: object) -> ChatLayer:
    engine = ScriptedEngine([])
    engine.loaded.set()
    engine.load()
    return ChatLayer(engine, template(name), ServerDefaults(**defaults))  # type: ignore[arg-type]


def user(text: str) -> Message:
    return Message(role="user", parts=(TextPart(text),))


def assistant(*texts: str, reasoning: str | None = None, calls: tuple[ToolCall, ...] = ()) -> Message:
    return Message(role="assistant", parts=tuple(TextPart(t) for t in texts) if texts else None,
                   reasoning_content=reasoning, tool_calls=calls)


# ----------------------------------------------------------------------------- today's date


@pytest.mark.parametrize("tools", [None, [TOOL]])
@pytest.mark.parametrize("name, fmt", [("meta-llama-Llama-3.3-70B-Instruct", "%d %b %Y"),
                                       ("fireworks-ai-llama-3-firefunction-v2", "%b %d %Y")])
def test_templates_get_todays_date(name: str, fmt: str, tools: list | None) -> None:
    prompt = template(name).render(QUESTION, tools=tools)
    assert date.today().strftime(fmt) in prompt
    assert "26 Jul 2024" not in prompt  # Llama 3.3's fallback when no date_string is given


def test_a_request_can_set_the_date_itself() -> None:
    prompt = template("meta-llama-Llama-3.3-70B-Instruct").render(QUESTION, kwargs={"date_string": "01 Jan 2030"})
    assert "Today Date: 01 Jan 2030" in prompt


# ------------------------------------------------------------------------ llama.cpp's Jinja


@pytest.mark.parametrize("source, expected", [
    ("{{ 'a' + missing }}", "a"),
    ("{{ missing + 'b' }}", "b"),
    ("{{ 'c' + none_value }}", "c"),
    ("{{ 1 + 2 }}", "3"),
    ("{{ [1] + [2] }}", "[1, 2]"),
])
def test_missing_values_concatenate_as_empty_text(source: str, expected: str) -> None:
    rendered = ChatTemplate(source, "--chat-template").render([], kwargs={"none_value": None})
    assert rendered == expected


def test_missing_value_added_to_a_number_is_still_a_400() -> None:
    with pytest.raises(InvalidRequestError):
        ChatTemplate("{{ 1 + missing }}", "--chat-template").render([])


# ------------------------------------------------------------------------ thinking switches


@pytest.mark.parametrize("name, thinks", [
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", True), ("Qwen-Qwen3-0.6B", True), ("Qwen-QwQ-32B", True),
    ("meta-llama-Llama-3.3-70B-Instruct", False), ("fireworks-ai-llama-3-firefunction-v2", False),
])
def test_supports_thinking_is_probed(name: str, thinks: bool) -> None:
    assert template(name).supports_thinking is thinks


def test_a_template_that_always_opens_think_supports_thinking() -> None:
    source = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}A:<think>\n{% endif %}"
    assert ChatTemplate(source, "--chat-template").supports_thinking
    assert not ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", "x").supports_thinking


# the peer suite's table (test_template.py::test_reasoning), through the chat layer
@pytest.mark.parametrize("tools", [None, [TOOL]])
@pytest.mark.parametrize("name, reasoning, end", [
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "on", "<think>\n"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "auto", "<think>\n"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "off", "<think>\n</think>"),
    ("Qwen-Qwen3-0.6B", "auto", "<|im_start|>assistant\n"),
    ("Qwen-Qwen3-0.6B", "off", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ("Qwen-QwQ-32B", "auto", "<|im_start|>assistant\n<think>\n"),
    ("Qwen-QwQ-32B", "off", "<|im_start|>assistant\n<think>\n</think>"),
])
def test_reasoning_flag_sets_enable_thinking(name: str, reasoning: str, end: str, tools: list | None) -> None:
    rendered = layer(name, reasoning=reasoning).render((user("What is today?"),), tools=tools)
    assert rendered.prompt.endswith(end)
    assert rendered.starts_in_reasoning is end.endswith("<think>\n")


def test_a_request_overrides_the_reasoning_flag() -> None:
    chat = layer("Qwen-QwQ-32B", reasoning="off")
    assert chat.render((user("q"),), template_kwargs={"enable_thinking": True}).prompt.endswith("<think>\n")
    chat = layer("Qwen-QwQ-32B", reasoning="auto", template_kwargs={"enable_thinking": False})
    assert chat.render((user("q"),)).prompt.endswith("</think>")


def test_reasoning_flag_spellings() -> None:
    assert parse_serve_args(["-rea", "off"]).reasoning == "off"
    assert parse_serve_args(["--reasoning", "enabled"]).reasoning == "on"
    assert parse_serve_args([]).reasoning == "auto" and parse_serve_args([]).prefill_assistant
    assert not parse_serve_args(["--no-prefill-assistant"]).prefill_assistant


# --------------------------------------------------------------- llama.cpp's formats by name


def test_llama_cpp_format_names_render_through_llama_cpp() -> None:
    command_r = choose_template(gguf_template=None, architecture="gemma3", bos_token="<bos>", eos_token="<eos>",
                                override="command-r")
    assert isinstance(command_r, LlamaBuiltinTemplate) and command_r.origin == "llama.cpp:command-r"
    prompt = command_r.render([{"role": "system", "content": "You are a test."},
                               {"role": "user", "content": "Hi there"}])
    assert prompt == ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
                      "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>")
    assert not command_r.render(QUESTION, add_generation_prompt=False).endswith("<|CHATBOT_TOKEN|>")
    assert not command_r.supports_thinking


def test_format_names_are_accepted_on_the_command_line() -> None:
    assert {"command-r", "mistral-v7", "phi4", "chatml", "gemma", "llama3"} <= set(known_names())
    assert parse_serve_args(["--chat-template", "command-r"]).chat_template == "command-r"


# ------------------------------------------------------------------ continuing the last message

LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct"
HEADER = ("<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("prefill, expected", [(("Whill",), "Whill"), (("Wh", "ill"), "Wh\n\nill")])
def test_a_last_assistant_message_is_continued(prefill: tuple[str, ...], expected: str) -> None:
    request = ChatRequest(messages=(Message(role="system", parts=(TextPart("Book"),)), user("What is the best book"),
                                    assistant(*prefill)))
    generation, answer_format = layer(LLAMA31).prepare_chat(request)
    assert rendered_prompt(generation).endswith(HEADER + expected)


def test_continue_final_message_asks_for_the_same_prompt() -> None:
    messages = (user("What is the best book"), assistant("Whill"))
    chat = layer(LLAMA31, prefill_assistant=False)
    asked = chat.render(messages, add_generation_prompt=False, continue_final_message="auto").prompt
    assert asked.endswith(HEADER + "Whill")
    assert asked == layer(LLAMA31).render(messages).prompt  # the prefill heuristic gives the same


def test_without_prefill_the_assistant_turn_is_closed_and_answered() -> None:
    prompt = layer(LLAMA31, prefill_assistant=False).render((user("q"), assistant("Whill"))).prompt
    assert prompt.endswith("Whill<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


@pytest.mark.parametrize("messages, kwargs, param", [
    ((user("q"), assistant("a")), {"continue_final_message": "auto", "add_generation_prompt": True},
     "continue_final_message"),
    ((user("q"), assistant("a"), assistant("b")), {}, "messages"),
    ((user("q"), assistant(calls=(ToolCall(name="f", arguments="{}"),))), {}, "messages"),
])
def test_impossible_continuations_are_400(messages: tuple[Message, ...], kwargs: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        layer(LLAMA31).render(messages, **kwargs)
    assert caught.value.param == param


def test_thinking_templates_continue_inside_or_after_the_reasoning() -> None:
    chat = layer("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")
    inside = chat.render((user("q"), assistant(reasoning="Let me see")))
    assert inside.prompt.endswith("<｜Assistant｜><think>Let me see") and inside.starts_in_reasoning
    after = chat.render((user("q"), assistant("It is", reasoning="Let me see")))
    assert after.prompt.endswith("<｜Assistant｜><think>Let me see</think>It is") and not after.starts_in_reasoning


def test_generation_prompt_is_what_add_generation_prompt_adds() -> None:
    assert template(LLAMA31).generation_prompt(QUESTION) == "<|start_header_id|>assistant<|end_header_id|>\n\n"


@pytest.mark.parametrize("mode, wire", [("auto", True), ("content", "content"), ("reasoning", "reasoning_content")])
def test_continuation_is_forwarded_to_upstream_servers(mode: str, wire: object) -> None:
    from kinetic.backends.upstream.body import chat_body

    body = chat_body(ChatRequest(messages=(user("q"), assistant("a")), continue_final_message=mode), "m",  # type: ignore[arg-type]
                     -1)
    assert body["continue_final_message"] == wire and body["add_generation_prompt"] is False
    assert "continue_final_message" not in chat_body(ChatRequest(messages=(user("q"),)), "m", -1)
