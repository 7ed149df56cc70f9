"""Key names and the request ledger without a model: parsing, lookup, concurrent appends, and the
ledger middleware around small ASGI apps that answer like the real routes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from kinetic.classroom.caller import Caller
from kinetic.classroom.keys import KeyFileError, KeyRing, key_from_headers, parse_key_lines
from kinetic.classroom.ledger import (
    ErrorRecord,
    LedgerMiddleware,
    LedgerRecord,
    LedgerWriter,
    ToolCallRecord,
    read_ledger,
)
from kinetic.classroom.outcome import Outcome
from kinetic.classroom.request_record import request_record
from kinetic.classroom.roles import Role
from kinetic.engine.types import Finished, Timings, Usage
from kinetic.errors import UnauthorizedError
from kinetic.server.gate import refuse

TIMINGS = Timings(cache_n=2, prompt_n=7, prompt_ms=20.0, predicted_n=3, predicted_ms=30.0)
FINISHED = Finished(finish_reason="length", stop_type="limit", stopping_word="", text="abc", tokens=[1, 2, 3],
                    usage=Usage(prompt_tokens=9, completion_tokens=3, cached_tokens=2), timings=TIMINGS, id_slot=0,
                    tokens_cached=11, truncated=False)


def test_key_file_lines_names_and_comments(tmp_path: Path) -> None:
    entries = parse_key_lines("# class of 2026\nsk-a alice\n\nsk-b  bob.rossi   # second row\nsk-c\nsk#d dan\n")
    assert [(e.key, e.name) for e in entries] == [("sk-a", "alice"), ("sk-b", "bob.rossi"), ("sk-c", "key-3"),
                                                 ("sk#d", "dan")]
    with pytest.raises(KeyFileError, match="line 2: expected `KEY \\[name\\] \\[field=value \\.\\.\\.\\]`"):
        parse_key_lines("a b\nx y z\n")
    with pytest.raises(KeyFileError, match="line 1: the name 'a/b'"):
        parse_key_lines("k a/b\n")


def test_key_ring_names_keys_and_reloads(tmp_path: Path) -> None:
    file = tmp_path / "keys.txt"
    file.write_text("sk-a alice\n")
    ring = KeyRing("inline1,inline2", file)
    assert ring.name_for("sk-a") == "alice" and ring.name_for("inline2") == "key-2" and ring.name_for("nope") is None
    assert ring.keys == ("inline1", "inline2", "sk-a") and ring.names == ["key-1", "key-2", "alice"]
    file.write_text("sk-a alice\nsk-b bob\n")
    ring.reload()
    assert ring.name_for("sk-b") == "bob" and len(ring) == 4 and not KeyRing()
    assert key_from_headers({"authorization": "Bearer sk-a"}) == key_from_headers({"x-api-key": "sk-a"}) == "sk-a"


def test_ledger_lines_stay_whole_under_concurrent_writers(tmp_path: Path) -> None:
    writer = LedgerWriter(tmp_path / "sub" / "ledger.jsonl")

    def write_many(n: int) -> None:
        for i in range(200):
            writer.write(LedgerRecord(client=f"w{n}", status=i, route="/" + "x" * 500))

    threads = [threading.Thread(target=write_many, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = read_ledger(writer.path)
    assert len(records) == 1600 and sorted({r.client or "" for r in records}) == [f"w{n}" for n in range(8)]
    writer.close()


def test_reading_while_a_line_is_being_written_skips_the_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"route": "/a", "status": 200}\nnot json\n{"route": "/b", "status": 401}\n{"route": ')
    assert [(r.route, r.status) for r in read_ledger(path)] == [("/a", 200), ("/b", 401)]


def test_a_line_written_before_the_typed_record_reads_the_same() -> None:
    # the field names of the untyped lines are the record's: a ledger of an older server still grades
    old = ('{"time":"2026-12-01T10:31:02.120Z","duration_s":0.61,"client":"alice","auth":"ok","addr":"10.0.0.7",'
           '"method":"POST","route":"/v1/chat/completions","status":200,"stream":true,"id":"chatcmpl-1",'
           '"model":"m","prompt_tokens":9,"cached_tokens":0,"completion_tokens":3,"timings":{"cache_n":0,'
           '"prompt_ms":12.5},"tool_calls":[{"id":"AbC","name":"meteo"}],"chunks":3,"ttft_s":0.05,'
           '"finish_reason":"length"}\n')
    record = LedgerRecord.from_line(old)
    assert record is not None and record.tool_calls == [ToolCallRecord(id="AbC", name="meteo")]
    assert (record.client, record.prompt_tokens, record.chunks, record.timing("prompt_ms")) == ("alice", 9, 3, 12.5)
    written = json.loads(record.to_line())
    assert written == {**json.loads(old)}  # no field added where the old line had none, none renamed
    assert LedgerRecord.from_line("[1, 2]") is None and LedgerRecord.from_line('{"status": "x"}') is None


ANSWER_DELAY_S = 0.05  # the full answer's time in the handler: the ledger's duration includes it


async def chat(request):  # a route as the real ones: it answers and hands the ledger what it told
    body = await request.json()
    if body.get("stream"):
        outcome = Outcome(id="chatcmpl-s", model="m")
        request_record(request).add_outcomes(outcome)

        def frames():
            for word in ("a", "b", "c"):
                outcome.chunk(word)
                yield f"data: {word}\n\n".encode()
            outcome.finished(FINISHED, "length")
            yield b"data: [DONE]\n\n"
        return StreamingResponse(frames(), media_type="text/event-stream")
    await asyncio.sleep(ANSWER_DELAY_S)
    outcome = Outcome(id="chatcmpl-j", model="m")
    outcome.call("call_1", "meteo")
    outcome.finished(FINISHED, "tool_calls", answer="abc")
    request_record(request).add_outcomes(outcome)
    return JSONResponse({"the body": "is not read by the ledger"})


class NameGate:
    """Stands in for kinetic.server.gate.RequestGate: puts the key's Caller in the scope, or answers 401."""

    def __init__(self, app, ring: KeyRing):
        self.app, self.ring = app, ring

    async def __call__(self, scope, receive, send):
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        name = self.ring.name_for(key_from_headers(headers))
        if name is None:
            await refuse(scope, UnauthorizedError("Invalid API Key"))(scope, receive, send)
            return
        request_record(scope).identify(Caller(name, Role.STUDENT))
        await self.app(scope, receive, send)


