"""The ledger line of each protocol's request, whole and streamed, holds the counts its client was told.

One keyed server with `--ledger`; each test sends one request through the protocol's real client (the
openai, anthropic and ollama SDKs, httpx for llama-server's native routes), then finds the line by the
response id (or, where a protocol has none, by the key's last line on that route) and compares its
numbers with the client's own: OpenAI's and Responses' `usage`, Anthropic's `usage` (input tokens
there exclude the cache reads), Ollama's `prompt_eval_count`/`eval_count`, llama-server's
`tokens_evaluated`/`tokens_predicted`, and the id of every tool call a forced `tool_choice` made.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from kinetic.classroom.ledger import LedgerRecord, read_ledger
from tests.server import KineticServer, wait_until

pytestmark = pytest.mark.e2e

KEY, NAME = "sk-ledger-5a1e", "lena"
OTHER_KEY, OTHER = "sk-ledger-77b0", "otto"
ADMIN = "sk-admin-ledger"
MODEL = "ledger-gemma"
MAX = 8
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Rome?"}]


@pytest.fixture(scope="module")
def server(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KineticServer, Path]]:
    folder = tmp_path_factory.mktemp("ledger")
    keys = folder / "keys.txt"
    keys.write_text(f"{KEY} {NAME}\n{OTHER_KEY} {OTHER}\n")
    ledger = folder / "ledger.jsonl"
    with KineticServer("-c", "2048", "-np", "2", "-a", MODEL, "--embeddings", "--metrics", "--api-key-file", str(keys),
                       "--admin-key", ADMIN, "--ledger", str(ledger)) as running:
        yield running, ledger


def line(ledger: Path, matches: Callable[[LedgerRecord], bool]) -> LedgerRecord:
    """The last line that `matches` (the record is written before the answer's end goes out)."""
    found: list[LedgerRecord] = []

    def present() -> bool:
        found[:] = [r for r in read_ledger(ledger) if matches(r)]
        return bool(found)

    wait_until(present, "the request's ledger line", timeout=10)
    record = found[-1]
    assert record.client == NAME and record.status == 200 and record.error is None
    return record


def by_id(ledger: Path, response_id: str) -> LedgerRecord:
    return line(ledger, lambda r: r.id == response_id)


def last_on(ledger: Path, route: str, stream: bool) -> LedgerRecord:
    """For protocols without a response id: the tests run in order, so the newest line on the route."""
    return line(ledger, lambda r: r.route == route and r.stream == stream)


def assert_counts(record: LedgerRecord, prompt: int, completion: int, cached: int | None = None) -> None:
    assert (record.prompt_tokens, record.completion_tokens) == (prompt, completion)
    assert record.total_tokens == prompt + completion
    if cached is not None:
        assert record.cached_tokens == cached
    assert record.timings is not None and record.timings["predicted_n"] == completion


@pytest.fixture()
def oai(server: tuple[KineticServer, Path]) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0].url + "/v1", api_key=KEY, max_retries=0, timeout=60)


# ------------------------------------------------------------------------------------- OpenAI


def test_chat_whole_and_streamed(server: tuple[KineticServer, Path], oai: openai.OpenAI) -> None:
    ledger = server[1]
    whole = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX, temperature=0)
    assert whole.usage is not None
    record = by_id(ledger, whole.id)
    assert_counts(record, whole.usage.prompt_tokens, whole.usage.completion_tokens,
                  whole.usage.prompt_tokens_details.cached_tokens if whole.usage.prompt_tokens_details else None)
    assert record.finish_reason == whole.choices[0].finish_reason and record.stream is False
    chunks = list(oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None
    record = by_id(ledger, chunks[0].id)
    assert_counts(record, usage.prompt_tokens, usage.completion_tokens)
    assert record.stream and record.chunks == sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert record.ttft_s is not None and 0 < record.ttft_s <= record.duration_s


def test_forced_tool_calls_keep_their_ids(server: tuple[KineticServer, Path], oai: openai.OpenAI) -> None:
    ledger = server[1]
    forced: Any = {"type": "function", "function": {"name": "get_weather"}}
    whole = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0, tools=[WEATHER],
                                        tool_choice=forced)
    calls = whole.choices[0].message.tool_calls or []
    assert calls
    record = by_id(ledger, whole.id)
    assert [(c.id, c.name) for c in record.tool_calls] == [(c.id, c.function.name) for c in calls]
    assert record.finish_reason == "tool_calls"
    chunks = list(oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=40, temperature=0,
                                              tools=[WEATHER], tool_choice=forced, stream=True))
    started = [(t.id, t.function.name) for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []
               if t.id and t.function]
    assert started and [(c.id, c.name) for c in by_id(ledger, chunks[0].id).tool_calls] == started


