"""Requests in flight per key, counted once for the whole process.

A key's limit (--max-in-flight) is a classroom rule, not a model's: a student with two requests
running on one model and one waiting on another has three in flight. In router mode every engine
(each local model's scheduler, each upstream's waiting line) counts its requests here as well as in its own
waiting line, so the limit and its 429 hold across models. Engines call it from the event loop and
from their decode threads: it takes its own lock.
"""

from __future__ import annotations

import threading

from kinetic.errors import RateLimitError


class InFlight:
    def __init__(self, limit: int, *, scope: str = "across all models"):
        self.limit = limit  # 0: no limit (the counts are still kept, for the dashboard)
        self.scope = scope  # what the count covers, as the 429 says it ("" for one model's own limit)
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def enter(self, client: str, count: int = 1) -> None:
        """Counts `count` more requests of `client`, all or none; past the limit, a 429 instead."""
        with self._lock:
            n = self._counts.get(client, 0)
            if self.limit and n + count > self.limit:
                where = f" {self.scope}" if self.scope else ""
                raise RateLimitError(f"too many requests in flight for this key{where} (at most {self.limit}); "
                                     "retry when one has finished", retry_after=1)
            self._counts[client] = n + count

    def leave(self, client: str) -> None:
        with self._lock:
            n = self._counts.get(client, 0) - 1
            if n > 0:
                self._counts[client] = n
            else:
                self._counts.pop(client, None)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class ModelInFlight:
    """One model's count (its own --max-in-flight) and, in router mode, the process-wide one: a request is
    counted in both or in neither."""

    def __init__(self, own_limit: int, shared: InFlight | None):
        self.own = InFlight(own_limit, scope="")  # 0: no limit, still counted
        self.shared = shared

    def enter(self, wanted: dict[str, int]) -> None:
        """Counts every client's requests, all or none: past either limit, a 429 and nothing counted."""
        entered: list[tuple[InFlight, str, int]] = []
        try:
            for client, count in wanted.items():
                for counter in (self.own, self.shared):
                    if counter is not None:
                        counter.enter(client, count)
                        entered.append((counter, client, count))
        except BaseException:
            for counter, client, count in entered:
                for _ in range(count):
                    counter.leave(client)
            raise

    def leave(self, client: str) -> None:
        self.own.leave(client)
        if self.shared is not None:
            self.shared.leave(client)
