"""`kinetic serve` with no arguments: the bundled chat model (SmolLM2 135M Instruct) is served, the start says
where to go, and a first "hello" gets an answer on the chat page and through the SDK (issue 48).

The model is tiny and often wrong: the tests check shapes (non-empty text, finish_reason, usage, a valid tool
call, output that parses against its schema), never wording. What `tool_choice: auto` did is reported in
tests/artifacts/default-model-auto.json, not asserted.

KINETIC_REGENERATE_REFERENCE=1 also rewrites the quick start's screenshot (docs/assets/chat-first-hello.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from kinetic.backends.bundled import CHAT_MODEL, DEFAULT_ALIAS
from kinetic.server.welcome import WELCOME_MAX_TOKENS
from tests.browser import ARTIFACTS, chromium_context
from tests.lab_04_03_runs import student_runs
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "assets" / "chat-first-hello.png"
# what would show that the template was continued instead of answered: ChatML's markers, or its roles' names
TEMPLATE_TEXT = re.compile(r"<\|im_(start|end)\|>|^\s*(user|assistant|system)\b", re.MULTILINE)
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Today's weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def server(default_server: KineticServer) -> KineticServer:
    return default_server  # no model, no flags: a first run


def chat(server: KineticServer, **body: Any) -> dict[str, Any]:
    response = httpx.post(server.url + "/v1/chat/completions", json={"model": DEFAULT_ALIAS, **body}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_model_is_named_for_what_it_is(server: KineticServer) -> None:
    models = httpx.get(server.url + "/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [CHAT_MODEL.name]
    props = httpx.get(server.url + "/props", timeout=10).json()
    assert props["model_alias"] == CHAT_MODEL.name
    assert Path(props["model_path"]).name == f"{CHAT_MODEL.name}.gguf"
    assert props["chat_template_origin"] == "gguf" and "<|im_start|>" in props["chat_template"]


def test_the_start_says_where_to_go_and_its_curl_answers(server: KineticServer) -> None:
    lines = server.log().splitlines()
    listening = lines.index(f"listening on {server.url}")  # llama-server's line, as scripts read it
    # the welcome lines follow it (stdout; a log line on stderr may come between them in this merged file)
    welcome = [line for line in lines[listening + 1:] if line.startswith(("chat page: ", "model: ", "try: "))][:3]
    assert welcome[0] == f"chat page: {server.url}/"
    assert re.fullmatch(rf"model: {re.escape(CHAT_MODEL.name)}, context \d+ tokens in each of \d+ slot\(s\)",
                        welcome[1]), welcome
    assert welcome[2].startswith("try: curl ")
    # as pasted into a shell; `exec` so that a timeout kills curl itself (dash forks it, and a curl left behind
    # keeps its request generating on the session's server while the tests after this one run)
    proc = subprocess.run(["/bin/sh", "-c", "exec " + welcome[2].removeprefix("try: ")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["choices"][0]["message"]["content"].strip()
    assert answer["usage"]["completion_tokens"] <= WELCOME_MAX_TOKENS  # a first try that always ends in seconds


def test_hello_gets_an_answer_not_the_template(server: KineticServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="no-key-required", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=DEFAULT_ALIAS, messages=[{"role": "user", "content": "hello"}],
                                           max_tokens=48)
    text = reply.choices[0].message.content or ""
    assert text.strip() and not TEMPLATE_TEXT.search(text), text
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0 and 0 < reply.usage.completion_tokens <= 48


def test_the_chat_page_greets_and_answers_hello(server: KineticServer) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium_context() as context:
        page = context.new_page()  # type: ignore[attr-defined]
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'", timeout=60_000)
        assert CHAT_MODEL.name in page.inner_text("#log .greeting")
        assert "no chat template" not in page.inner_text("#log .greeting")
        page.fill("#max-tokens", "48")
        page.fill("#message", "hello")
        page.click("#send")
        turn = page.wait_for_selector(".turn.assistant:not(.streaming) .stats [data-name=tokens-per-second]",
                                      timeout=120_000).evaluate_handle("node => node.closest('.turn')").as_element()
        text = turn.query_selector(".content").inner_text()
        assert text.strip() and not TEMPLATE_TEXT.search(text), text
        assert not page.query_selector("#log .greeting")
        page.screenshot(path=str(ARTIFACTS / "chat-first-hello.png"))
        assert not errors, errors
    if os.environ.get("KINETIC_REGENERATE_REFERENCE") == "1":
        shutil.copyfile(ARTIFACTS / "chat-first-hello.png", SCREENSHOT)


def test_a_forced_tool_call_is_valid(server: KineticServer) -> None:
    answer = chat(server, messages=[{"role": "user", "content": "What is the weather in Rome?"}],
                  tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  max_tokens=64)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather" and call["id"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_TOOL["function"]["parameters"])


def test_json_schema_output_parses(server: KineticServer) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    answer = chat(server, messages=[{"role": "user", "content": "Invent a person: a name and an age."}],
                  response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
                  max_tokens=64)
    assert answer["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(answer["choices"][0]["message"]["content"]), schema)


def test_tool_choice_auto_is_reported(server: KineticServer) -> None:
    """Whether the model calls the tool is its own choice: the shape is checked, what it did is reported."""
    answer = chat(server, messages=[{"role": "user", "content": "What is the weather in Rome today?"}],
                  tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=64)
    choice = answer["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    assert (choice["finish_reason"] == "tool_calls") == bool(calls)
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        json.loads(call["function"]["arguments"])
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    report = {"model": CHAT_MODEL.name, "called": bool(calls), "finish_reason": choice["finish_reason"],
              "tool_calls": calls, "content": choice["message"].get("content")}
    (ARTIFACTS / "default-model-auto.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"tool_choice auto on {CHAT_MODEL.name}: {'called the tool' if calls else 'answered in text'}",
          file=sys.stderr)


def test_lab_04_03_scripts_run_against_it(server: KineticServer) -> None:
    """The lab's own scripts, as a student runs them (each exits 0): the schema's answer validates, the forced
    call reaches the tool and its result goes back, the streamed call ends in tool_calls."""
    runs = student_runs(server.url, None)
    assert "[valido: " in runs.schema
    assert "nome=meteo argomenti=" in runs.tools and "finish_reason=tool_calls" in runs.tools
    assert "[risultato inviato con tool_call_id=" in runs.tools
    assert "finish_reason=tool_calls]" in runs.stream
    assert re.search(r"\[tool_calls: \d+\]", runs.auto)
