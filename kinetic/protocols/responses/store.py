"""Stored responses (OpenAI's `store`, true unless a request says false): what `GET /v1/responses/{id}`,
`/input_items`, `DELETE` and a later turn's `previous_response_id` read back.

Each response belongs to the key that made it: another student's key gets the same 404 as for an id that
never existed, and the admin's key reads them all. A server without keys has one owner (None), as one user.

Bounded in memory: a response is kept for `ttl_s` (OpenAI keeps them 30 days) and each owner keeps at most
`max_per_owner` responses and `max_bytes_per_owner` bytes of them (images sent as data: URLs count), the
oldest dropped first. A turn that continues a dropped one is a 404 naming `previous_response_id`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kinetic.classroom.caller import Caller
from kinetic.classroom.roles import Role
from kinetic.errors import NotFoundError

TTL_S = 30 * 24 * 3600
MAX_PER_OWNER = 500
MAX_BYTES_PER_OWNER = 64 * 1024 * 1024


@dataclass
class StoredResponse:
    id: str
    owner: str | None
    created: float
    body: dict[str, Any]  # the response object as its client got it (a stream's `response.completed` one)
    input_items: list[dict[str, Any]]  # this turn's input, each item with an id (GET .../input_items)
    history: list[dict[str, Any]]  # every item of the conversation up to this turn's output: what a next turn reads
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(json.dumps(self.history)) + len(json.dumps(self.body))


class ResponseStore:
    def __init__(self, *, ttl_s: float = TTL_S, max_per_owner: int = MAX_PER_OWNER,
                 max_bytes_per_owner: int = MAX_BYTES_PER_OWNER, clock: Callable[[], float] = time.time):
        self.ttl_s = ttl_s
        self.max_per_owner = max_per_owner
        self.max_bytes_per_owner = max_bytes_per_owner
        self.clock = clock
        self._by_id: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_id)

    def put(self, stored: StoredResponse) -> None:
        with self._lock:
            self._by_id[stored.id] = stored
            self._expire()
            mine = [r for r in self._by_id.values() if r.owner == stored.owner]
            total = sum(r.size for r in mine)
            # the newest (last) stays, however large: its client is being told its id
            while len(mine) > 1 and (len(mine) > self.max_per_owner or total > self.max_bytes_per_owner):
                oldest = mine.pop(0)
                del self._by_id[oldest.id]
                total -= oldest.size

    def get(self, response_id: str, caller: Caller, *, param: str | None = None) -> StoredResponse:
        """The response, if `caller` may read it: its owner, or the admin. Otherwise the 404 of a missing one."""
        with self._lock:
            self._expire()
            stored = self._by_id.get(response_id)
        if stored is None or not _may_read(caller, stored):
            raise NotFoundError(f"Response with id '{response_id}' not found.", param=param)
        return stored

    def delete(self, response_id: str, caller: Caller) -> None:
        stored = self.get(response_id, caller)
        with self._lock:
            self._by_id.pop(stored.id, None)

    def _expire(self) -> None:
        """Under the lock: drops what is past its time (the oldest come first)."""
        limit = self.clock() - self.ttl_s
        while self._by_id:
            oldest = next(iter(self._by_id.values()))
            if oldest.created >= limit:
                return
            del self._by_id[oldest.id]


def _may_read(caller: Caller, stored: StoredResponse) -> bool:
    return stored.owner == caller.name or (caller.role is Role.ADMIN and caller.name is not None)
