"""A lab's server stopped the hard way and the polite way, then started again on the same files (issue 46).

- kill -9 under load: four keyed students with forty requests in flight on four protocols (some streamed), a chat
  page saving a chat twice a second, killed after about fifteen answers. After a start on the same files every
  ledger line parses, every answer that reached its client whole has its line, the budgeted student's usage
  covers her answers, and the saved chat and an /api/create model read back whole.
- SIGTERM for an upgrade: the running stream gets its drain, the requests still waiting for a slot are refused at
  once (a 503 with Retry-After in their protocol's body; a waiting stream, whose headers went out as it queued,
  ends in its protocol's error saying when to retry), nothing is recorded twice, and the next start serves at once.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from kinetic.backends.bundled import gemma_model_path
from kinetic.classroom.ledger import LedgerRecord, read_ledger
from tests.server import KineticServer, wait_until

pytestmark = pytest.mark.e2e

MODEL = "gemma"
ADMIN = "sk-teacher-restart"
STUDENTS = {"sk-ann-r": "ann", "sk-ben-r": "ben", "sk-cai-r": "cai", "sk-dia-r": "dia"}
BUDGETED = "sk-ann-r"  # tokens=200000/day: her usage is read back from the ledger at the start
PROMPT = "Write a short poem about the sea."


@dataclass
class Answer:
    """One request as its client saw it: whether it came back whole, its id and the tokens it was billed."""

    key: str
    protocol: str
    status: int = 0
    whole: bool = False
    id: str | None = None
    tokens: int = 0
    retry_after: str | None = None
    lines: list[str] = field(default_factory=list)


def _openai(stream: bool, tokens: int = 24) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                            "max_tokens": tokens, "ignore_eos": tokens > 24, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return "/v1/chat/completions", body


def _anthropic() -> tuple[str, dict[str, Any]]:
    return "/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24}


def _responses() -> tuple[str, dict[str, Any]]:
    return "/v1/responses", {"model": MODEL, "input": PROMPT, "max_output_tokens": 24}


def _ollama_stream() -> tuple[str, dict[str, Any]]:
    return "/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
                         "options": {"num_predict": 24}}


REQUESTS: dict[str, Callable[[], tuple[str, dict[str, Any]]]] = {
    "openai": lambda: _openai(False), "openai-stream": lambda: _openai(True), "anthropic": _anthropic,
    # long enough (~2.5 s on Gemma here) that four more clients are queued behind it before it ends
    "openai-long-stream": lambda: _openai(True, 160),
    "responses": _responses, "ollama-stream": _ollama_stream,
}


def send(url: str, answer: Answer) -> None:
    """The request of `answer.protocol`; `answer` says what came back, and whether whole."""
    path, body = REQUESTS[answer.protocol]()
    headers = {"Authorization": f"Bearer {answer.key}"}
    try:
        with httpx.stream("POST", url + path, json=body, headers=headers, timeout=300) as response:
            answer.status = response.status_code
            answer.retry_after = response.headers.get("retry-after")
            answer.lines = [line for line in response.iter_lines() if line.strip()]
    except httpx.HTTPError:
        return  # cut by the kill: not whole
    if answer.status != 200:
        return
    if answer.protocol.startswith("openai") and answer.protocol.endswith("-stream"):
        if answer.lines[-1] != "data: [DONE]":
            return
        chunks = [json.loads(line[len("data: "):]) for line in answer.lines[:-1]]
        answer.id, answer.tokens = chunks[0]["id"], chunks[-1]["usage"]["total_tokens"]
    elif answer.protocol == "ollama-stream":
        last = json.loads(answer.lines[-1])
        if not last.get("done"):
            return
        answer.tokens = last["prompt_eval_count"] + last["eval_count"]
    else:
        data = json.loads("".join(answer.lines))
        answer.id = data["id"]
        usage = data["usage"]
        answer.tokens = usage.get("total_tokens") or usage["input_tokens"] + usage["output_tokens"]
    answer.whole = True


def keyed_files(root: Path) -> dict[str, Path]:
    models = root / "models"
    models.mkdir()
    (models / f"{MODEL}.gguf").symlink_to(gemma_model_path())
    keys = root / "keys.txt"
    keys.write_text("".join(f"{key} {name}" + (" tokens=200000/day" if key == BUDGETED else "") + "\n"
                            for key, name in STUDENTS.items()), encoding="utf-8")
    return {"models": models, "keys": keys, "ledger": root / "ledger.jsonl", "chats": root / "chats"}


def serve(files: dict[str, Path], *more: str) -> KineticServer:
    return KineticServer("--models-dir", str(files["models"]), "-c", "2048", "-np", "4",
                         "--api-key-file", str(files["keys"]), "--admin-key", ADMIN, "--ledger", str(files["ledger"]),
                         "--chat-history", str(files["chats"]), *more).start()


class ChatSaver:
    """The chat page re-saving one chat twice a second, a turn longer each time, until stopped."""

    def __init__(self, url: str):
        self.url = url
        self.acknowledged: list[dict[str, Any]] = []  # the last save the server answered 200
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @staticmethod
    def messages(turns: int) -> list[dict[str, Any]]:
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "x" * 400}
                for i in range(turns)]

    def _run(self) -> None:
        turns = 1
        while not self.stop.is_set():
            messages = self.messages(turns)
            try:
                response = httpx.put(f"{self.url}/chats/kept", json={"title": "kept", "messages": messages},
                                     headers={"Authorization": f"Bearer {BUDGETED}"}, timeout=10)
            except httpx.HTTPError:
                return  # the server is gone
            if response.status_code == 200:
                self.acknowledged = messages
            turns += 1
            self.stop.wait(0.5)


def test_kill_9_under_load_loses_no_answered_request(model_lock: None, tmp_path: Path) -> None:
    files = keyed_files(tmp_path)
    server = serve(files)
    answers: list[Answer] = []
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        created = httpx.post(server.url + "/api/create", headers=admin, timeout=60,
                             json={"model": "poet", "from": MODEL, "system": "You write poems.", "stream": False})
        assert created.status_code == 200, created.text
        saver = ChatSaver(server.url)
        protocols = list(REQUESTS)
        keys = list(STUDENTS)
        answers = [Answer(keys[i % len(keys)], protocols[i % len(protocols)]) for i in range(40)]
        threads = [threading.Thread(target=send, args=(server.url, a), daemon=True) for a in answers]
        for thread in threads:
            thread.start()
        wait_until(lambda: sum(a.whole for a in answers) >= 15, "15 answers", 240)
        assert server.proc is not None
        server.proc.kill()  # SIGKILL: no drain, no handler, nothing flushed by the server after this
        server.proc.wait(timeout=10)
        saver.stop.set()
        for thread in threads:
            thread.join(30)
        saver.thread.join(10)
    finally:
        server.stop()
    whole = [a for a in answers if a.whole]
    print(f"kill -9 after {len(whole)} whole answers of 40; the chat had {len(saver.acknowledged)} turns saved")
    assert len(whole) >= 15

    raw = files["ledger"].read_text(encoding="utf-8")
    records = [LedgerRecord.from_line(line) for line in raw.splitlines()]
    assert all(r is not None for r in records), "a ledger line that does not parse"
    assert raw.endswith("\n")
    ids = {r.id for r in records if r is not None and r.status == 200}
    assert all(a.id in ids for a in whole if a.id is not None), "an answered request without its ledger line"
    ollama_whole = sum(a.protocol == "ollama-stream" for a in whole)
    assert sum(r is not None and r.route == "/api/chat" and r.status == 200 and r.error is None
               for r in records) >= ollama_whole

    restarted = serve(files)
    try:
        student = {"Authorization": f"Bearer {BUDGETED}"}
        used = httpx.get(restarted.url + "/v1/me", headers=student, timeout=30).json()["budget"]["used"]
        assert used >= sum(a.tokens for a in whole if a.key == BUDGETED)
        chat = httpx.get(restarted.url + "/chats/kept", headers=student, timeout=30).json()
        saved = chat["messages"]
        assert saved == ChatSaver.messages(len(saved)) and len(saved) >= len(saver.acknowledged)
        tags = httpx.get(restarted.url + "/api/tags", headers=student, timeout=30).json()
        assert "poet" in [m["name"].removesuffix(":latest") for m in tags["models"]]
        rendered = httpx.post(restarted.url + "/apply-template", headers=student, timeout=30,
                              json={"model": "poet", "messages": [{"role": "user", "content": "hi"}]}).json()
        assert "You write poems." in rendered["prompt"]  # the derived model's system prompt, read back
    finally:
        restarted.stop()


def test_sigterm_refuses_the_waiting_at_once_and_the_next_start_serves(model_lock: None, tmp_path: Path) -> None:
    files = keyed_files(tmp_path)
    server = serve(files, "-np", "1", "--drain-timeout", "10", "--metrics")
    student = {"Authorization": f"Bearer {BUDGETED}"}
    running = Answer(BUDGETED, "openai-long-stream")
    waiting = [Answer(key, protocol) for key, protocol in zip(STUDENTS, ("openai", "anthropic", "responses",
                                                                           "ollama-stream"), strict=True)]
    try:
        first = threading.Thread(target=send, args=(server.url, running), daemon=True)
        first.start()
        wait_until(lambda: _metric(server.url, "llamacpp:requests_processing") == 1, "the stream running", 60)
        threads = [threading.Thread(target=send, args=(server.url, a), daemon=True) for a in waiting]
        for thread in threads:
            thread.start()
        wait_until(lambda: _metric(server.url, "llamacpp:requests_deferred") == 4, "four waiting", 60)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        for thread in threads:
            thread.join(5)
        refused_after = time.monotonic() - signalled
        first.join(30)
        assert server.proc.wait(timeout=20) == 0
    finally:
        server.stop()
    print(f"SIGTERM: the four waiting requests were refused within {refused_after:.2f} s")
    assert refused_after < 1.0 and running.whole
    for answer in waiting:
        assert "the server is shutting down; retry in 15 s" in "".join(answer.lines), (answer.protocol, answer.lines)
        if answer.protocol.endswith("-stream"):  # its headers went out as it queued: the protocol's stream error
            assert answer.status == 200 and "error" in json.loads(answer.lines[-1])
        else:
            assert answer.status == 503 and answer.retry_after == "15"  # the drain's 10 s and a restart's 5
    posts = [r for r in read_ledger(files["ledger"]) if r.method == "POST"]  # not the polls of /metrics
    assert len(posts) == 5  # each request once
    assert sum(r.status == 200 and r.error is None for r in posts) == 1
    assert all(r.error is not None and "shutting down" in r.error.message for r in posts if r.error is not None)

    started = time.monotonic()
    restarted = serve(files, "-np", "1")
    try:
        response = httpx.post(restarted.url + "/v1/chat/completions", headers=student, timeout=60,
                              json=_openai(False)[1])
        assert response.status_code == 200
    finally:
        restarted.stop()
    print(f"the next start answered its first request {time.monotonic() - started:.2f} s after it was started")
    assert sum(r.method == "POST" for r in read_ledger(files["ledger"])) == 6


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", params={"model": MODEL}, headers={"Authorization": f"Bearer {ADMIN}"},
                     timeout=10).text
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " "))