def test_completions_whole_and_streamed(server: tuple[KineticServer, Path], oai: openai.OpenAI) -> None:
    ledger = server[1]
    whole = oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=MAX, temperature=0)
    assert whole.usage is not None
    assert_counts(by_id(ledger, whole.id), whole.usage.prompt_tokens, whole.usage.completion_tokens)
    chunks = list(oai.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=MAX, temperature=0,
                                         stream=True, stream_options={"include_usage": True}))
    usage = next(c.usage for c in chunks if c.usage)
    assert usage is not None
    record = by_id(ledger, chunks[0].id)
    assert_counts(record, usage.prompt_tokens, usage.completion_tokens)
    assert record.chunks == sum(1 for c in chunks if c.choices and c.choices[0].text)


def test_embeddings(server: tuple[KineticServer, Path], oai: openai.OpenAI) -> None:
    got = oai.embeddings.create(model=MODEL, input=["one cat", "two dogs"])
    record = last_on(server[1], "/v1/embeddings", False)
    assert record.prompt_tokens == got.usage.prompt_tokens > 0 and record.completion_tokens == 0


# ---------------------------------------------------------------------------------- Responses


def test_responses_whole_streamed_and_a_function_call(server: tuple[KineticServer, Path], oai: openai.OpenAI) -> None:
    ledger = server[1]
    whole = oai.responses.create(model=MODEL, input="Say hi.", max_output_tokens=MAX, temperature=0)
    assert whole.usage is not None
    record = by_id(ledger, whole.id)
    assert_counts(record, whole.usage.input_tokens, whole.usage.output_tokens,
                  whole.usage.input_tokens_details.cached_tokens)
    told = whole.incomplete_details.reason if whole.incomplete_details else whole.status
    assert record.finish_reason == told
    with oai.responses.stream(model=MODEL, input="Say hi.", max_output_tokens=MAX, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.usage is not None
    record = by_id(ledger, final.id)
    assert_counts(record, final.usage.input_tokens, final.usage.output_tokens)
    assert record.chunks == sum(1 for e in events if e.type == "response.output_text.delta" and e.delta)
    called = oai.responses.create(model=MODEL, input="Weather in Rome?", max_output_tokens=40, temperature=0,
                                  tools=[{"type": "function", **WEATHER["function"]}],  # type: ignore[list-item]
                                  tool_choice={"type": "function", "name": "get_weather"})
    calls = [(item.call_id, item.name) for item in called.output if item.type == "function_call"]
    assert calls and [(c.id, c.name) for c in by_id(ledger, called.id).tool_calls] == calls


# ---------------------------------------------------------------------------------- Anthropic


def test_messages_whole_streamed_and_a_tool_use(server: tuple[KineticServer, Path]) -> None:
    ledger = server[1]
    client = anthropic.Anthropic(base_url=server[0].url, api_key=KEY, max_retries=0, timeout=60)
    greedy = {"temperature": 0}
    whole = client.messages.create(model=MODEL, max_tokens=MAX, messages=ASK, extra_body=greedy)  # type: ignore[arg-type]
    record = by_id(ledger, whole.id)
    cached = whole.usage.cache_read_input_tokens or 0
    assert_counts(record, whole.usage.input_tokens + cached, whole.usage.output_tokens, cached)
    assert record.finish_reason == whole.stop_reason
    with client.messages.stream(model=MODEL, max_tokens=MAX, messages=ASK, extra_body=greedy) as stream:  # type: ignore[arg-type]
        events = list(stream)
        final = stream.get_final_message()
    record = by_id(ledger, final.id)
    cached = final.usage.cache_read_input_tokens or 0
    assert_counts(record, final.usage.input_tokens + cached, final.usage.output_tokens, cached)
    assert record.chunks == sum(1 for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
                                and e.delta.text)
    tool = {"name": "get_weather", "description": "Current weather in a city",
            "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    used = client.messages.create(model=MODEL, max_tokens=40, messages=ASK, tools=[tool],  # type: ignore[list-item]
                                  tool_choice={"type": "tool", "name": "get_weather"}, extra_body=greedy)
    blocks = [(b.id, b.name) for b in used.content if b.type == "tool_use"]
    record = by_id(ledger, used.id)
    assert blocks and [(c.id, c.name) for c in record.tool_calls] == blocks and record.finish_reason == "tool_use"


# ------------------------------------------------------------------------------------- Ollama


def test_ollama_chat_and_generate_whole_and_streamed(server: tuple[KineticServer, Path]) -> None:
    ledger = server[1]
    client = ollama.Client(host=server[0].url, headers={"Authorization": f"Bearer {KEY}"})
    options = {"num_predict": MAX, "temperature": 0}
    for route, call in (("/api/chat", lambda s: client.chat(model=MODEL, messages=ASK, options=options, stream=s)),
                        ("/api/generate", lambda s: client.generate(model=MODEL, prompt="Once upon", options=options,
                                                                    stream=s))):
        whole = call(False)
        record = last_on(ledger, route, False)
        assert (record.prompt_tokens, record.completion_tokens) == (whole.prompt_eval_count, whole.eval_count)
        assert record.finish_reason == whole.done_reason
        parts = list(call(True))
        record = last_on(ledger, route, True)
        assert (record.prompt_tokens, record.completion_tokens) == (parts[-1].prompt_eval_count, parts[-1].eval_count)
        texts = [p.message.content if route == "/api/chat" else p.response for p in parts]
        assert record.chunks == sum(1 for text in texts if text)
    vectors = client.embed(model=MODEL, input=["one cat", "two dogs"])
    assert last_on(ledger, "/api/embed", False).prompt_tokens == vectors.prompt_eval_count


# ----------------------------------------------------------------------------- llama-server's


def test_native_completion_whole_and_streamed(server: tuple[KineticServer, Path]) -> None:
    url, ledger = server[0].url, server[1]
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": "Once upon a time", "n_predict": MAX, "temperature": 0}
    whole = httpx.post(url + "/completion", json=body, headers=headers, timeout=60).json()
    record = last_on(ledger, "/completion", False)
    assert (record.prompt_tokens, record.completion_tokens) == (whole["tokens_evaluated"], whole["tokens_predicted"])
    assert record.timings == whole["timings"]
    with httpx.stream("POST", url + "/completion", json={**body, "stream": True}, headers=headers, timeout=60) as r:
        frames = [json.loads(x[5:]) for x in r.iter_lines() if x.startswith("data: ") and x != "data: [DONE]"]
    record = last_on(ledger, "/completion", True)
    final = frames[-1]
    assert (record.prompt_tokens, record.completion_tokens) == (final["tokens_evaluated"], final["tokens_predicted"])
    assert record.chunks == sum(1 for f in frames if f.get("content"))


def test_a_rejected_call_and_a_plain_route_still_get_lines(server: tuple[KineticServer, Path]) -> None:
    url, ledger = server[0].url, server[1]
    assert httpx.post(url + "/v1/chat/completions", json={"messages": ASK}, timeout=10).status_code == 401
    wait_until(lambda: any(r.status == 401 and r.auth == "missing" for r in read_ledger(ledger)), "the 401's line")
    rejected = [r for r in read_ledger(ledger) if r.status == 401][-1]
    assert rejected.error is not None and rejected.error.message == "Invalid API Key" and rejected.prompt_tokens is None
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).status_code == 200
    listed = line(ledger, lambda r: r.route == "/v1/models")
    assert listed.method == "GET" and listed.prompt_tokens is None


