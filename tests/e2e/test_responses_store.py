"""Stored responses through the openai SDK (issue 47 part 1), on a keyed server with two students: a second turn
with `previous_response_id` continues the first (its prompt read from the KV cache), `retrieve`, `delete` and
`input_items.list` read the store, a streamed response is stored like a whole one, `store: false` keeps nothing,
and another student's key gets a 404 for all of it while the admin's reads it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server import KineticServer, wait_until

pytestmark = pytest.mark.e2e

ANN, BEN, ADMIN = "sk-ann-store", "sk-ben-store", "sk-teacher-store"


@pytest.fixture(scope="module")
def server(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KineticServer]:
    keys: Path = tmp_path_factory.mktemp("store-keys") / "keys.txt"
    keys.write_text(f"{ANN} ann\n{BEN} ben\n", encoding="utf-8")
    with KineticServer("-c", "2048", "-np", "2", "--api-key-file", str(keys), "--admin-key", ADMIN,
                       "--drain-timeout", "0") as running:
        yield running


def client(server: KineticServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=120)


def test_a_second_turn_continues_the_stored_first_from_the_cache(server: KineticServer) -> None:
    ann = client(server, ANN)
    first = ann.responses.create(model="m", instructions="Answer briefly.", input="Name a colour.",
                                 max_output_tokens=8)
    assert first.store is True and first.previous_response_id is None
    second = ann.responses.create(model="m", instructions="Answer briefly.", previous_response_id=first.id,
                                  input="And another one.", max_output_tokens=8)
    assert second.previous_response_id == first.id and second.status == "completed"
    # the second prompt holds the first turn whole (its input and its answer): more tokens, and its head cached
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    timings = (second.model_extra or {})["timings"]
    assert timings["cache_n"] >= first.usage.input_tokens

    retrieved = ann.responses.retrieve(first.id)
    assert retrieved.id == first.id and retrieved.output_text == first.output_text
    items = ann.responses.input_items.list(second.id)
    [item] = items.data
    assert item.type == "message" and item.role == "user" and item.id.startswith("msg_")
    assert items.first_id == items.last_id == item.id and items.has_more is False


def test_a_streamed_response_is_stored_and_input_items_page(server: KineticServer) -> None:
    ann = client(server, ANN)
    inputs = [{"role": "user", "content": f"Word {i}."} for i in range(3)]
    with ann.responses.stream(model="m", input=inputs, max_output_tokens=4) as stream:  # type: ignore[arg-type]
        final = stream.get_final_response()
    stored = ann.responses.retrieve(final.id)
    assert stored.id == final.id and stored.output_text == final.output_text and stored.usage is not None
    newest_first = ann.responses.input_items.list(final.id)
    assert [i.content[0].text for i in newest_first.data] == ["Word 2.", "Word 1.", "Word 0."]  # type: ignore[union-attr]
    page = ann.responses.input_items.list(final.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["Word 0.", "Word 1."] and page.has_more  # type: ignore[union-attr]
    rest = ann.responses.input_items.list(final.id, order="asc", after=page.last_id)
    assert [i.content[0].text for i in rest.data] == ["Word 2."] and not rest.has_more  # type: ignore[union-attr]


def test_store_false_keeps_nothing_and_delete_forgets(server: KineticServer) -> None:
    ann = client(server, ANN)
    unstored = ann.responses.create(model="m", input="hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        ann.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as named:
        ann.responses.create(model="m", input="again", max_output_tokens=2, previous_response_id=unstored.id)
    body = named.value.body
    assert isinstance(body, dict) and body["param"] == "previous_response_id" and unstored.id in body["message"]

    kept = ann.responses.create(model="m", input="hi", max_output_tokens=2)
    ann.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        ann.responses.retrieve(kept.id)
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_another_student_gets_a_404_and_the_admin_reads_it(server: KineticServer) -> None:
    ann, ben, admin = client(server, ANN), client(server, BEN), client(server, ADMIN)
    hers = ann.responses.create(model="m", input="My secret is blue.", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        ben.responses.retrieve(hers.id)
    with pytest.raises(openai.NotFoundError):
        ben.responses.input_items.list(hers.id)
    with pytest.raises(openai.NotFoundError):
        ben.responses.create(model="m", input="What is it?", max_output_tokens=2, previous_response_id=hers.id)
    with pytest.raises(openai.NotFoundError):
        ben.responses.delete(hers.id)
    assert admin.responses.retrieve(hers.id).id == hers.id
    assert ann.responses.retrieve(hers.id).id == hers.id  # still there: his delete removed nothing


def test_stored_responses_survive_a_restart(server: KineticServer, tmp_path: Path) -> None:
    """With --store-dir (or beside --ledger) the next start reads the responses back; without either, the start
    says that they are kept in memory."""
    assert "stored responses (/v1/responses): memory" in server.log()
    keys = tmp_path / "keys.txt"
    keys.write_text(f"{ANN} ann\n", encoding="utf-8")
    flags = ("-c", "1024", "-np", "1", "--api-key-file", str(keys), "--ledger", str(tmp_path / "ledger.jsonl"))
    with KineticServer(*flags) as before:
        assert f"stored responses (/v1/responses): {tmp_path / 'responses.sqlite3'}" in before.log()
        first = client(before, ANN).responses.create(model="m", input="Name a fruit.", max_output_tokens=4)
    with KineticServer(*flags) as after:
        ann = client(after, ANN)
        assert ann.responses.retrieve(first.id).output_text == first.output_text
        second = ann.responses.create(model="m", input="And a tree.", previous_response_id=first.id,
                                      max_output_tokens=4)
        assert second.usage is not None and first.usage is not None
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
        assert [i.id for i in ann.responses.input_items.list(first.id).data]


def test_a_conversation_gathers_each_turns_input_and_output(server: KineticServer) -> None:
    ann, ben = client(server, ANN), client(server, BEN)
    conversation = ann.conversations.create(items=[{"type": "message", "role": "user", "content": "Hello."}],
                                            metadata={"lab": "04-02"})
    assert conversation.id.startswith("conv_") and conversation.metadata == {"lab": "04-02"}
    first = ann.responses.create(model="m", conversation=conversation.id, input="Name a colour.", max_output_tokens=4)
    assert (first.model_extra or {}).get("conversation") == {"id": conversation.id} or first.conversation
    second = ann.responses.create(model="m", conversation={"id": conversation.id}, input="Another.",
                                  max_output_tokens=4)
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens  # the first turn, read
    listed = ann.conversations.items.list(conversation.id, order="asc")
    texts = [(item.type, getattr(item, "role", None)) for item in listed.data]
    # the first item, then each turn's input and its answer, in order
    assert texts[:2] == [("message", "user"), ("message", "user")] and len(listed.data) >= 4
    answered = sum(any(o.type == "message" for o in r.output) for r in (first, second))
    assert [getattr(i, "role", None) for i in listed.data].count("assistant") == answered

    added = ann.conversations.items.create(conversation.id, items=[{"type": "message", "role": "user",
                                                                    "content": "One more."}])
    [new] = added.data
    assert ann.conversations.items.retrieve(new.id, conversation_id=conversation.id).id == new.id
    ann.conversations.items.delete(new.id, conversation_id=conversation.id)
    assert new.id not in [i.id for i in ann.conversations.items.list(conversation.id, limit=100).data]

    with pytest.raises(openai.NotFoundError):
        ben.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError) as theirs:
        ben.responses.create(model="m", conversation=conversation.id, input="hi", max_output_tokens=2)
    assert isinstance(theirs.value.body, dict) and theirs.value.body["param"] == "conversation"
    with pytest.raises(openai.BadRequestError) as both:
        ann.responses.create(model="m", conversation=conversation.id, previous_response_id=first.id, input="hi")
    assert isinstance(both.value.body, dict) and both.value.body["param"] == "conversation"
    assert ann.conversations.update(conversation.id, metadata={"lab": "04-03"}).metadata == {"lab": "04-03"}
    assert ann.conversations.delete(conversation.id).deleted
    with pytest.raises(openai.NotFoundError):
        ann.conversations.retrieve(conversation.id)


def test_a_background_response_is_polled_to_its_end_and_one_is_cancelled(server: KineticServer) -> None:
    ann, ben = client(server, ANN), client(server, BEN)
    queued = ann.responses.create(model="m", input="Count to ten.", max_output_tokens=8, background=True)
    assert queued.status == "queued" and queued.background is True and not queued.output
    deadline = time.monotonic() + 60
    while (polled := ann.responses.retrieve(queued.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline, "the background response never ended"
        time.sleep(0.1)
    assert polled.status == "completed" and polled.usage is not None and 0 < polled.usage.output_tokens <= 8
    # the run's own line, with the counts she reads back (the budgets and the dashboard take the same record)
    recent = httpx.get(server.url + "/v1/me", headers={"Authorization": f"Bearer {ANN}"}, timeout=10).json()["recent"]
    assert any(r["route"] == "/v1/responses" and r.get("completion_tokens") == polled.usage.output_tokens
               and r.get("prompt_tokens") == polled.usage.input_tokens for r in recent)
    with pytest.raises(openai.NotFoundError):
        ben.responses.retrieve(queued.id)

    long = ann.responses.create(model="m", input="Tell a long story.", max_output_tokens=2000, background=True,
                                extra_body={"ignore_eos": True})
    time.sleep(0.5)
    asked = time.monotonic()
    cancelled = ann.responses.cancel(long.id)
    took = time.monotonic() - asked
    assert cancelled.status == "cancelled" and took < 1.0, (cancelled.status, took)
    assert ann.responses.retrieve(long.id).status == "cancelled"
    # its slot was given back: the decode thread frees a cancelled job's slot at its next step, after the 200
    wait_until(lambda: not any(slot["is_processing"] for slot in httpx.get(
        server.url + "/slots", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).json()),
        "the cancelled response's slot given back", timeout=2)
    with pytest.raises(openai.BadRequestError):
        ann.responses.create(model="m", input="hi", background=True, store=False)
