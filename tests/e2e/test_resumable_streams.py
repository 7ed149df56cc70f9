"""llama-server's resumable streams on a real `kinetic serve`: a stream sent with X-Conversation-Id outlives
its connection, GET /v1/stream replays it from any byte and then follows it live, DELETE /v1/stream stops it,
POST /v1/streams/lookup finds it; on a keyed server the ids are the key's own, and the ledger records the
answer once. One keyed server (two students and an admin, with a ledger) for the whole module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server import KineticServer, wait_until

pytestmark = pytest.mark.e2e

ALICE, BOB, ADMIN = "sk-alice-31f0", "sk-bob-88c2", "sk-admin-5e19"
ALIAS = "kinetic-resume"
DONE = b"data: [DONE]\n\n"


class Server:
    def __init__(self, server: KineticServer, ledger: Path):
        self.server, self.ledger, self.url = server, ledger, server.url

    def ledger_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.ledger.read_text().splitlines() if line.strip()]

    def slots_busy(self) -> bool:
        states = httpx.get(self.url + "/slots", headers=auth(ADMIN), timeout=10).json()
        return any(slot["is_processing"] for slot in states)


@pytest.fixture(scope="module")
def server(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("resume")
    keys = folder / "keys.txt"
    keys.write_text(f"{ALICE} alice\n{BOB} bob\n")
    ledger = folder / "ledger.jsonl"
    with KineticServer("-c", "4096", "-np", "2", "-a", ALIAS, "--api-key-file", str(keys), "--admin-key", ADMIN,
                       "--ledger", str(ledger)) as server:
        yield Server(server, ledger)


def auth(key: str, conversation: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"}
    if conversation is not None:
        headers["X-Conversation-Id"] = conversation
    return headers


def chat(max_tokens: int) -> dict[str, Any]:
    return {"model": ALIAS, "stream": True, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Count from one to one thousand."}]}


def events(body: bytes) -> list[bytes]:
    """The SSE events of a body, each with its blank line, so that they join back into the body."""
    return [event + b"\n\n" for event in body.split(b"\n\n") if event]


def start_then_drop(url: str, path: str, body: dict[str, Any], headers: dict[str, str], n_events: int) -> bytes:
    """Sends a streamed request, reads its first `n_events` events, and closes the connection."""
    received = b""
    with httpx.Client(timeout=120) as client, client.stream("POST", url + path, json=body, headers=headers) as res:
        assert res.status_code == 200, res.read()
        for chunk in res.iter_raw():
            received += chunk
            if received.count(b"\n\n") >= n_events:
                break
    return received


def replay(url: str, key: str, conversation: str, offset: int | None = None) -> httpx.Response:
    query = f"conv_id={conversation}" + ("" if offset is None else f"&from={offset}")
    return httpx.get(f"{url}/v1/stream?{query}", headers=auth(key), timeout=120)


def lookup(url: str, key: str, ids: list[str]) -> httpx.Response:
    return httpx.post(url + "/v1/streams/lookup", json={"conversation_ids": ids}, headers=auth(key), timeout=10)


def generated(body: bytes) -> int:
    """The tokens the stream's last chunk says were generated (its llama-server `timings`)."""
    chunks = [json.loads(event[len(b"data: "):]) for event in events(body) if event != DONE]
    return int(next(chunk["timings"]["predicted_n"] for chunk in reversed(chunks) if chunk.get("timings")))


def test_a_dropped_stream_runs_to_its_end_and_replays_from_any_event(server: Server) -> None:
    received = start_then_drop(server.url, "/v1/chat/completions", chat(48), auth(ALICE, "conv-drop"), 2)
    wait_until(lambda: not server.slots_busy(), "the generation ends")
    whole = replay(server.url, ALICE, "conv-drop", 0)
    assert whole.status_code == 200 and whole.headers["content-type"].startswith("text/event-stream")
    body = whole.content
    assert body.startswith(received)  # the bytes the first client got are the stream's first bytes
    assert body.endswith(DONE)
    assert generated(body) == 48  # leaving did not cancel the generation
    sequence = events(body)
    for n in (1, 3, len(sequence) - 1):
        offset = len(b"".join(sequence[:n]))
        from_n = replay(server.url, ALICE, "conv-drop", offset)
        assert from_n.status_code == 200
        assert events(from_n.content) == sequence[n:]
    assert replay(server.url, ALICE, "conv-drop").content == body  # `from` defaults to 0


def test_a_client_that_stays_gets_what_the_replay_gets(server: Server) -> None:
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=chat(16),
                      headers=auth(ALICE, "conv-stay"), timeout=120) as res:
        live = res.read()
    assert live.endswith(DONE)
    assert replay(server.url, ALICE, "conv-stay", 0).content == live


def test_a_replay_follows_the_live_stream_to_its_end(server: Server) -> None:
    start_then_drop(server.url, "/v1/chat/completions", chat(120), auth(ALICE, "conv-live"), 1)
    [state] = lookup(server.url, ALICE, ["conv-live"]).json()
    assert state["conversation_id"] == "conv-live" and state["is_done"] is False and state["completed_at"] == 0
    body = replay(server.url, ALICE, "conv-live", 0).content  # read while it is still generated
    assert body.endswith(DONE)
    assert generated(body) == 120
    [state] = lookup(server.url, ALICE, ["conv-live", "conv-unknown"]).json()
    assert state["is_done"] is True and state["total_bytes"] == len(body)
    assert state["completed_at"] >= state["started_at"] > 0


