"""The Responses store's rules, without a server: a response is read by its owner and the admin only (another
key gets the 404 of a missing id), it expires after its time, and each owner's count and bytes are capped, the
oldest dropped first."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic.classroom.caller import Caller
from kinetic.classroom.roles import Role
from kinetic.errors import NotFoundError
from kinetic.protocols.common.store_database import StoreDatabase
from kinetic.protocols.responses.store import ResponseStore, StoredResponse

ANN = Caller("ann", Role.STUDENT)
BEN = Caller("ben", Role.STUDENT)
TEACHER = Caller("teacher", Role.ADMIN)


def stored(response_id: str, owner: str | None, created: float = 0.0, text: str = "hi") -> StoredResponse:
    item = {"id": "msg_1", "type": "message", "role": "user", "content": text}
    return StoredResponse(id=response_id, owner=owner, created=created, body={"id": response_id, "output": []},
                          input_items=[item], history=[item])


def test_a_response_is_read_by_its_owner_and_the_admin_only() -> None:
    store = ResponseStore(clock=lambda: 0.0)
    store.put(stored("resp_a", "ann"))
    assert store.get("resp_a", ANN).owner == "ann"
    assert store.get("resp_a", TEACHER).owner == "ann"
    with pytest.raises(NotFoundError) as other:
        store.get("resp_a", BEN, param="previous_response_id")
    assert other.value.param == "previous_response_id" and "resp_a" in other.value.message
    with pytest.raises(NotFoundError):
        store.delete("resp_a", BEN)  # not hers: nothing deleted
    store.delete("resp_a", ANN)
    with pytest.raises(NotFoundError):
        store.get("resp_a", ANN)


def test_a_response_expires_after_its_time() -> None:
    now = [0.0]
    store = ResponseStore(ttl_s=100, clock=lambda: now[0])
    store.put(stored("resp_old", "ann", created=0.0))
    store.put(stored("resp_new", "ann", created=50.0))
    now[0] = 120.0
    with pytest.raises(NotFoundError):
        store.get("resp_old", ANN)
    assert store.get("resp_new", ANN).id == "resp_new" and len(store) == 1


def test_each_owner_keeps_its_newest_within_its_count_and_bytes() -> None:
    store = ResponseStore(max_per_owner=2, clock=lambda: 0.0)
    for index in range(3):
        store.put(stored(f"resp_{index}", "ann"))
    store.put(stored("resp_ben", "ben"))  # another owner's do not count against hers
    with pytest.raises(NotFoundError):
        store.get("resp_0", ANN)
    assert [store.get(f"resp_{i}", ANN).id for i in (1, 2)] == ["resp_1", "resp_2"]
    assert store.get("resp_ben", BEN).id == "resp_ben"

    small = ResponseStore(max_bytes_per_owner=1000, clock=lambda: 0.0)
    small.put(stored("resp_x", "ann", text="x" * 300))
    small.put(stored("resp_y", "ann", text="y" * 300))  # both together pass 1000 bytes: the older goes
    small.put(stored("resp_big", "ann", text="z" * 5000))  # alone over the cap: kept, as the newest
    assert len(small) == 1 and small.get("resp_big", ANN).id == "resp_big"


def test_a_store_in_a_folder_survives_a_restart(tmp_path: Path) -> None:
    first = ResponseStore(StoreDatabase(tmp_path), clock=lambda: 0.0)
    first.put(stored("resp_kept", "ann", text="kept"))
    first.put(stored("resp_gone", "ann"))
    first.delete("resp_gone", ANN)
    first.database.close()
    again = ResponseStore(StoreDatabase(tmp_path), clock=lambda: 0.0)  # the next start, on the same folder
    kept = again.get("resp_kept", ANN)
    assert kept.history[0]["content"] == "kept" and kept.body == {"id": "resp_kept", "output": []}
    with pytest.raises(NotFoundError):
        again.get("resp_gone", ANN)
    assert again.database.where == str(tmp_path / "responses.sqlite3") and "memory" in ResponseStore().database.where
