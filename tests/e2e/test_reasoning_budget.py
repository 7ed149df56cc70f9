"""The reasoning budget and --skip-chat-parsing (issue 23, part 4), on a real thinking template.

The bundled model serves Qwen3.5's template (tests/fixtures/templates), whose generation prompt opens
`<think>`: the model's text is reasoning until `</think>`. A base model never closes the block by itself,
so without a budget the whole answer is reasoning; with one, the engine forces the budget message and
`</think>` after N thinking tokens (llama-server's reasoning-budget sampler), and what follows is content.
Lengths are counted in tokens with the server's own /tokenize.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.server import KineticServer

pytestmark = pytest.mark.e2e

TEMPLATE = Path(__file__).resolve().parents[1] / "fixtures" / "templates" / "Qwen3.5-4B.jinja"
MAX_TOKENS = 48
BUDGET = 8
MESSAGE = " Time is up."
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Retokenizing a text may merge or split a token at its ends: a little slack on each count.
SLACK = 2


def serve(*flags: str) -> KineticServer:
    return KineticServer("-np", "1", "--chat-template-file", str(TEMPLATE), *flags)


@pytest.fixture(scope="module")
def plain(model_lock: None) -> Iterator[KineticServer]:
    with serve() as server:
        yield server


@pytest.fixture(scope="module")
def budgeted(model_lock: None) -> Iterator[KineticServer]:
    with serve("--reasoning-budget", str(BUDGET), "--reasoning-budget-message", MESSAGE) as server:
        yield server


def n_tokens(server: KineticServer, text: str) -> int:
    response = httpx.post(server.url + "/tokenize", json={"content": text, "add_special": False}, timeout=30)
    return len(response.json()["tokens"])


def chat(server: KineticServer, **fields: Any) -> dict[str, Any]:
    body = {"messages": QUESTION, "max_tokens": MAX_TOKENS, "temperature": 0, **fields}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_without_a_budget_the_model_thinks_until_max_tokens(plain: KineticServer) -> None:
    message = chat(plain)["choices"][0]["message"]
    assert not message.get("content")
    assert n_tokens(plain, message["reasoning_content"]) > BUDGET + SLACK + n_tokens(plain, MESSAGE)


@pytest.mark.parametrize("field", ["thinking_budget_tokens", "reasoning_budget_tokens"])
def test_a_requests_budget_ends_the_thinking_after_its_tokens(plain: KineticServer, field: str) -> None:
    answer = chat(plain, **{field: BUDGET})
    message = answer["choices"][0]["message"]
    assert BUDGET - SLACK <= n_tokens(plain, message["reasoning_content"]) <= BUDGET + SLACK
    assert message["content"]  # the rest of max_tokens is the answer
    assert answer["usage"]["completion_tokens"] == MAX_TOKENS


def test_a_budget_of_zero_leaves_no_thinking(plain: KineticServer) -> None:
    message = chat(plain, thinking_budget_tokens=0)["choices"][0]["message"]
    assert not message.get("reasoning_content")
    assert message["content"]


def test_a_streamed_answer_keeps_the_budget(plain: KineticServer) -> None:
    client = openai.OpenAI(base_url=plain.url + "/v1", api_key="none")
    stream = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=MAX_TOKENS,  # type: ignore
                                            temperature=0, stream=True,
                                            extra_body={"thinking_budget_tokens": BUDGET})
    reasoning, content = "", ""
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
    assert BUDGET - SLACK <= n_tokens(plain, reasoning) <= BUDGET + SLACK
    assert content


def test_anthropic_thinking_budget_tokens_is_the_budget(plain: KineticServer) -> None:
    client = anthropic.Anthropic(base_url=plain.url, api_key="none")
    reply = client.messages.create(model="m", max_tokens=MAX_TOKENS, messages=QUESTION,  # type: ignore[arg-type]
                                   thinking={"type": "enabled", "budget_tokens": BUDGET},
                                   extra_body={"temperature": 0})
    thinking = [block for block in reply.content if block.type == "thinking"]
    assert len(thinking) == 1
    assert BUDGET - SLACK <= n_tokens(plain, thinking[0].thinking) <= BUDGET + SLACK
    assert any(block.type == "text" for block in reply.content)


def test_the_server_budget_forces_its_message_then_the_end_tag(budgeted: KineticServer) -> None:
    for fields in ({}, {"thinking_budget_tokens": -1}):  # -1: the server's budget
        message = chat(budgeted, **fields)["choices"][0]["message"]
        reasoning = message["reasoning_content"]
        assert reasoning.endswith(MESSAGE)
        assert n_tokens(budgeted, reasoning) <= BUDGET + n_tokens(budgeted, MESSAGE) + SLACK
        assert message["content"]


def test_a_request_may_lift_the_server_budget(budgeted: KineticServer) -> None:
    message = chat(budgeted, thinking_budget_tokens=MAX_TOKENS * 2)["choices"][0]["message"]
    assert not message.get("content")
    assert MESSAGE not in message["reasoning_content"]


def test_skip_chat_parsing_makes_everything_content(plain: KineticServer, model_lock: None) -> None:
    """The same greedy tokens, all of them content: no reasoning is read out, and no budget applies."""
    thought = chat(plain)["choices"][0]["message"]["reasoning_content"]
    with serve("--skip-chat-parsing", "--reasoning-budget", str(BUDGET)) as server:
        message = chat(server)["choices"][0]["message"]
    assert not message.get("reasoning_content")
    assert message["content"].strip() == thought.strip()


def control(server: KineticServer, cmpl_id: str, action: str = "reasoning_end") -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions/control", json={"id": cmpl_id, "action": action}, timeout=30)


def test_reasoning_end_ends_a_running_completions_thinking(plain: KineticServer) -> None:
    """llama-server's POST /v1/chat/completions/control: sent while the stream is read, on its `id`; the rest
    of the answer is content. A completion without `reasoning_control` is not touched, a finished one is gone."""
    client = openai.OpenAI(base_url=plain.url + "/v1", api_key="none")
    stream = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=96,  # type: ignore
                                            temperature=0, stream=True, extra_body={"reasoning_control": True})
    reasoning, content, cmpl_id, answer = "", "", "", None
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        reasoning += (getattr(delta, "reasoning_content", None) or "") if delta else ""
        content += (delta.content or "") if delta else ""
        if not cmpl_id and reasoning:
            cmpl_id = chunk.id
            answer = control(plain, cmpl_id)
    assert answer is not None and answer.json() == {"success": True}
    assert content and n_tokens(plain, reasoning) < 48  # without the control all 96 tokens are reasoning
    assert control(plain, cmpl_id).json() == {"success": False, "message": "no active completion for this id"}

    unarmed = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=48,  # type: ignore
                                             temperature=0, stream=True)
    first = next(iter(unarmed))
    assert control(plain, first.id).json() == {
        "success": False, "message": "reasoning control not enabled for this completion"}
    rest = "".join((getattr(c.choices[0].delta, "reasoning_content", None) or "") for c in unarmed if c.choices)
    assert n_tokens(plain, rest) > 40  # thinks on to max_tokens
    bad = control(plain, first.id, action="stop")
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "unknown control action"
    assert control(plain, "").status_code == 400
