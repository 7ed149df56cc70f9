"""Tool calls in each template's own format: detection from the template files llama.cpp ships, the
grammar that forces a call in that format (checked with a GBNF reader), parsing whole and streamed,
and past calls written into the text for templates that cannot render `tool_calls`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetic.chat.answer import AnswerStream, parse_answer
from kinetic.chat.callformats import FORMATS
from kinetic.chat.callformats.base import FoundCall
from kinetic.chat.callformats.detect import detect_call_format
from kinetic.chat.callformats.gbnf import prefixed_rules
from kinetic.chat.constraints import schema_grammar
from kinetic.chat.prepare import ChatLayer, ServerDefaults
from kinetic.chat.templates import ChatTemplate
from kinetic.chat.toolcalls import parse_tool_calls
from kinetic.chat.types import (
    AnswerFormat,
    ChatRequest,
    Message,
    OutputConstraint,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from kinetic.engine.types import GenerationRequest
from kinetic.protocols.openai.translate import call_delta
from tests.gbnf import accepts
from tests.scripted import ScriptedEngine

TEMPLATES = Path(__file__).parent.parent / "fixtures" / "templates"
WEATHER_PARAMETERS = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Rome", "Paris"]}, "days": {"type": "integer"},
    "note": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS}}
TIME = {"type": "function", "function": {"name": "get_time"}}
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "get_time": {}}
CALL = FoundCall("get_weather", {"city": "Rome", "days": 3})


def rendered_prompt(generation: GenerationRequest) -> str:
    """The prompt prepare_chat rendered: the scripted engine's tokens are its bytes."""
    return bytes(generation.prompt_tokens).decode()


def compile_schema(schema: dict) -> str:
    return schema_grammar(schema, "tools")


