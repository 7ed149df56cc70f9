"""Stored responses (OpenAI's `store`, true unless a request says false): what `GET /v1/responses/{id}`,
`/input_items`, `DELETE` and a later turn's `previous_response_id` read back.

Each response belongs to the key that made it: another student's key gets the same 404 as for an id that never
existed, and the admin's key reads them all. A server without keys has one owner (None), as one user.

One SQLite database (common/store_database.py, shared with the conversations and the batches): a file (`--store-
dir`, else beside the ledger) that survives a restart, or, with neither, one in memory that a restart empties.
Bounded either way: a response is kept for `ttl_s` (OpenAI keeps them 30 days) and each owner keeps at most
`max_per_owner` responses and `max_bytes_per_owner` bytes of them (images sent as data: URLs count), the oldest
dropped first. A turn that continues a dropped one is a 404 naming `previous_response_id`.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kinetic.classroom.caller import Caller
from kinetic.errors import NotFoundError
from kinetic.protocols.common.store_database import StoreDatabase, may_read

log = logging.getLogger(__name__)

TTL_S = 30 * 24 * 3600
MAX_PER_OWNER = 500
MAX_BYTES_PER_OWNER = 64 * 1024 * 1024

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, owner TEXT, created REAL NOT NULL, size INTEGER NOT NULL,
                                      record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS responses_by_owner ON responses (owner, created);
"""


@dataclass
class StoredResponse:
    id: str
    owner: str | None
    created: float
    body: dict[str, Any]  # the response object as its client got it (a stream's `response.completed` one)
    input_items: list[dict[str, Any]]  # this turn's input, each item with an id (GET .../input_items)
    history: list[dict[str, Any]]  # every item of the conversation up to this turn's output: what a next turn reads

    @cached_property
    def record(self) -> str:
        """The row's text, made once: a put stores it and counts its size (a history may hold images)."""
        return json.dumps({"body": self.body, "input_items": self.input_items, "history": self.history})

    @property
    def size(self) -> int:
        return len(self.record)


class ResponseStore:
    def __init__(self, database: StoreDatabase | None = None, *, ttl_s: float = TTL_S,
                 max_per_owner: int = MAX_PER_OWNER, max_bytes_per_owner: int = MAX_BYTES_PER_OWNER,
                 clock: Callable[[], float] = time.time):
        self.database = database or StoreDatabase()
        self.ttl_s = ttl_s
        self.max_per_owner = max_per_owner
        self.max_bytes_per_owner = max_bytes_per_owner
        self.clock = clock
        self._lock, self._db = self.database.lock, self.database.db
        with self._lock:
            self._db.executescript(SCHEMA)

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT count(*) FROM responses WHERE created >= ?",
                                        (self.clock() - self.ttl_s,)).fetchone()[0])

    def put(self, stored: StoredResponse) -> None:
        """Keeps `stored`, then drops what is past its time and the owner's oldest past the caps (the newest
        stays, however large: its client is being told its id). A disk that cannot take it loses this one
        response, with a warning: the answer itself was already generated."""
        try:
            with self._lock, self._db:
                self._db.execute("BEGIN")
                self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                                 (stored.id, stored.owner, stored.created, stored.size, stored.record))
                self._expire()
                mine = self._db.execute("SELECT id, size FROM responses WHERE owner IS ? ORDER BY created, rowid",
                                        (stored.owner,)).fetchall()
                total = sum(size for _, size in mine)
                while len(mine) > 1 and (len(mine) > self.max_per_owner or total > self.max_bytes_per_owner):
                    oldest, size = mine.pop(0)
                    self._db.execute("DELETE FROM responses WHERE id = ?", (oldest,))
                    total -= size
        except sqlite3.Error as exc:
            log.warning("response %s not stored in %s: %s", stored.id, self.database.where, exc)

    def get(self, response_id: str, caller: Caller, *, param: str | None = None) -> StoredResponse:
        """The response, if `caller` may read it: its owner, or the admin. Otherwise the 404 of a missing one."""
        with self._lock:
            row = self._db.execute("SELECT owner, created, record FROM responses WHERE id = ? AND created >= ?",
                                   (response_id, self.clock() - self.ttl_s)).fetchone()
        if row is None or not may_read(caller, row[0]):
            raise NotFoundError(f"Response with id '{response_id}' not found.", param=param)
        record = json.loads(row[2])
        return StoredResponse(id=response_id, owner=row[0], created=row[1], body=record["body"],
                              input_items=record["input_items"], history=record["history"])

    def delete(self, response_id: str, caller: Caller) -> None:
        stored = self.get(response_id, caller)
        with self._lock:
            self._db.execute("DELETE FROM responses WHERE id = ?", (stored.id,))

    def _expire(self) -> None:
        """Within put's transaction: drops what is past its time."""
        self._db.execute("DELETE FROM responses WHERE created < ?", (self.clock() - self.ttl_s,))
