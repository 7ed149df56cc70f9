"""The reasoning budget (kinetic.engine.llama.reasoning_budget's state machine, llama.cpp's
common/reasoning-budget.cpp), where a request's budget comes from, --reasoning-preserve and
--skip-chat-parsing in the chat layer."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from kinetic.chat.prepare import ChatLayer, ServerDefaults
from kinetic.chat.reasoning_control import UNLIMITED, preserve_variables, reasoning_budget
from kinetic.chat.templates import ChatTemplate
from kinetic.chat.types import ChatRequest, Message, OutputConstraint, TextPart, ToolChoice, ToolSpec
from kinetic.cli import parse_serve_args
from kinetic.engine.base import Generation
from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.llama.reasoning_budget import BudgetState, BudgetTracker
from kinetic.engine.types import ReasoningBudget
from kinetic.protocols.anthropic.translate import to_chat_request as anthropic_chat
from kinetic.protocols.anthropic.types import MessagesRequest
from kinetic.protocols.openai.control import RunningCompletion, RunningCompletions, control
from kinetic.protocols.openai.translate import to_chat_request as openai_chat
from kinetic.protocols.openai.types import ChatCompletionRequest, ControlRequest
from tests.scripted import ScriptedEngine


class ByteModel:
    """A tokenizer of one token per byte, as LoadedModel's tokenize and token_piece answer."""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        return bytes([token])


def tracker(tokens: int, *, starts_inside: bool = True, message: str = "") -> BudgetTracker:
    return BudgetTracker(ReasoningBudget(tokens=tokens, message=message, starts_inside=starts_inside),
                         cast(LoadedModel, ByteModel()))


def generate(budget: BudgetTracker, text: str, *, upto: int = 200) -> str:
    """What a model that would write `text` writes under the budget (forced tokens win)."""
    out = bytearray()
    planned = iter(text.encode("utf-8"))
    for _ in range(upto):
        forced = budget.forced_token()
        token = forced if forced is not None else next(planned, None)
        if token is None:
            break
        out.append(token)
        budget.accept(token)
    return out.decode("utf-8")


def test_the_end_tag_is_forced_after_the_budget() -> None:
    budget = tracker(5, message=" ok.")
    assert generate(budget, "abcdefghij") == "abcde ok.</think>fghij"
    assert budget.state is BudgetState.DONE and budget.thinking_tokens == 5


def test_zero_forces_the_end_at_once() -> None:
    assert generate(tracker(0), "abc") == "</think>abc"


def test_a_natural_end_stops_the_count() -> None:
    budget = tracker(50)
    assert generate(budget, "ab</think>cdefgh") == "ab</think>cdefgh"
    assert budget.state is BudgetState.DONE


def test_outside_a_think_block_nothing_counts_until_one_opens() -> None:
    budget = tracker(3, starts_inside=False)
    assert generate(budget, "hello <think>abcdefg") == "hello <think>abc</think>defg"


def test_a_character_is_finished_before_the_end_is_forced() -> None:
    # "é" is two bytes: the budget runs out on its first one, the second still comes before </think>
    assert generate(tracker(2), "aéxyz") == "aé</think>xyz"


def test_another_block_gets_a_fresh_budget() -> None:
    assert generate(tracker(2), "abc<think>defg") == "ab</think>c<think>de</think>fg"


def user(text: str) -> Message:
    return Message(role="user", parts=(TextPart(text),))


def budget_of(req: ChatRequest, **where: Any) -> ReasoningBudget | None:
    args = {"server_tokens": 16, "server_message": "", "thinks": True, "starts_inside": True, "constrained": False}
    return reasoning_budget(req, **{**args, **where})


def test_the_requests_budget_wins_and_minus_one_is_the_servers() -> None:
    plain = ChatRequest(messages=(user("hi"),))
    assert budget_of(plain) == ReasoningBudget(tokens=16, starts_inside=True)
    assert budget_of(ChatRequest(messages=(user("hi"),), reasoning_budget=3,
                                 reasoning_budget_message="!")) == ReasoningBudget(tokens=3, message="!",
                                                                                     starts_inside=True)
    assert budget_of(ChatRequest(messages=(user("hi"),), reasoning_budget=-1)).tokens == 16  # type: ignore
    assert budget_of(plain, server_tokens=-1) is None
    assert budget_of(plain, thinks=False) is None and budget_of(plain, constrained=True) is None


def test_protocols_carry_the_budget_fields() -> None:
    def openai(**fields: Any) -> ChatRequest:
        return openai_chat(ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields))

    assert openai(thinking_budget_tokens=7).reasoning_budget == 7
    assert openai(reasoning_budget_tokens=5, thinking_budget_tokens=7).reasoning_budget == 5
    assert openai(reasoning_budget_message="stop").reasoning_budget_message == "stop"
    assert openai().reasoning_budget is None
    with pytest.raises(Exception, match="thinking_budget_tokens"):
        openai(thinking_budget_tokens=-2)

    def anthropic(thinking: dict[str, Any] | None) -> ChatRequest:
        return anthropic_chat(MessagesRequest(model="m", max_tokens=64, thinking=thinking,
                                              messages=[{"role": "user", "content": "hi"}]))

    assert anthropic({"type": "enabled", "budget_tokens": 20}).reasoning_budget == 20
    assert anthropic({"type": "enabled"}).reasoning_budget == 10000  # llama-server's default
    assert anthropic({"type": "disabled"}).reasoning_budget is None and anthropic(None).reasoning_budget is None


