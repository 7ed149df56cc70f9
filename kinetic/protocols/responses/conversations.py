"""OpenAI's conversations (`/v1/conversations`): a list of items that `/v1/responses` with `conversation` reads before
its input and appends its input and output to, in order.

Kept in the stored responses' database (common/store_database.py), with the same rules: a conversation belongs to
the key that made it (another student's key gets the 404 of a missing one; the admin's reads them all), and it is
bounded: each key keeps at most `max_per_owner` conversations (the oldest dropped first) and a conversation at most
`max_items` items (more is a 400).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from kinetic.classroom.caller import Caller
from kinetic.errors import InvalidRequestError, NotFoundError
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.store_database import StoreDatabase, may_read

MAX_PER_OWNER = 200
MAX_ITEMS = 1000
MAX_ADDED = 20  # items one POST .../items may add, as OpenAI
SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (id TEXT PRIMARY KEY, owner TEXT, created REAL NOT NULL,
                                          metadata TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversation_items (seq INTEGER PRIMARY KEY AUTOINCREMENT, conversation TEXT NOT NULL,
                                               id TEXT NOT NULL, item TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS conversation_items_in_order ON conversation_items (conversation, seq);
"""


class ConversationStore:
    def __init__(self, database: StoreDatabase, *, max_per_owner: int = MAX_PER_OWNER, max_items: int = MAX_ITEMS,
                 clock: Callable[[], float] = time.time):
        self.database = database
        self.max_per_owner = max_per_owner
        self.max_items = max_items
        self.clock = clock
        self._lock, self._db = database.lock, database.db
        with self._lock:
            self._db.executescript(SCHEMA)

    def create(self, caller: Caller, metadata: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
        _check_added(items, MAX_ADDED)
        new_id = common.random_id("conv_", 48)
        conversation = {"id": new_id, "object": "conversation", "created_at": int(self.clock()), "metadata": metadata}
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT INTO conversations VALUES (?, ?, ?, ?)",
                             (new_id, caller.name, self.clock(), json.dumps(metadata)))
            self._insert(new_id, items)
            mine = [row[0] for row in self._db.execute(
                "SELECT id FROM conversations WHERE owner IS ? ORDER BY created, rowid", (caller.name,))]
            for oldest in mine[:max(0, len(mine) - self.max_per_owner)]:
                self._drop(oldest)
        return conversation

    def get(self, conversation_id: str, caller: Caller, *, param: str | None = None) -> dict[str, Any]:
        with self._lock:
            row = self._db.execute("SELECT owner, created, metadata FROM conversations WHERE id = ?",
                                   (conversation_id,)).fetchone()
        if row is None or not may_read(caller, row[0]):
            raise NotFoundError(f"Conversation with id '{conversation_id}' not found.", param=param)
        return {"id": conversation_id, "object": "conversation", "created_at": int(row[1]),
                "metadata": json.loads(row[2])}

    def update(self, conversation_id: str, caller: Caller, metadata: dict[str, Any]) -> dict[str, Any]:
        self.get(conversation_id, caller)
        with self._lock:
            self._db.execute("UPDATE conversations SET metadata = ? WHERE id = ?", (json.dumps(metadata),
                                                                                   conversation_id))
        return self.get(conversation_id, caller)

    def delete(self, conversation_id: str, caller: Caller) -> None:
        self.get(conversation_id, caller)
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._drop(conversation_id)

    def items(self, conversation_id: str, caller: Caller, *, param: str | None = None) -> list[dict[str, Any]]:
        """Every item, oldest first."""
        self.get(conversation_id, caller, param=param)
        with self._lock:
            rows = self._db.execute("SELECT item FROM conversation_items WHERE conversation = ? ORDER BY seq",
                                    (conversation_id,)).fetchall()
        return [json.loads(row[0]) for row in rows]

    def item(self, conversation_id: str, item_id: str, caller: Caller) -> dict[str, Any]:
        found = [item for item in self.items(conversation_id, caller) if item["id"] == item_id]
        if not found:
            raise NotFoundError(f"Item with id '{item_id}' not found in conversation '{conversation_id}'.")
        return found[0]

    def add(self, conversation_id: str, caller: Caller, items: list[dict[str, Any]], *, limit: int = MAX_ADDED
            ) -> list[dict[str, Any]]:
        """Appends `items` (each with its id) in order: a client's POST .../items (at most 20), or a response's
        input and output (`limit` 0: no limit but the conversation's)."""
        if limit:
            _check_added(items, limit)
        self.get(conversation_id, caller)
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._insert(conversation_id, items)
        return items

    def remove_item(self, conversation_id: str, item_id: str, caller: Caller) -> dict[str, Any]:
        self.item(conversation_id, item_id, caller)
        with self._lock:
            self._db.execute("DELETE FROM conversation_items WHERE conversation = ? AND id = ?",
                             (conversation_id, item_id))
        return self.get(conversation_id, caller)

    def _insert(self, conversation_id: str, items: list[dict[str, Any]]) -> None:
        """Within a transaction: a conversation never holds more than max_items."""
        held = self._db.execute("SELECT count(*) FROM conversation_items WHERE conversation = ?",
                                (conversation_id,)).fetchone()[0]
        if held + len(items) > self.max_items:
            raise InvalidRequestError(f"conversation {conversation_id!r} would hold more than {self.max_items} items: "
                                      "start a new conversation", param="conversation")
        self._db.executemany("INSERT INTO conversation_items (conversation, id, item) VALUES (?, ?, ?)",
                             [(conversation_id, item["id"], json.dumps(item)) for item in items])

    def _drop(self, conversation_id: str) -> None:
        self._db.execute("DELETE FROM conversation_items WHERE conversation = ?", (conversation_id,))
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))


def _check_added(items: list[dict[str, Any]], limit: int) -> None:
    if len(items) > limit:
        raise InvalidRequestError(f"items: at most {limit} items at a time, but got {len(items)}", param="items")
