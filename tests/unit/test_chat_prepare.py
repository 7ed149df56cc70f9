"""The chat layer: neutral requests rendered, tokenized and compiled, with the scripted engine's
byte tokenizer standing in for a model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kinetic.chat.prepare import (
    INLINE_PROMPT_SIZE,
    ChatLayer,
    ServerDefaults,
    quick_to_prepare,
    quick_to_prepare_chat,
)
from kinetic.chat.templates import ChatTemplate, builtin_template
from kinetic.chat.types import (
    ChatRequest,
    GenerationOptions,
    MediaPart,
    Message,
    OutputConstraint,
    PromptRequest,
    SamplingOptions,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from kinetic.engine.types import SamplingParams
from kinetic.errors import ContextOverflowError, InvalidRequestError
from tests.scripted import ScriptedEngine

WEATHER = ToolSpec(name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})


@pytest.fixture()
def layer() -> ChatLayer:
    engine = ScriptedEngine([])
    engine.loaded.set()
    engine.load()
    template = ChatTemplate(builtin_template("gemma"), "builtin:gemma")
    return ChatLayer(engine, template, ServerDefaults(sampling=SamplingParams(temperature=0.3, seed=5), n_predict=77,
                                                      template_kwargs={"enable_thinking": False}))


def user(text: str) -> Message:
    return Message(role="user", parts=(TextPart(text),))


def test_defaults_fill_what_the_request_leaves_out(layer: ChatLayer) -> None:
    generation, answer_format = layer.prepare_chat(ChatRequest(messages=(user("hi"),)))
    assert generation.sampling.temperature == 0.3 and generation.sampling.seed == 5
    assert generation.max_tokens == 77 and generation.sampling.grammar is None
    prompt = bytes(generation.prompt_tokens).decode()  # the scripted engine's tokens are the text's bytes
    assert prompt.endswith("<start_of_turn>model\n") and answer_format.tool_mode == "none"
    assert generation.n_prompt_tokens == len(prompt)


def test_request_values_win_and_text_bias_keys_are_tokenized(layer: ChatLayer) -> None:
    options = GenerationOptions(sampling=SamplingOptions({"temperature": 0.0}, logit_bias={"AB": -5.0, 7: 1.0}),
                                max_tokens=3)
    generation, _ = layer.prepare_chat(ChatRequest(messages=(user("hi"),), options=options))
    assert generation.sampling.temperature == 0.0 and generation.max_tokens == 3
    assert generation.sampling.logit_bias == {65: -5.0, 66: -5.0, 7: 1.0}


def test_ignore_eos_bans_every_end_of_generation_token_in_the_bias_as_llama_server_shows_it() -> None:
    """llama-server's ignore_eos: a -inf logit_bias per EOG token, after the request's own (test_ignore_eos.py)."""
    engine = ScriptedEngine([])
    engine.loaded.set()
    engine.load()
    engine.info = replace(engine.info, eog_ids=(1, 106))
    layer = ChatLayer(engine, ChatTemplate(builtin_template("gemma"), "builtin:gemma"), ServerDefaults())
    options = GenerationOptions(sampling=SamplingOptions({"ignore_eos": True}, logit_bias={7: 1.0, 1: 2.0}))
    generation, _ = layer.prepare_chat(ChatRequest(messages=(user("hi"),), options=options))
    assert generation.sampling.logit_bias == {7: 1.0, 1: float("-inf"), 106: float("-inf")}
    plain, _ = layer.prepare_chat(ChatRequest(messages=(user("hi"),)))
    assert plain.sampling.logit_bias == {} and not plain.sampling.ignore_eos


def test_tools_are_rendered_for_auto_not_for_none_and_forced_gets_a_grammar(layer: ChatLayer) -> None:
    auto_request, auto = layer.prepare_chat(ChatRequest(messages=(user("hi"),), tools=(WEATHER,)))
    assert auto.tool_mode == "auto" and "get_weather" in bytes(auto_request.prompt_tokens).decode()
    none_request, none = layer.prepare_chat(ChatRequest(messages=(user("hi"),), tools=(WEATHER,),
                                                        tool_choice=ToolChoice("none")))
    assert none.tool_mode == "none" and "get_weather" not in bytes(none_request.prompt_tokens).decode()
    forced, answer_format = layer.prepare_chat(ChatRequest(messages=(user("hi"),), tools=(WEATHER,),
                                                      tool_choice=ToolChoice("required", "get_weather")))
    assert answer_format.tool_mode == "forced" and "get_weather" in (forced.sampling.grammar or "")


def test_tool_calls_and_results_reach_the_prompt(layer: ChatLayer) -> None:
    messages = (user("weather?"),
                Message(role="assistant",
                        tool_calls=(ToolCall(name="get_weather", arguments={"city": "Rome"}, id="c1"),)),
                Message(role="tool", parts=(TextPart("sunny and 31 degrees"),), tool_call_id="c1"))
    generation, _ = layer.prepare_chat(ChatRequest(messages=messages))
    assert "sunny and 31 degrees" in bytes(generation.prompt_tokens).decode()


@pytest.mark.parametrize("request_, param", [
    (ChatRequest(messages=(Message(role="user", parts=(TextPart("look"), MediaPart(
        "image_url", "image", data=b"\x89PNG", param="messages[0].content[1].image_url.url"))),)),
     "messages[0].content[1].image_url.url"),
    (ChatRequest(messages=(user("x"),), template_kwargs={"enable_thinking": "yes"}), "chat_template_kwargs"),
    (ChatRequest(messages=(user("x"),), tool_choice=ToolChoice("required")), "tool_choice"),
    (ChatRequest(messages=()), "messages"),
])
def test_what_cannot_be_prepared_names_the_field(layer: ChatLayer, request_: ChatRequest, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        layer.prepare_chat(request_)
    assert err.value.param == param


def test_prompts_of_token_ids_are_checked(layer: ChatLayer) -> None:
    assert layer.prepare_prompt(PromptRequest(prompt=[1, 2, 3])).prompt_tokens == [1, 2, 3]
    with pytest.raises(InvalidRequestError, match="invalid tokens"):
        layer.prepare_prompt(PromptRequest(prompt=[1, 999]))


def test_embedding_inputs_respect_the_embedding_context(layer: ChatLayer) -> None:
    with pytest.raises(InvalidRequestError) as err:
        layer.embedding_inputs(["abc"], ["input[0]"])  # the scripted engine has no embedding context
    assert err.value.param == "input[0]" and "too large" in err.value.message


def test_embedding_inputs_truncate_when_asked(layer: ChatLayer) -> None:
    class TwoTokenEmbeddings(ScriptedEngine):
        embedding_n_ctx = 2  # type: ignore[assignment]

    engine = TwoTokenEmbeddings([])
    engine.loaded.set()
    engine.load()
    small = ChatLayer(engine, layer.template, layer.defaults)
    assert small.embedding_inputs(["abc", "d"], ["input[0]", "input[1]"], truncate=True) == [[97, 98], [100]]
    with pytest.raises(InvalidRequestError):
        small.embedding_inputs(["abc"], ["input[0]"])


def test_ollamas_context_leads_the_prompt_without_a_second_bos(layer: ChatLayer) -> None:
    """/api/generate's `context` (an earlier answer's tokens) goes before this prompt, whose own BOS
    would otherwise land in the middle: the chat layer does it, the route never edits the request."""
    layer.engine.info = replace(layer.engine.info, bos_id=2)  # type: ignore[attr-defined]
    options = GenerationOptions(prior_tokens=(2, 10, 11))
    generation = layer.prepare_prompt(PromptRequest(prompt=[2, 50, 51], options=options))
    assert generation.prompt_tokens == [2, 10, 11, 50, 51]
    assert layer.prepare_prompt(PromptRequest(prompt=[2, 50])).prompt_tokens == [2, 50]


def test_a_context_limit_below_the_slot_bounds_prompt_and_answer_above_it_is_ignored(layer: ChatLayer) -> None:
    def max_tokens(limit: int | None, asked: int | None = -1) -> int:
        options = GenerationOptions(max_tokens=asked, context_limit=limit)
        return layer.prepare_prompt(PromptRequest(prompt="x" * 100, options=options)).max_tokens

    assert max_tokens(None) == -1 and max_tokens(8192) == -1  # the slot holds 4096: Ollama would reload
    assert max_tokens(120) == 20 and max_tokens(120, asked=5) == 5 and max_tokens(120, asked=None) == 20
    with pytest.raises(ContextOverflowError) as info:
        max_tokens(64)
    assert info.value.extra == {"n_prompt_tokens": 100, "n_ctx": 64}


@pytest.mark.parametrize(("req", "quick"), [
    (PromptRequest(prompt="Once upon a time"), True),
    (PromptRequest(prompt=[1, 2, 3, "more text"]), True),
    (PromptRequest(prompt="x" * (INLINE_PROMPT_SIZE + 1)), False),  # tokenized on a worker thread
    (PromptRequest(prompt="{", output=OutputConstraint(schema={"type": "object"})), False),  # a schema to compile
    (PromptRequest(prompt="{", output=OutputConstraint(grammar='root ::= "{"')), True),  # parsed by the sampler
    (PromptRequest(prompt="<__media__>", media=(MediaPart(kind="image", data=b"\x89PNG"),)), False),
])
def test_a_short_raw_prompt_is_prepared_on_the_event_loop(req: PromptRequest, quick: bool) -> None:
    assert quick_to_prepare(req) is quick


def _chat(*texts: str, **fields: object) -> ChatRequest:
    return ChatRequest(messages=tuple(Message(role="user", parts=(TextPart(text),)) for text in texts),
                       **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("req", "quick"), [
    (_chat("You are terse.", "Hello!"), True),
    (_chat("x" * (INLINE_PROMPT_SIZE // 2), "y" * (INLINE_PROMPT_SIZE // 2 + 1)), False),  # on a worker thread
    (_chat("Weather in Rome?", tools=(WEATHER,)), False),  # the tools' grammar to build
    (_chat("A JSON object", output=OutputConstraint(any_json=True)), False),  # a schema to compile
    (ChatRequest(messages=(Message(role="user", parts=(MediaPart(kind="image", data=b"\x89PNG"),)),)), False),
    (ChatRequest(messages=(Message(role="user", parts=(TextPart("Rome?"),)), Message(
        role="assistant", tool_calls=(ToolCall(id="c1", name="get_weather", arguments='{"city": "Rome"}'),)))),
     False),
])
def test_a_short_chat_is_prepared_on_the_event_loop(req: ChatRequest, quick: bool) -> None:
    assert quick_to_prepare_chat(req) is quick
