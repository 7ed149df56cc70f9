"""Requests between the server's door and a model's queue, which an idle scheduler waits for.

Requests sent together (a class pressing Enter at once, a benchmark's streams) reach the event loop one after the
other, and each spends a millisecond or two there (HTTP, validation, the prompt's tokens) before it is queued. A
scheduler that started the first one's prompt alone made the others wait out that whole step: at 4 streams on a
tiny model, the first answer's first token came at 15 ms and the others' at 25-33 ms (2026-12-05, 2 cores), against
~15 ms for all four when their prompts share one step. So the transport counts each POST in at the door as its head
is read (the ledger middleware, where there is no transport: a test's client), and it is counted out once its
backend has prepared it (at the event loop's next turn, by when the route has queued it: counted out at once, a
scheduler that looked between the two started without it), when its answer starts, or when it ends; an idle
scheduler waits for the count to reach zero (admission.GATHER_S at most). A request keeps the count only while the
event loop works on it, so a count that never falls costs a scheduler at most that wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any


class Arrivals:
    """How many requests are between the door and their queue, and who wants to know when that falls."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._listeners: list[Callable[[], None]] = []

    @property
    def count(self) -> int:
        return self._count

    def arrive(self) -> Callable[[], None]:
        """Counts one request in; the function returned counts it out (once, however often it is called)."""
        with self._lock:
            self._count += 1
        left = False

        def leave() -> None:
            nonlocal left
            with self._lock:
                if left:
                    return
                left = True
                self._count -= 1
                listeners = list(self._listeners)
            for listener in listeners:
                listener()

        return leave

    def subscribe(self, listener: Callable[[], None]) -> None:
        """`listener` is called (on the event loop's thread) each time a request is counted out."""
        with self._lock:
            self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


DOOR = Arrivals()  # this process's door: every app in it counts its requests here, every scheduler reads it

# The transport (server/transport.py) counts a POST in as soon as its head is read, before the event loop gets to the
# app, and puts the function that counts it out in the request's scope under this key.
DOOR_SCOPE_KEY = "kinetic.door"


def arrived(scope: Mapping[str, Any]) -> Callable[[], None]:
    """The request's count at the door: the transport's, or one taken now where the transport took none (a test's
    client, a request pipelined behind another on its connection)."""
    leave = scope.get(DOOR_SCOPE_KEY)
    return leave if leave is not None else DOOR.arrive()
