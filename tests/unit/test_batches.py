"""OpenAI's files and batches with the openai SDK, on the real app over a scripted engine (every answer the same
few bytes): per student, with an output and an error file, the ledger's lines, validation, cancelling, and a
batch a restart left half done. The real model's run (and a restart of `kinetic serve`) is
tests/e2e/test_client_openai_batches.py."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kinetic.classroom.caller import NOBODY
from kinetic.classroom.ledger import read_ledger
from kinetic.protocols.batches.store import BatchStore
from kinetic.protocols.common.store_database import StoreDatabase
from tests.scripted import ScriptedEngine, ScriptedServer

KEYS = {"alice": "sk-alice-b1", "bob": "sk-bob-b2"}
ADMIN = "sk-teacher-b3"


def engine() -> ScriptedEngine:
    loaded = threading.Event()
    loaded.set()
    return ScriptedEngine(["ok"], loaded=loaded)


def client(url: str, key: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def chat_line(custom_id: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": custom_id}], **body}}


def upload(openai_client: Any, lines: list[dict[str, Any]]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return str(openai_client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch").id)


def until_ended(openai_client: Any, batch_id: str) -> Any:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        batch = openai_client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} never ended: {batch.status}")


def jsonl(openai_client: Any, file_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in openai_client.files.content(file_id).text.splitlines()]


@pytest.fixture()
def classroom(tmp_path: Path) -> Any:
    keys = tmp_path / "keys.txt"
    keys.write_text("".join(f"{key} {name}\n" for name, key in KEYS.items()), encoding="utf-8")
    with ScriptedServer(engine(), api_key_file=str(keys), admin_key=ADMIN, ledger=str(tmp_path / "ledger.jsonl"),
                        alias="m") as server:
        yield server, tmp_path / "ledger.jsonl"


def test_a_students_batch_runs_to_its_output_and_error_files(classroom: Any) -> None:
    server, ledger = classroom
    alice = client(server.url, KEYS["alice"])
    lines = [chat_line("q1"), chat_line("q2", messages=[]), chat_line("q3")]  # q2: no messages, a 400
    batch = alice.batches.create(input_file_id=upload(alice, lines), endpoint="/v1/chat/completions",
                                 completion_window="24h", metadata={"lab": "04-03"})
    assert batch.status == "validating" and batch.metadata == {"lab": "04-03"}
    ended = until_ended(alice, batch.id)
    assert ended.status == "completed" and ended.completed_at and ended.in_progress_at and ended.finalizing_at
    assert (ended.request_counts.total, ended.request_counts.completed, ended.request_counts.failed) == (3, 2, 1)
    output = jsonl(alice, ended.output_file_id)
    assert [line["custom_id"] for line in output] == ["q1", "q3"]
    for line in output:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["response"]["body"]["object"] == "chat.completion"
        assert line["response"]["body"]["usage"]["completion_tokens"] > 0
    (failed,) = jsonl(alice, ended.error_file_id)
    assert failed["custom_id"] == "q2" and failed["response"]["status_code"] == 400
    assert "messages" in failed["response"]["body"]["error"]["message"]
    assert alice.files.retrieve(ended.output_file_id).purpose == "batch_output"

    # the ledger: each line under alice, with its batch and custom_id, the counts its body told
    records = [r for r in read_ledger(ledger) if r.batch is not None]
    assert sorted(r.batch.custom_id for r in records) == ["q1", "q2", "q3"]
    assert {r.client for r in records} == {"alice"} and {r.batch.id for r in records} == {batch.id}
    answered = {r.batch.custom_id: r for r in records}
    assert answered["q1"].status == 200 and answered["q1"].completion_tokens == \
        output[0]["response"]["body"]["usage"]["completion_tokens"]
    assert answered["q2"].status == 400


def test_a_batch_and_its_files_are_their_owners(classroom: Any) -> None:
    server, _ = classroom
    alice, bob, admin = client(server.url, KEYS["alice"]), client(server.url, KEYS["bob"]), client(server.url, ADMIN)
    file_id = upload(alice, [chat_line("only")])
    batch = alice.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    until_ended(alice, batch.id)
    from openai import NotFoundError

    for call in (lambda: bob.batches.retrieve(batch.id), lambda: bob.files.retrieve(file_id),
                 lambda: bob.files.content(file_id), lambda: bob.batches.cancel(batch.id),
                 lambda: bob.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                            completion_window="24h")):
        with pytest.raises(NotFoundError):
            call()
    assert bob.batches.list().data == [] and bob.files.list().data == []
    assert [b.id for b in admin.batches.list().data] == [batch.id]
    assert file_id in {f.id for f in admin.files.list().data}
    assert [b.id for b in alice.batches.list().data] == [batch.id]
    alice.files.delete(file_id)
    with pytest.raises(NotFoundError):
        alice.files.retrieve(file_id)


def test_an_input_that_cannot_run_fails_the_batch_naming_its_lines(classroom: Any) -> None:
    server, _ = classroom
    alice = client(server.url, KEYS["alice"])
    wrong = {**chat_line("b"), "url": "/v1/embeddings"}
    file_id = upload(alice, [chat_line("a"), chat_line("a"), wrong])
    ended = until_ended(alice, alice.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                                    completion_window="24h").id)
    assert ended.status == "failed" and ended.failed_at
    assert [(e.code, e.line) for e in ended.errors.data] == [("duplicate_custom_id", 2), ("mismatched_endpoint", 3)]


def test_bad_requests_name_their_field(classroom: Any) -> None:
    server, _ = classroom
    alice = client(server.url, KEYS["alice"])
    from openai import BadRequestError, NotFoundError

    file_id = upload(alice, [chat_line("a")])
    with pytest.raises(BadRequestError, match="endpoint"):
        alice.batches.create(input_file_id=file_id, endpoint="/v1/moderations", completion_window="24h")
    with pytest.raises(BadRequestError, match="completion_window"):
        alice.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="1h")
    with pytest.raises(NotFoundError):
        alice.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(BadRequestError, match="purpose"):
        alice.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")


def test_cancelling_ends_a_batch_with_what_it_did(tmp_path: Path) -> None:
    slow = engine()
    with ScriptedServer(slow, alias="m") as server:
        openai_client = client(server.url, "no-key")
        file_id = upload(openai_client, [chat_line(f"q{i}") for i in range(200)])
        batch = openai_client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                             completion_window="24h")
        while openai_client.batches.retrieve(batch.id).request_counts.completed < 1:
            time.sleep(0.01)
        cancelling = openai_client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled")
        ended = until_ended(openai_client, batch.id)
        output = jsonl(openai_client, ended.output_file_id)
    assert ended.status == "cancelled" and ended.cancelled_at
    assert 1 <= ended.request_counts.completed < 200
    assert len(output) == ended.request_counts.completed
    assert len(slow.requests) == ended.request_counts.completed  # no line ran after the cancel


def test_a_restart_goes_on_where_the_batch_was(tmp_path: Path) -> None:
    """A batch left in_progress with one line done: the next start runs the two left, and not the first again."""
    database = StoreDatabase(tmp_path)
    store = BatchStore(database)
    data = "".join(json.dumps(chat_line(f"q{i}")) + "\n" for i in range(3)).encode()
    file_id = store.add_file(None, "batch", "in.jsonl", data)["id"]
    body = store.create(NOBODY, input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                        metadata=None)
    store.update(body["id"], status="in_progress", request_counts={"total": 3, "completed": 0, "failed": 0})
    earlier = {"id": "batch_req_before", "custom_id": "q0", "error": None,
               "response": {"status_code": 200, "request_id": "req_before", "body": {"kept": True}}}
    store.add_result(body["id"], 1, True, earlier)
    database.close()

    scripted = engine()
    with ScriptedServer(scripted, alias="m", store_dir=str(tmp_path)) as server:
        openai_client = client(server.url, "no-key")
        ended = until_ended(openai_client, body["id"])
        output = jsonl(openai_client, ended.output_file_id)
    assert ended.status == "completed" and ended.request_counts.completed == 3
    assert [line["custom_id"] for line in output] == ["q0", "q1", "q2"]
    assert output[0] == earlier
    assert len(scripted.requests) == 2