# ------------------------------------------------------------------------- per-student figures


def key_lines(text: str) -> dict[tuple[str, str], float]:
    """`llamacpp:<figure>_by_key_total{key="name"} N` lines of a /metrics answer, by (figure, name)."""
    found = {}
    for row in text.splitlines():
        if "_by_key_total{" in row:
            name, value = row.rsplit(" ", 1)
            figure, label = name.removeprefix("llamacpp:").removesuffix("}").split("_by_key_total{key=")
            found[(figure, label.strip('"'))] = float(value)
    return found


def test_per_key_figures_for_the_instructor_and_each_students_own(server: tuple[KineticServer, Path]) -> None:
    url, ledger = server[0].url, server[1]
    other = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                       headers={"Authorization": f"Bearer {OTHER_KEY}"}, timeout=60)
    assert other.status_code == 200
    wait_until(lambda: any(r.client == OTHER for r in read_ledger(ledger)), "otto's line")
    mine = [r for r in read_ledger(ledger) if r.client == NAME]
    admin = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert admin.status_code == 200 and "llamacpp:prompt_tokens_total " in admin.text  # llama-server's names kept
    figures = key_lines(admin.text)
    expected = {"requests": len(mine), "prompt_tokens": sum(r.prompt_tokens or 0 for r in mine),
                "completion_tokens": sum(r.completion_tokens or 0 for r in mine),
                "errors": sum(r.status >= 400 or r.error is not None for r in mine)}
    assert {figure: figures[(figure, NAME)] for figure in expected} == expected
    assert figures[("requests", OTHER)] == 1 and figures[("completion_tokens", OTHER)] == 2
    assert figures[("requests", "unknown")] >= 1  # the rejected call above
    own = key_lines(httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text)
    assert {name for _, name in own} == {NAME}  # a student sees their own line, never another's
    dashboard = httpx.get(url + "/dashboard/stats", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).json()
    row = next(s for s in dashboard["students"] if s["name"] == NAME)
    # the dashboard now counts the metrics scrape too: everything else is as /metrics said
    assert row["requests"] == len(mine) + 1
    assert row["prompt_tokens"] == expected["prompt_tokens"]
    assert row["completion_tokens"] == expected["completion_tokens"]
