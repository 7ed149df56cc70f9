"""The chat page's saved conversations (--chat-history): each key sees and writes only its own, a chat is
written whole, bad ids and oversized chats are refused naming the field, and the ledger does not record
the page saving them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kinetic.classroom import chats
from kinetic.classroom.chats import ChatStore
from kinetic.classroom.ledger import recorded
from kinetic.errors import InsufficientStorageError, InvalidRequestError, NotFoundError, PayloadTooLargeError
from tests.unit.test_roles import ADMIN, STUDENT, keyed_app

BOB = "sk-bob"
MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "what is a KV cache?"},
                                  {"role": "assistant", "content": "a cache of keys and values"}]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_key_finds_its_chats_again_and_never_sees_anothers(tmp_path: Path) -> None:
    with keyed_app(tmp_path, chat_history=str(tmp_path / "chats")) as client:
        saved = client.put("/chats/lab2-a", json={"title": "KV cache", "messages": MESSAGES}, headers=auth(STUDENT))
        assert saved.status_code == 200, saved.text
        assert saved.json()["n_messages"] == 2
        # the same key from anywhere (another lab PC): the list and the whole chat
        listed = client.get("/chats", headers=auth(STUDENT)).json()["data"]
        assert [(c["id"], c["title"]) for c in listed] == [("lab2-a", "KV cache")]
        assert client.get("/chats/lab2-a", headers=auth(STUDENT)).json()["messages"] == MESSAGES
        # another student: an empty list, and the same id is not theirs to read, overwrite or delete
        assert client.get("/chats", headers=auth(BOB)).json()["data"] == []
        assert client.get("/chats/lab2-a", headers=auth(BOB)).status_code == 404
        assert client.delete("/chats/lab2-a", headers=auth(BOB)).status_code == 404
        client.put("/chats/lab2-a", json={"title": "bob's", "messages": []}, headers=auth(BOB))
        assert client.get("/chats/lab2-a", headers=auth(STUDENT)).json()["title"] == "KV cache"
        # the admin is one more owner, not a reader of everyone's chats
        assert client.get("/chats", headers=auth(ADMIN)).json()["data"] == []
        assert client.get("/chats", headers={}).status_code == 401
        assert client.delete("/chats/lab2-a", headers=auth(STUDENT)).json() == {"id": "lab2-a", "deleted": True}
        assert client.get("/chats/lab2-a", headers=auth(STUDENT)).status_code == 404
    assert sorted(p.name for p in (tmp_path / "chats").iterdir()) == ["alice", "bob"]


def test_bad_input_is_a_400_naming_the_field(tmp_path: Path) -> None:
    with keyed_app(tmp_path, chat_history=str(tmp_path / "chats")) as client:
        bad_id = client.put("/chats/..%2Fbob", json={"title": "", "messages": []}, headers=auth(STUDENT))
        assert bad_id.status_code in (400, 404), bad_id.text
        bad_id = client.put("/chats/a.b", json={"title": "", "messages": []}, headers=auth(STUDENT))
        assert bad_id.status_code == 400 and "id" in bad_id.json()["error"]["message"], bad_id.text
        no_messages = client.put("/chats/a", json={"title": "x"}, headers=auth(STUDENT))
        assert no_messages.status_code == 400 and "messages" in no_messages.text, no_messages.text
        # the server keeps serving, and nothing was written
        assert client.get("/chats", headers=auth(STUDENT)).json()["data"] == []


def test_without_the_flag_the_routes_say_how_to_turn_it_on(tmp_path: Path) -> None:
    with keyed_app(tmp_path) as client:
        answer = client.get("/chats", headers=auth(STUDENT))
        assert answer.status_code == 404 and "--chat-history" in answer.json()["error"]["message"]
        assert client.get("/ui/config.json").json()["chat_history"] is False


def test_store_limits_and_whole_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ChatStore(tmp_path)
    with pytest.raises(PayloadTooLargeError, match="messages"):
        store.save("alice", "big", "", [{"role": "user", "content": "x" * chats.MAX_CHAT_BYTES}])
    monkeypatch.setattr(chats, "MAX_CHATS_PER_OWNER", 2)
    store.save("alice", "one", "1", MESSAGES)
    store.save("alice", "two", "2", MESSAGES)
    store.save("alice", "two", "2 again", MESSAGES)  # saving an existing chat again is not a new one
    with pytest.raises(InsufficientStorageError, match="delete some"):
        store.save("alice", "three", "3", MESSAGES)
    assert [s.id for s in store.summaries("alice")] == ["two", "one"]  # the last saved first
    assert not list(tmp_path.glob("alice/.*.tmp")), "a temporary file was left behind"
    with pytest.raises(NotFoundError):
        store.get("alice", "three")
    # a key name that would climb out of the folder, and a file edited by hand into something else
    for name in ("..", ".", "_open"):
        with pytest.raises(InvalidRequestError):
            store.summaries(name)
    (tmp_path / "alice" / "broken.json").write_text(json.dumps({"id": "broken"}))
    assert [s.id for s in store.summaries("alice")] == ["two", "one"]
    assert store.summaries(None) == [] and store.save(None, "x", "", []).id == "x"  # an open server: one owner


def test_the_ledger_does_not_record_the_page_saving_chats() -> None:
    assert not recorded("/chats") and not recorded("/chats/abc")
    assert recorded("/chat/completions") and recorded("/v1/chat/completions")
