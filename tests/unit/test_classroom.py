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
from kinetic.classroom.ledger import LedgerMiddleware, LedgerWriter, absorb, content_of, read_ledger
from kinetic.classroom.roles import Role

TIMINGS = {"cache_n": 0, "prompt_n": 9, "prompt_per_second": 300.0, "predicted_n": 3, "predicted_per_second": 90.0}


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
            writer.write({"writer": n, "i": i, "pad": "x" * 500})

    threads = [threading.Thread(target=write_many, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = read_ledger(writer.path)
    assert len(records) == 1600 and sorted({r["writer"] for r in records}) == list(range(8))
    writer.close()


def test_reading_while_a_line_is_being_written_skips_the_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    assert read_ledger(path) == [{"a": 1}, {"b": 2}]


def test_absorb_reads_every_protocols_numbers() -> None:
    openai: dict[str, object] = {}
    absorb(openai, {"id": "chatcmpl-1", "model": "m",
                    "choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 9, "completion_tokens": 3,
                              "prompt_tokens_details": {"cached_tokens": 0}},
                    "timings": TIMINGS})
    assert openai == {"id": "chatcmpl-1", "model": "m", "prompt_tokens": 9, "completion_tokens": 3, "cached_tokens": 0,
                      "timings": TIMINGS, "finish_reason": "length"}
    anthropic: dict[str, object] = {}
    absorb(anthropic, {"type": "message_start", "message": {"id": "msg_1", "model": "m", "usage": {"input_tokens": 9}}})
    absorb(anthropic, {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 3}})
    assert anthropic == {"id": "msg_1", "model": "m", "prompt_tokens": 9, "completion_tokens": 3,
                         "finish_reason": "max_tokens"}
    assert content_of({"choices": [{"delta": {"content": "a"}}]}) == "a"
    assert content_of({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "b"}}) == "b"
    assert content_of({"content": "c", "stop": False}) == "c"
    assert content_of({"choices": [{"delta": {"role": "x"}}]}) == ""


ANSWER_DELAY_S = 0.05  # the full answer's time in the handler: the ledger's duration includes it


async def chat(request):  # what /v1/chat/completions answers, in both forms
    body = await request.json()
    if body.get("stream"):
        def frames():
            yield b'data: {"id":"chatcmpl-s","choices":[{"delta":{"role":"assistant","content":null}}]}\n\n'
            for word in ("a", "b", "c"):
                yield f'data: {{"id":"chatcmpl-s","choices":[{{"delta":{{"content":"{word}"}}}}]}}\n\n'.encode()
            yield ('data: ' + json.dumps({"id": "chatcmpl-s", "choices": [{"delta": {}, "finish_reason": "length"}],
                                          "timings": TIMINGS}) + '\n\ndata: [DONE]\n\n').encode()
        return StreamingResponse(frames(), media_type="text/event-stream")
    await asyncio.sleep(ANSWER_DELAY_S)
    return JSONResponse({"id": "chatcmpl-j", "choices": [{"message": {"content": "abc"}, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 9, "completion_tokens": 3}, "timings": TIMINGS})


class NameGate:
    """Stands in for kinetic.gate.RequestGate: puts the key's Caller in the scope, or answers 401."""

    def __init__(self, app, ring: KeyRing):
        self.app, self.ring = app, ring

    async def __call__(self, scope, receive, send):
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        name = self.ring.name_for(key_from_headers(headers))
        if name is None:
            await JSONResponse({"error": {"message": "Invalid API Key", "type": "authentication_error"}},
                               status_code=401)(scope, receive, send)
            return
        scope.setdefault("state", {})["caller"] = Caller(name, Role.STUDENT)
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


def test_middleware_records_names_numbers_streams_and_401s_without_text(tmp_path: Path) -> None:
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
    assert ((full["client"], full["auth"], full["status"], full["stream"], full["id"])
            == ("alice", "ok", 200, False, "chatcmpl-j"))
    assert full["prompt_tokens"] == 9 and full["completion_tokens"] == 3 and full["timings"] == TIMINGS
    assert full["finish_reason"] == "stop" and full["route"] == "/v1/chat/completions"
    assert ANSWER_DELAY_S <= full["duration_s"] <= took + 0.001  # the request's own time, as the client saw it
    assert stream["stream"] and stream["chunks"] == 3 and stream["id"] == "chatcmpl-s" and stream["timings"] == TIMINGS
    assert stream["finish_reason"] == "length" and 0 <= stream["ttft_s"] <= stream["duration_s"]
    assert (missing["status"], missing["auth"], missing["client"]) == (401, "missing", None)
    assert (wrong["status"], wrong["auth"]) == (401, "wrong")
    text = path.read_text()
    assert "secret prompt" not in text and "sk-a" not in text and '"abc"' not in text


def test_ledger_content_keeps_prompt_and_answer(tmp_path: Path) -> None:
    client, path = ledger_client(tmp_path, content=True)
    body = {"messages": [{"role": "user", "content": "secret prompt"}], "stream": True}
    client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-a"}, json=body)
    (record,) = read_ledger(path)
    assert record["request"] == body and record["answer"] == "abc"


def test_serve_flags_for_the_ledger() -> None:
    from kinetic.serve_args import parse_serve_args

    settings = parse_serve_args(["--ledger", "class.jsonl", "--ledger-content"], environ={})
    assert settings.ledger == "class.jsonl" and settings.ledger_content
    assert parse_serve_args([], environ={"KINETIC_LEDGER": "env.jsonl"}).ledger == "env.jsonl"
    assert not parse_serve_args([], environ={}).ledger_content


def test_a_long_stream_is_read_in_batches_with_each_chunks_own_time() -> None:
    # Frames are read after PARSE_BACKLOG bytes and at the end, not one by one as they leave; the
    # time to the first token is still the time that token's chunk left, not the time it was read.
    from kinetic.classroom.ledger import PARSE_BACKLOG, ResponseReader

    record: dict = {}
    reader = ResponseReader(record, stream=True, keep_text=True, started=time.monotonic() - 1.0)
    role = b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n'
    reader.feed(role)
    piece = b'data: {"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"ab"},"finish_reason":null}]}\n\n'
    sent_first = time.monotonic()
    reader.feed(piece[:40])  # a frame split across two chunks
    reader.feed(piece[40:])
    n = PARSE_BACKLOG // len(piece) + 50
    time.sleep(0.05)
    for _ in range(n):
        reader.feed(piece)
    assert reader._sent_bytes < PARSE_BACKLOG  # the backlog was read once it grew past the limit
    reader.feed(b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"length"}],'
                b'"usage":{"prompt_tokens":3,"completion_tokens":9}}\n\ndata: [DONE]\n\n')
    reader.finish()
    assert record["chunks"] == n + 1 and record["answer"] == "ab" * (n + 1)
    assert record["finish_reason"] == "length" and record["completion_tokens"] == 9 and record["id"] == "c1"
    assert 1.0 <= record["ttft_s"] <= 1.0 + (sent_first - reader.started - 1.0) + 0.04