def test_the_reasoning_flags_parse() -> None:
    settings = parse_serve_args(["--reasoning-budget", "0", "--reasoning-budget-message", "Done.",
                                 "--no-reasoning-preserve", "--skip-chat-parsing"], environ={})
    assert (settings.reasoning_budget, settings.reasoning_budget_message) == (0, "Done.")
    assert settings.skip_chat_parsing is True
    assert settings.template_kwargs()["preserve_reasoning"] is False
    assert parse_serve_args([], environ={"LLAMA_ARG_THINK_BUDGET": "64"}).reasoning_budget == 64
    assert parse_serve_args([], environ={}).template_kwargs()["preserve_reasoning"] is True  # llama-server's


# Reads what --reasoning-preserve sets, as templates with a preserve switch do (LFM2.5's preserve_thinking)
PRESERVE_TEMPLATE = ("{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}"
                     "preserve={{ preserve_thinking }},clear={{ clear_thinking }},drop={{ drop_thinking }}"
                     "{% if add_generation_prompt %}|assistant:<think>\n{% endif %}")


def layer(**defaults: Any) -> ChatLayer:
    engine = ScriptedEngine([])
    engine.loaded.set()
    engine.load()
    return ChatLayer(engine, ChatTemplate(PRESERVE_TEMPLATE, "--chat-template"), ServerDefaults(**defaults))


def test_preserve_reasoning_reaches_the_template_as_llama_cpp_names_it() -> None:
    assert preserve_variables({"preserve_reasoning": False, "clear_thinking": False})["clear_thinking"] is False
    kept = layer(template_kwargs={"preserve_reasoning": True}).prepare_chat(ChatRequest(messages=(user("hi"),)))[0]
    assert "preserve=True,clear=False,drop=False" in bytes(kept.prompt_tokens).decode()  # the scripted tokens: bytes
    dropped = layer(template_kwargs={"preserve_reasoning": False}).prepare_chat(
        ChatRequest(messages=(user("hi"),)))[0]
    assert "preserve=False,clear=True,drop=True" in bytes(dropped.prompt_tokens).decode()


WEATHER = ToolSpec(name="get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})


def test_skip_chat_parsing_reads_nothing_out_of_the_answer() -> None:
    request = ChatRequest(messages=(user("hi"),), tools=(WEATHER,), tool_choice=ToolChoice("required"))
    generation, answer_format = layer(reasoning_budget=4, skip_chat_parsing=True).prepare_chat(request)
    assert answer_format.reasoning_format == "none" and answer_format.tool_mode == "none"
    assert generation.sampling.grammar is None and generation.reasoning_budget is None
    generation, answer_format = layer(reasoning_budget=4).prepare_chat(ChatRequest(messages=(user("hi"),)))
    assert answer_format.starts_in_reasoning and generation.reasoning_budget == ReasoningBudget(tokens=4,
                                                                                          starts_inside=True)
    schema = OutputConstraint(schema={"type": "object"}, param="response_format")
    constrained, _ = layer(reasoning_budget=4, skip_chat_parsing=True).prepare_chat(
        ChatRequest(messages=(user("hi"),), output=schema))
    assert constrained.sampling.grammar  # the request's own constraint still holds


# ---------------------------------------------------------------- reasoning control (/v1/chat/completions/control)


def test_reasoning_control_arms_a_budget_without_a_limit() -> None:
    armed = ChatRequest(messages=(user("hi"),), reasoning_control=True)
    assert budget_of(armed, server_tokens=-1) == ReasoningBudget(tokens=UNLIMITED, starts_inside=True,
                                                                 controllable=True)
    assert budget_of(ChatRequest(messages=(user("hi"),)), server_tokens=-1) is None  # not armed, no limit: none
    assert budget_of(armed, thinks=False) is None  # a template that does not think has nothing to end
    assert openai_chat(ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "reasoning_control": True})).reasoning_control


def test_reasoning_end_forces_the_end_tag_at_the_next_token_while_thinking() -> None:
    budget = BudgetTracker(ReasoningBudget(tokens=UNLIMITED, message=" ok.", starts_inside=True, controllable=True),
                           cast(LoadedModel, ByteModel()))
    out = generate(budget, "abc", upto=3)
    budget.end_now()  # from the event loop: acted on at the decode thread's next token
    assert out + generate(budget, "defghij") == "abc ok.</think>defghij"
    assert budget.state is BudgetState.DONE
    budget.end_now()  # the block is over: nothing left to end (llama.cpp's force only acts while counting)
    assert generate(budget, "xyz") == "xyz"


def test_the_control_route_acts_on_the_callers_running_completion_only() -> None:
    async def scenario() -> None:
        table = RunningCompletions()
        ended: list[str] = []
        mine = Generation(asyncio.Queue(), lambda: None, end_reasoning=lambda: ended.append("mine"))
        plain = Generation(asyncio.Queue(), lambda: None)
        table.add("chatcmpl-a", RunningCompletion(owner="alice", generation=mine, armed=True))
        table.add("chatcmpl-b", RunningCompletion(owner="alice", generation=plain, armed=False))
        body = ControlRequest(id="chatcmpl-a", action="reasoning_end")
        assert control(table, body, "bob") == {"success": False, "message": "no active completion for this id"}
        assert control(table, body, "alice") == {"success": True} and ended == ["mine"]
        assert control(table, ControlRequest(id="chatcmpl-b", action="reasoning_end"), "alice") == {
            "success": False, "message": "reasoning control not enabled for this completion"}
        mine.cancel()  # finished: no longer found, and the next addition forgets it
        assert control(table, body, "alice")["success"] is False
        table.add("chatcmpl-c", RunningCompletion(owner=None, generation=plain, armed=False))
        assert table.find("chatcmpl-a", "alice") is None and table.find("chatcmpl-c", "anyone") is not None

    asyncio.run(scenario())