def test_delete_stops_a_running_stream(server: Server) -> None:
    before = len(server.ledger_lines())
    start_then_drop(server.url, "/v1/chat/completions", chat(3000), auth(ALICE, "conv-stop"), 2)
    assert server.slots_busy()
    res = httpx.delete(server.url + "/v1/stream?conv_id=conv-stop", headers=auth(ALICE), timeout=10)
    assert res.status_code == 204
    wait_until(lambda: not server.slots_busy(), "the stopped generation frees its slot", timeout=10)
    assert replay(server.url, ALICE, "conv-stop", 0).status_code == 404
    wait_until(lambda: any(line["route"] == "/v1/chat/completions" for line in server.ledger_lines()[before:]),
               "the stopped answer's ledger line", timeout=10)
    [line] = [line for line in server.ledger_lines()[before:] if line["route"] == "/v1/chat/completions"]
    # stopped before its end: what went out was streamed text, never the final usage
    assert line["client"] == "alice" and 0 < line["chunks"] < 3000 and "completion_tokens" not in line


def test_a_conversation_belongs_to_the_key_that_started_it(server: Server) -> None:
    before = len(server.ledger_lines())
    start_then_drop(server.url, "/v1/chat/completions", chat(80), auth(ALICE, "conv-mine"), 1)
    assert replay(server.url, BOB, "conv-mine", 0).status_code == 404
    assert lookup(server.url, BOB, ["conv-mine"]).status_code == 404
    refused = httpx.delete(server.url + "/v1/stream?conv_id=conv-mine", headers=auth(BOB), timeout=10)
    assert refused.status_code == 404
    assert refused.json()["error"]["type"] == "not_found_error"
    # bob's stop stopped nothing: alice's answer runs to its end, and she reads it twice
    first = replay(server.url, ALICE, "conv-mine", 0).content
    assert generated(first) == 80
    assert replay(server.url, ALICE, "conv-mine", 0).content == first
    assert [s["conversation_id"] for s in lookup(server.url, ALICE, ["conv-mine"]).json()] == ["conv-mine"]
    # bob's stream on the same id is his own and leaves alice's alone
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=chat(4),
                      headers=auth(BOB, "conv-mine"), timeout=120) as res:
        bobs = res.read()
    assert replay(server.url, BOB, "conv-mine", 0).content == bobs != first
    assert replay(server.url, ALICE, "conv-mine", 0).content == first

    def answers() -> list[tuple[str, int]]:
        lines = server.ledger_lines()[before:]
        return sorted((line["client"], line.get("completion_tokens", 0)) for line in lines
                      if line["route"] == "/v1/chat/completions")

    wait_until(lambda: len(answers()) >= 2, "both answers' ledger lines", timeout=10)
    assert answers() == [("alice", 80), ("bob", 4)]  # each answer once, however often it was replayed
    lines = server.ledger_lines()[before:]
    replays = [line for line in lines if line["route"] == "/v1/stream" and line["method"] == "GET"]
    assert {line["client"] for line in replays} == {"alice", "bob"}
    # a replay is not a second answer
    assert all("completion_tokens" not in line and "chunks" not in line for line in replays)
    assert len([line for line in lines if line["client"] == "bob" and line["status"] == 404]) == 3


@pytest.mark.parametrize(("path", "body", "last_event"), [
    ("/completion", {"prompt": "Once upon a time", "n_predict": 8, "stream": True}, b'"stop":true'),
    ("/v1/completions", {"model": ALIAS, "prompt": "Once upon a time", "max_tokens": 8, "stream": True}, DONE),
    ("/v1/messages", {"model": ALIAS, "max_tokens": 8, "stream": True,
                      "messages": [{"role": "user", "content": "hi"}]}, b"event: message_stop"),
    ("/v1/responses", {"model": ALIAS, "max_output_tokens": 8, "stream": True, "input": "hi"},
     b"event: response.completed"),
], ids=["completion", "v1-completions", "anthropic-messages", "responses"])
def test_every_streamed_route_of_llama_server_is_kept(server: Server, path: str, body: dict[str, Any],
                                                      last_event: bytes) -> None:
    conversation = "conv-route" + path.replace("/", "-")
    with httpx.stream("POST", server.url + path, json=body, headers=auth(ALICE, conversation), timeout=120) as res:
        assert res.status_code == 200
        live = res.read()
    kept = replay(server.url, ALICE, conversation, 0).content
    assert kept == live
    assert last_event in events(kept)[-1]


def test_ollama_streams_are_not_kept(server: Server) -> None:
    body = {"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 4}}
    res = httpx.post(server.url + "/api/chat", json=body, headers=auth(ALICE, "conv-ollama"), timeout=120)
    assert res.status_code == 200
    assert replay(server.url, ALICE, "conv-ollama", 0).status_code == 404


def test_bad_stream_requests_are_400s_naming_the_field(server: Server) -> None:
    missing = httpx.get(server.url + "/v1/stream", headers=auth(ALICE), timeout=10)
    assert missing.status_code == 400 and "conv_id" in missing.json()["error"]["message"]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=chat(2),
                      headers=auth(ALICE, "conv-bad"), timeout=120) as res:
        res.read()
    for offset in ("abc", "-1"):
        bad = httpx.get(f"{server.url}/v1/stream?conv_id=conv-bad&from={offset}", headers=auth(ALICE), timeout=10)
        assert bad.status_code == 400 and "from" in bad.json()["error"]["message"]
    garbled = httpx.post(server.url + "/v1/streams/lookup", content=b"{not json", headers=auth(ALICE), timeout=10)
    assert garbled.status_code == 400
    assert httpx.delete(server.url + "/v1/stream", headers=auth(ALICE), timeout=10).status_code == 400
    # past the end: nothing more comes, and the stream ends
    past = httpx.get(f"{server.url}/v1/stream?conv_id=conv-bad&from=999999999", headers=auth(ALICE), timeout=10)
    assert past.status_code == 200 and past.content == b""
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