@pytest.mark.parametrize("template, expected", [
    ("Qwen3.5-4B", "qwen-xml"), ("Qwen3-Coder", "qwen-xml"), ("LFM2.5-Instruct", "lfm2"), ("LFM2-8B-A1B", "lfm2"),
    ("LFM2.5-8B-A1B", "lfm2"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes"), ("Qwen-Qwen3-0.6B", "hermes"),
    ("Qwen-QwQ-32B", "hermes"), ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3"), ("mistralai-Mistral-Nemo-Instruct-2407", "mistral"),
    ("Mistral-Small-3.2-24B-Instruct-2506", "mistral-args"),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek-r1"), ("deepseek-ai-DeepSeek-V3.1", "deepseek-v3"),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "command-r7b"), ("openai-gpt-oss-120b", "gpt-oss"),
    ("CohereForAI-c4ai-command-r-plus-tool_use", "command-r-plus"),
])
def test_the_format_is_read_from_the_template(template: str, expected: str) -> None:
    assert detect_call_format((TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")) == expected


def test_kinetic_builtin_templates_keep_their_shapes() -> None:
    from kinetic.chat.templates import builtin_template

    assert detect_call_format(builtin_template("gemma")) == "json"
    assert detect_call_format(builtin_template("chatml")) == "hermes"


# ------------------------------------------------------------------ grammar, render, parse


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_a_call_written_in_the_format_is_what_its_grammar_allows_and_parses_back(name: str) -> None:
    fmt = FORMATS[name]
    text = fmt.render([CALL]).removesuffix("<|call|>")  # gpt-oss: the call token ends the turn, not the grammar
    assert accepts(fmt.grammar([WEATHER, TIME], compile_schema), text)
    found = fmt.parse(text, PARAMETERS)
    assert found is not None and found.content == ""
    assert [(c.name, c.arguments) for c in found.calls] == [("get_weather", {"city": "Rome", "days": 3})]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_the_grammar_holds_name_arguments_and_shape(name: str) -> None:
    fmt = FORMATS[name]
    grammar = fmt.grammar([WEATHER, TIME], compile_schema)
    wrong_city = fmt.render([FoundCall("get_weather", {"city": "Oslo"})]).removesuffix("<|call|>")
    unknown_tool = fmt.render([FoundCall("get_news", {})]).removesuffix("<|call|>")
    kinetic_json = json.dumps({"name": "get_weather", "arguments": {"city": "Rome"}})
    assert not accepts(grammar, wrong_city)
    assert not accepts(grammar, unknown_tool)
    assert not accepts(grammar, kinetic_json)
    only = fmt.grammar([WEATHER, TIME], compile_schema, only="get_time")
    assert accepts(only, fmt.render([FoundCall("get_time", {})]).removesuffix("<|call|>"))
    assert not accepts(only, fmt.render([CALL]).removesuffix("<|call|>"))


@pytest.mark.parametrize("name", ["hermes", "qwen-xml", "lfm2", "mistral", "mistral-args", "deepseek-r1",
                                  "deepseek-v3", "command-r7b", "command-r-plus"])
def test_parallel_calls_only_when_allowed(name: str) -> None:
    fmt = FORMATS[name]
    two = fmt.render([CALL, FoundCall("get_time", {})])
    assert accepts(fmt.grammar([WEATHER, TIME], compile_schema, parallel=True), two)
    assert not accepts(fmt.grammar([WEATHER, TIME], compile_schema), two)
    found = fmt.parse(two, PARAMETERS)
    assert found is not None and [c.name for c in found.calls] == ["get_weather", "get_time"]


def test_optional_arguments_may_be_left_out_required_ones_not() -> None:
    for name in ("qwen-xml", "lfm2"):
        grammar = FORMATS[name].grammar([WEATHER], compile_schema)
        assert accepts(grammar, FORMATS[name].render([FoundCall("get_weather", {"city": "Paris"})]))
        assert accepts(grammar, FORMATS[name].render([FoundCall("get_weather", {"city": "Paris", "note": "x y"})]))
        assert not accepts(grammar, FORMATS[name].render([FoundCall("get_weather", {"days": 2})]))


def test_parameters_refer_to_the_tools_definitions() -> None:
    """Pydantic writes nested models as `$ref`s into `$defs`: each parameter is compiled with them."""
    parameters = {"type": "object", "$defs": {"Place": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Rome"]}}, "required": ["city"]}},
        "properties": {"place": {"$ref": "#/$defs/Place"}}, "required": ["place"]}
    tool = {"type": "function", "function": {"name": "visit", "parameters": parameters}}
    call = FoundCall("visit", {"place": {"city": "Rome"}})
    for name in ("qwen-xml", "lfm2"):
        grammar = FORMATS[name].grammar([tool], compile_schema)
        assert accepts(grammar, FORMATS[name].render([call]))
        assert not accepts(grammar, FORMATS[name].render([FoundCall("visit", {"place": {"city": "Oslo"}})]))


def test_rules_of_embedded_schemas_are_renamed_apart() -> None:
    grammar = 'root ::= "[" item "]" space\nitem ::= [a-z] | "root" item\nspace ::= " "?'
    renamed = prefixed_rules(grammar, "p")
    assert renamed.splitlines() == ['p-root ::= "[" p-item "]" p-space', 'p-item ::= [a-z] | "root" p-item',
                                    'p-space ::= " "?']


@pytest.mark.parametrize("text, content, calls", [
    ("I'll look.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n<parameter=days>\n"
     "3\n</parameter>\n<parameter=note>\n12\n</parameter>\n</function>\n</tool_call>",
     "I'll look.", [("get_weather", {"city": "Rome", "days": 3, "note": "12"})]),  # a string stays a string
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n</function>\n</tool_call>\n"
     "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
     "", [("get_weather", {"city": "New\nYork"}), ("get_time", {})]),
])
def test_qwen_xml_is_parsed_with_the_tools_types(text: str, content: str, calls: list) -> None:
    reply = parse_tool_calls(text, ["get_weather", "get_time"], call_format="qwen-xml", parameters=PARAMETERS)
    assert reply.content == content
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == calls


@pytest.mark.parametrize("text, content, calls", [
    ('<|tool_call_start|>[get_weather(city="Rome", days=2)]<|tool_call_end|>', "",
     [("get_weather", {"city": "Rome", "days": 2})]),
    ('Checking.<|tool_call_start|>[get_weather(city="Rome"), get_time()]<|tool_call_end|>', "Checking.",
     [("get_weather", {"city": "Rome"}), ("get_time", {})]),
    ("<|tool_call_start|>[set(flag=true, other=False, none=null, items=[1, 'a'], m={\"k\": 1})]<|tool_call_end|>",
     "", [("set", {"flag": True, "other": False, "none": None, "items": [1, "a"], "m": {"k": 1}})]),
])
def test_lfm2_python_calls_are_parsed(text: str, content: str, calls: list) -> None:
    reply = parse_tool_calls(text, ["get_weather", "get_time", "set"], call_format="lfm2", parameters=PARAMETERS)
    assert reply.content == content
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == calls


@pytest.mark.parametrize("name, text", [
    ("deepseek-r1", "Let me see.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                    '```json\n{"city": "Rome"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'),
    ("deepseek-v3", 'Let me see.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Rome"}'
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    ("command-r7b", '<|START_RESPONSE|>Let me see.<|END_RESPONSE|><|START_ACTION|>[\n    {"tool_call_id": "0", '
                    '"tool_name": "get_weather", "parameters": {"city": "Rome"}}\n]<|END_ACTION|>'),
    ("command-r-plus", 'Let me see.\nAction:\n```json\n[\n    {\n        "tool_name": "get_weather",\n'
                       '        "parameters": {\n            "city": "Rome"\n        }\n    }\n]```'),
    ("gpt-oss", "<|channel|>final<|message|>Let me see.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.get_weather <|constrain|>json<|message|>{"city": "Rome"}<|call|>'),
    ("gpt-oss", '<|channel|>final<|message|>Let me see.<|end|><|start|>assistant to=functions.get_weather'
                '<|channel|>commentary json<|message|>{"city": "Rome"}<|call|>'),
])
def test_other_families_are_parsed_with_their_text(name: str, text: str) -> None:
    reply = parse_tool_calls(text, ["get_weather"], call_format=name, parameters=PARAMETERS)
    assert reply.content == "Let me see."
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == [("get_weather", {"city": "Rome"})]


def test_command_r_plus_directly_answer_is_no_call() -> None:
    text = 'Action:\n```json\n[{"tool_name": "directly-answer", "parameters": {}}]\n```'
    assert parse_tool_calls(text, ["get_weather"], call_format="command-r-plus", parameters=PARAMETERS).calls == []


def test_a_plain_answer_in_a_known_format_stays_content() -> None:
    for name in FORMATS:
        reply = parse_tool_calls("The weather in Rome is sunny.", ["get_weather"], call_format=name,
                                 parameters=PARAMETERS)
        assert reply.calls == [] and reply.content == "The weather in Rome is sunny."


# ------------------------------------------------------------------------------ streaming


def answer_format(call_format: str, mode: str = "auto", *, in_reasoning: bool = False) -> AnswerFormat:
    return AnswerFormat(starts_in_reasoning=in_reasoning, reasoning_format="auto",
                        tool_mode=mode, tool_names=("get_weather", "get_time"),  # type: ignore[arg-type]
                        call_format=call_format, tool_parameters=tuple(PARAMETERS.items()))


def streamed(prepared_chat: AnswerFormat, text: str, step: int) -> tuple[str, str, dict[int, dict[str, str]]]:
    stream = AnswerStream(prepared_chat)
    pieces = [stream.push(text[i:i + step]) for i in range(0, len(text), step)] + stream.finish()
    calls: dict[int, dict[str, str]] = {}
    for piece in pieces:
        for delta in piece.calls:
            d = call_delta(delta)
            call = calls.setdefault(d["index"], {"name": "", "arguments": ""})
            call["name"] += d["function"].get("name") or ""
            call["arguments"] += d["function"]["arguments"]
    return "".join(p.reasoning for p in pieces), "".join(p.content for p in pieces), calls


QWEN_ANSWER = ("I should look it up.\n</think>\n\nOne moment.\n\n<tool_call>\n<function=get_weather>\n"
               "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")
LFM_ANSWER = 'One moment.<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>'


@pytest.mark.parametrize("step", [1, 4, 1000])
@pytest.mark.parametrize("call_format, text, in_reasoning", [("qwen-xml", QWEN_ANSWER, True),
                                                             ("lfm2", LFM_ANSWER, False)])
def test_a_call_in_the_format_streams_as_deltas_after_the_content_and_reasoning(
        step: int, call_format: str, text: str, in_reasoning: bool) -> None:
    reasoning, content, calls = streamed(answer_format(call_format, in_reasoning=in_reasoning), text, step)
    assert reasoning == ("I should look it up.\n" if in_reasoning else "")
    assert content == "One moment."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", {"city": "Paris"})]
    whole = parse_answer(text, answer_format(call_format, in_reasoning=in_reasoning))
    assert whole.content == "One moment." and [c.name for c in whole.calls] == ["get_weather"]


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_a_qwen_call_started_inside_an_open_think_block_ends_the_reasoning(step: int) -> None:
    text = "I need the weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n" \
           "</function>\n</tool_call>"
    reasoning, content, calls = streamed(answer_format("qwen-xml", in_reasoning=True), text, step)
    assert reasoning.strip() == "I need the weather." and content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", {"city": "Rome"})]
    whole = parse_answer(text, answer_format("qwen-xml", in_reasoning=True))
    assert whole.reasoning.strip() == "I need the weather." and [c.name for c in whole.calls] == ["get_weather"]
    plain = parse_answer(text, answer_format("qwen-xml", "none", in_reasoning=True))  # no tools: all of it is thought
    assert plain.calls == [] and "<tool_call>" in plain.reasoning


def test_a_forced_call_in_the_format_comes_back_as_a_call() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"
    answer = parse_answer(text, answer_format("qwen-xml", "forced"))
    assert answer.content is None and [(c.name, json.loads(c.arguments)) for c in answer.calls] == [
        ("get_weather", {"city": "Rome"})]
    _, content, calls = streamed(answer_format("qwen-xml", "forced"), text, 3)
    assert content == "" and [c["name"] for c in calls.values()] == ["get_weather"]


# ------------------------------------------------------------------ through the chat layer


def layer_for(template: str) -> ChatLayer:
    engine = ScriptedEngine([])
    engine.loaded.set()
    engine.load()
    source = (TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")
    return ChatLayer(engine, ChatTemplate(source, "--chat-template-file", bos_token="<s>", eos_token="</s>"),
                     ServerDefaults())


def user(text: str) -> Message:
    return Message(role="user", parts=(TextPart(text),))


WEATHER_SPEC = ToolSpec(name="get_weather", parameters=WEATHER_PARAMETERS)
HISTORY = (user("Weather in Rome?"),
           Message(role="assistant", parts=None, tool_calls=(ToolCall("get_weather", {"city": "Rome"}, "c1"),)),
           Message(role="tool", parts=(TextPart("sunny"),), tool_call_id="c1"), user("And tomorrow?"))


@pytest.mark.parametrize("template", ["LFM2.5-Instruct", "LFM2-8B-A1B"])
def test_a_past_call_survives_a_template_that_ignores_tool_calls(template: str) -> None:
    layer = layer_for(template)
    assert layer.template.renders_tool_calls is False
    generation, chat = layer.prepare_chat(ChatRequest(messages=HISTORY, tools=(WEATHER_SPEC,)))
    assert '<|im_start|>assistant\n<|tool_call_start|>[get_weather(city="Rome")]<|tool_call_end|><|im_end|>' \
        in rendered_prompt(generation)


@pytest.mark.parametrize("template", sorted(path.stem for path in TEMPLATES.glob("*.jinja")))
def test_a_past_call_survives_every_template(template: str) -> None:
    """The call's argument reaches the prompt between the question and the tool's answer, whether the
    template renders `tool_calls` itself or kinetic writes the call into the turn's text."""
    history = (user("Weather?"),
               Message(role="assistant", parts=None,
                       tool_calls=(ToolCall("get_weather", {"city": "Zanzibar"}, "call00001"),)),
               Message(role="tool", parts=(TextPart("sunny"),), tool_call_id="call00001", name="get_weather"))
    tool = ToolSpec(name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})
    generation, chat = layer_for(template).prepare_chat(ChatRequest(messages=history, tools=(tool,)))
    assert rendered_prompt(generation).count("Zanzibar") == 1
    prompt = rendered_prompt(generation)
    assert prompt.rindex("Weather?") < prompt.index("Zanzibar") < prompt.index("sunny")


@pytest.mark.parametrize("template, written", [
    ("Qwen3.5-4B", "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>"),
    ("Qwen-Qwen3-0.6B", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "<｜tool▁sep｜>get_weather\n```json\n"),
    ("LFM2.5-8B-A1B", "<|tool_call_start|>[get_weather(city='Rome')]<|tool_call_end|>"),  # a {% generation %} block
])
def test_templates_that_render_calls_render_them_once(template: str, written: str) -> None:
    layer = layer_for(template)
    assert layer.template.renders_tool_calls is True
    generation, chat = layer.prepare_chat(ChatRequest(messages=HISTORY, tools=(WEATHER_SPEC,)))
    assert rendered_prompt(generation).count(written) == 1


SCHEMA = OutputConstraint(schema={"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
                          param="response_format")


@pytest.mark.parametrize("template", ["Qwen3.5-4B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "Qwen-QwQ-32B"])
@pytest.mark.parametrize("request_", [
    ChatRequest(messages=(user("Weather?"),), output=SCHEMA),
    ChatRequest(messages=(user("Weather?"),), output=OutputConstraint(any_json=True)),
    ChatRequest(messages=(user("Weather?"),), tools=(WEATHER_SPEC,), tool_choice=ToolChoice("required")),
    ChatRequest(messages=(user("Weather?"),), tools=(WEATHER_SPEC,), tool_choice=ToolChoice("required", "get_weather")),
], ids=["json_schema", "json_object", "required", "named"])
def test_constrained_output_on_a_thinking_template_starts_after_a_closed_think_block(
        template: str, request_: ChatRequest) -> None:
    layer = layer_for(template)
    generation, chat = layer.prepare_chat(request_)
    assert rendered_prompt(generation).endswith("<think>\n\n</think>\n\n") and chat.starts_in_reasoning is False
    assert generation.sampling.grammar is not None
    free, open_chat = layer.prepare_chat(ChatRequest(messages=(user("Weather?"),)))
    assert rendered_prompt(free).endswith("<think>\n") and open_chat.starts_in_reasoning is True
    assert free.sampling.grammar is None


def test_thinking_off_is_not_closed_twice() -> None:
    layer = layer_for("Qwen3.5-4B")
    generation, chat = layer.prepare_chat(ChatRequest(messages=(user("Weather?"),), output=SCHEMA,
                                             template_kwargs={"enable_thinking": False}))
    assert rendered_prompt(generation).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert rendered_prompt(generation).count("</think>") == 1


@pytest.mark.parametrize("template, call", [
    ("Qwen3.5-4B", "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n"
                   "</tool_call>"),
    ("LFM2.5-Instruct", '<|tool_call_start|>[get_weather(city="Rome")]<|tool_call_end|>'),
    ("Qwen-Qwen3-0.6B", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>'
                                                 'get_weather\n```json\n{"city": "Rome"}\n```<｜tool▁call▁end｜>'
                                                 '<｜tool▁calls▁end｜>'),
])
def test_a_forced_call_is_held_to_the_templates_format(template: str, call: str) -> None:
    layer = layer_for(template)
    generation, chat = layer.prepare_chat(ChatRequest(messages=(user("Weather?"),), tools=(WEATHER_SPEC,),
                                                      tool_choice=ToolChoice("required")))
    grammar = generation.sampling.grammar
    assert grammar is not None and accepts(grammar, call)
    assert not accepts(grammar, '{"name": "get_weather", "arguments": {"city": "Rome"}}')
    answer = parse_answer(call, chat)
    assert answer.content is None and [(c.name, json.loads(c.arguments)) for c in answer.calls] == [
        ("get_weather", {"city": "Rome"})]