def ledger_client(tmp_path: Path, content: bool) -> tuple[TestClient, Path]:
    path = tmp_path / "ledger.jsonl"
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-a alice\n")
    ring = KeyRing(file=keys)
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    app.add_middleware(NameGate, ring=ring)
    app.add_middleware(LedgerMiddleware, writer=LedgerWriter(path, content=content), keyed=True)
    return TestClient(app), path


def test_middleware_records_names_outcomes_streams_and_401s_without_text(tmp_path: Path) -> None:
    client, path = ledger_client(tmp_path, content=False)
    alice = {"Authorization": "Bearer sk-a"}
    messages = [{"role": "user", "content": "secret prompt"}]
    started = time.monotonic()
    assert client.post("/v1/chat/completions", headers=alice, json={"messages": messages}).status_code == 200
    took = time.monotonic() - started
    assert client.post("/v1/chat/completions", headers=alice,
                       json={"messages": messages, "stream": True}).status_code == 200
    assert client.post("/v1/chat/completions", json={"messages": messages}).status_code == 401
    assert client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-a-typo"},
                       json={}).status_code == 401
    full, stream, missing, wrong = read_ledger(path)
    assert (full.client, full.auth, full.status, full.stream, full.id) == ("alice", "ok", 200, False, "chatcmpl-j")
    assert (full.prompt_tokens, full.cached_tokens, full.completion_tokens, full.total_tokens) == (9, 2, 3, 12)
    assert full.timings == TIMINGS.to_dict() and full.chunks is None and full.ttft_s is None
    assert full.finish_reason == "tool_calls" and full.tool_calls == [ToolCallRecord(id="call_1", name="meteo")]
    assert ANSWER_DELAY_S <= full.duration_s <= took + 0.001  # the request's own time, as the client saw it
    assert stream.stream and stream.chunks == 3 and stream.id == "chatcmpl-s" and stream.completion_tokens == 3
    assert stream.finish_reason == "length" and stream.ttft_s is not None and 0 <= stream.ttft_s <= stream.duration_s
    assert (missing.status, missing.auth, missing.client, missing.prompt_tokens) == (401, "missing", None, None)
    assert missing.error == ErrorRecord(type="authentication_error", message="Invalid API Key")
    assert (wrong.status, wrong.auth) == (401, "wrong")
    text = path.read_text()
    assert "secret prompt" not in text and "sk-a" not in text and '"abc"' not in text


def test_ledger_content_keeps_prompt_and_answer(tmp_path: Path) -> None:
    client, path = ledger_client(tmp_path, content=True)
    body = {"messages": [{"role": "user", "content": "secret prompt"}], "stream": True}
    client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-a"}, json=body)
    (record,) = read_ledger(path)
    assert record.request == body and record.answer == "abc"


def test_serve_flags_for_the_ledger() -> None:
    from kinetic.config.args import parse_serve_args

    settings = parse_serve_args(["--ledger", "class.jsonl", "--ledger-content"], environ={})
    assert settings.ledger == "class.jsonl" and settings.ledger_content
    assert parse_serve_args([], environ={"KINETIC_LEDGER": "env.jsonl"}).ledger == "env.jsonl"
    assert not parse_serve_args([], environ={}).ledger_content
