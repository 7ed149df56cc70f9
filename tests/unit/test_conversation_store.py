"""The conversations' rules, without a server: items kept in order, a conversation read only by its owner and the
admin (another key gets the 404 of a missing one), each key's oldest conversations dropped past its cap, a
conversation that would pass its item cap refused whole, and all of it read back from the folder after a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic.classroom.caller import Caller
from kinetic.classroom.roles import Role
from kinetic.errors import InvalidRequestError, NotFoundError
from kinetic.protocols.common.store_database import StoreDatabase, page
from kinetic.protocols.responses.conversations import ConversationStore

ANN = Caller("ann", Role.STUDENT)
BEN = Caller("ben", Role.STUDENT)
TEACHER = Caller("teacher", Role.ADMIN)


def message(item_id: str, text: str) -> dict[str, object]:
    return {"id": item_id, "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_items_keep_their_order_and_only_the_owner_and_the_admin_read_them() -> None:
    store = ConversationStore(StoreDatabase())
    made = store.create(ANN, {"topic": "sea"}, [message("msg_1", "one")])
    assert made["object"] == "conversation" and made["id"].startswith("conv_") and made["metadata"] == {"topic": "sea"}
    store.add(made["id"], ANN, [message("msg_2", "two"), message("msg_3", "three")])
    assert [i["id"] for i in store.items(made["id"], ANN)] == ["msg_1", "msg_2", "msg_3"]
    assert store.item(made["id"], "msg_2", TEACHER)["content"][0]["text"] == "two"
    for attempt in (lambda: store.get(made["id"], BEN), lambda: store.items(made["id"], BEN),
                    lambda: store.add(made["id"], BEN, [message("msg_x", "x")]), lambda: store.delete(made["id"], BEN)):
        with pytest.raises(NotFoundError):
            attempt()
    assert store.update(made["id"], ANN, {"topic": "lake"})["metadata"] == {"topic": "lake"}
    assert store.remove_item(made["id"], "msg_2", ANN)["id"] == made["id"]
    assert [i["id"] for i in store.items(made["id"], ANN)] == ["msg_1", "msg_3"]
    store.delete(made["id"], ANN)
    with pytest.raises(NotFoundError):
        store.get(made["id"], ANN)


def test_caps_drop_the_oldest_conversation_and_refuse_a_full_one() -> None:
    store = ConversationStore(StoreDatabase(), max_per_owner=2, max_items=3)
    ids = [store.create(ANN, {}, [])["id"] for _ in range(3)]
    with pytest.raises(NotFoundError):
        store.get(ids[0], ANN)
    assert [store.get(i, ANN)["id"] for i in ids[1:]] == ids[1:]
    store.add(ids[1], ANN, [message("msg_1", "1"), message("msg_2", "2")])
    with pytest.raises(InvalidRequestError) as full:
        store.add(ids[1], ANN, [message("msg_3", "3"), message("msg_4", "4")])
    assert full.value.param == "conversation"
    assert len(store.items(ids[1], ANN)) == 2  # refused whole: not one of the two was added
    with pytest.raises(InvalidRequestError):
        store.add(ids[1], ANN, [message(f"msg_{i}", "x") for i in range(21)])  # over 20 at a time


def test_conversations_are_read_back_after_a_restart(tmp_path: Path) -> None:
    first = ConversationStore(StoreDatabase(tmp_path))
    made = first.create(ANN, {}, [message("msg_1", "kept")])
    first.database.close()
    again = ConversationStore(StoreDatabase(tmp_path))
    assert again.items(made["id"], ANN)[0]["content"][0]["text"] == "kept"


def test_a_page_of_items_is_openais_list() -> None:
    listed = [message(f"msg_{i}", str(i)) for i in range(5)]
    newest = page(listed, limit=2, order="desc", after=None, owner_id="conv_1")
    assert [i["id"] for i in newest["data"]] == ["msg_4", "msg_3"] and newest["has_more"]
    rest = page(listed, limit=10, order="desc", after=newest["last_id"], owner_id="conv_1")
    assert [i["id"] for i in rest["data"]] == ["msg_2", "msg_1", "msg_0"] and not rest["has_more"]
    with pytest.raises(InvalidRequestError):
        page(listed, limit=0, order="asc", after=None, owner_id="conv_1")
