"""OpenAI batches on a real `kinetic serve` with the openai SDK: two students and the instructor on a keyed server
with a ledger, batches of chat completions, embeddings and Responses, and a batch that a restart (SIGTERM, then a
start on the same files) leaves half done and that ends whole, each line answered once."""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kinetic.classroom.ledger import read_ledger
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

KEYS = {"alice": "sk-alice-47b", "bob": "sk-bob-47b"}
ADMIN = "sk-teacher-47b"
CITY_FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]}}}


class Class:
    def __init__(self, folder: Path):
        self.folder = folder
        (folder / "keys.txt").write_text("".join(f"{key} {name}\n" for name, key in KEYS.items()), encoding="utf-8")
        self.ledger = folder / "ledger.jsonl"

    def server(self) -> KineticServer:
        return KineticServer("-c", "2048", "-np", "2", "-a", "local", "--embeddings", "--api-key-file",
                             str(self.folder / "keys.txt"), "--admin-key", ADMIN, "--ledger", str(self.ledger))


@pytest.fixture(scope="module")
def classroom(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Class, KineticServer]]:
    held = Class(tmp_path_factory.mktemp("batches"))
    with held.server() as server:
        yield held, server


def client(server: KineticServer, key: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def run_batch(openai_client: Any, endpoint: str, bodies: dict[str, dict[str, Any]]) -> str:
    data = "".join(json.dumps({"custom_id": custom_id, "method": "POST", "url": endpoint, "body": body}) + "\n"
                   for custom_id, body in bodies.items()).encode()
    file_id = openai_client.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch").id
    return str(openai_client.batches.create(input_file_id=file_id, endpoint=endpoint, completion_window="24h").id)


def until(openai_client: Any, batch_id: str, done: Any, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = openai_client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id}: {batch.status}, {batch.request_counts}")


def ended(batch: Any) -> bool:
    return batch.status in ("completed", "failed", "cancelled", "expired")


def lines_of(openai_client: Any, file_id: str | None) -> list[dict[str, Any]]:
    return [] if file_id is None else [json.loads(line) for line in
                                       openai_client.files.content(file_id).text.splitlines()]


def chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "local", "max_tokens": 8, "messages": [{"role": "user", "content": content}], **extra}


def test_a_students_batches_answer_on_every_endpoint(classroom: tuple[Class, KineticServer]) -> None:
    held, server = classroom
    alice, bob = client(server, KEYS["alice"]), client(server, KEYS["bob"])
    chats = run_batch(alice, "/v1/chat/completions", {
        "hello": chat("hello"), "schema": chat("a city", max_tokens=48, response_format=CITY_FORMAT),
        "no-messages": {"model": "local", "max_tokens": 8}})  # a 400 in the error file
    embeddings = run_batch(bob, "/v1/embeddings", {"e1": {"model": "local", "input": "hello"},
                                                   "e2": {"model": "local", "input": ["a", "b"]}})
    responses = run_batch(bob, "/v1/responses", {"r1": {"model": "local", "input": "hello", "max_output_tokens": 8}})

    done = until(alice, chats, ended)
    assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    output = {line["custom_id"]: line["response"] for line in lines_of(alice, done.output_file_id)}
    assert set(output) == {"hello", "schema"}
    assert json.loads(output["schema"]["body"]["choices"][0]["message"]["content"])["name"] is not None
    (error,) = lines_of(alice, done.error_file_id)
    assert error["custom_id"] == "no-messages" and error["response"]["status_code"] == 400
    assert "messages" in error["response"]["body"]["error"]["message"]

    embedded = until(bob, embeddings, ended)
    vectors = {line["custom_id"]: line["response"]["body"]["data"] for line in lines_of(bob, embedded.output_file_id)}
    assert len(vectors["e1"]) == 1 and len(vectors["e2"]) == 2 and len(vectors["e2"][1]["embedding"]) > 0
    answered = until(bob, responses, ended)
    (response,) = lines_of(bob, answered.output_file_id)
    assert response["response"]["body"]["object"] == "response" and response["response"]["body"]["status"] == \
        "completed"

    # each student sees their own; the instructor sees both
    assert [b.id for b in alice.batches.list().data] == [chats]
    assert {b.id for b in bob.batches.list().data} == {embeddings, responses}
    assert {chats, embeddings, responses} <= {b.id for b in client(server, ADMIN).batches.list().data}
    from openai import NotFoundError

    with pytest.raises(NotFoundError):
        bob.files.content(done.output_file_id)

    # the ledger: a line per request, under its student, with the batch and the counts its answer told
    records = [r for r in read_ledger(held.ledger) if r.batch is not None]
    by_id = {(r.batch.id, r.batch.custom_id): r for r in records}
    assert by_id[(chats, "hello")].client == "alice" and by_id[(embeddings, "e2")].client == "bob"
    usage = output["hello"]["body"]["usage"]
    assert by_id[(chats, "hello")].completion_tokens == usage["completion_tokens"]
    assert by_id[(chats, "no-messages")].status == 400


def test_a_restart_finishes_the_batch_with_each_line_answered_once(classroom: tuple[Class, KineticServer],
                                                                     model_lock: None) -> None:
    held, server = classroom
    alice = client(server, KEYS["alice"])
    bodies = {f"q{i:02d}": chat(f"question {i}") for i in range(12)}  # a stop after 3 leaves 9 to run
    batch_id = run_batch(alice, "/v1/chat/completions", bodies)
    until(alice, batch_id, lambda b: b.request_counts.completed >= 3)
    server.stop()  # SIGTERM mid-batch
    halfway = {r.batch.custom_id for r in read_ledger(held.ledger) if r.batch and r.batch.id == batch_id}
    assert 3 <= len(halfway) < len(bodies)
    with held.server() as restarted:
        alice = client(restarted, KEYS["alice"])
        done = until(alice, batch_id, ended)
        output = lines_of(alice, done.output_file_id)
    assert done.status == "completed" and done.request_counts.completed == len(bodies)
    assert [line["custom_id"] for line in output] == sorted(bodies)
    ran = Counter(r.batch.custom_id for r in read_ledger(held.ledger) if r.batch and r.batch.id == batch_id)
    assert set(ran) == set(bodies)
    assert sum(count - 1 for count in ran.values()) <= 1  # only the line running at the stop ran again
    server.start()  # the module's server, for any test after this one
