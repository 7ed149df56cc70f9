"""DecodeTurns: the one CPU that every local model's decode steps take turns on.

llama.cpp's worker threads spin while they wait, so two contexts decoding at once on a small machine
crawl (two Gemma 270M contexts on 2 cores: ~1 token/s each). Every LlamaEngine of a process (each
model's generation scheduler and embedding context) takes these turns around each decode step. A
plain threading.Lock is not fair (the thread that just released it may take it again at once), so
waiting threads are served in arrival order: two busy models alternate step by step.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

# What a scheduler or an embedding context holds around each decode: a DecodeTurns, or any lock.
DecodeLock = AbstractContextManager[Any]


class DecodeTurns:
    """A first-come, first-served lock (a ticket lock over a condition variable)."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._next_ticket = 0
        self._serving = 0

    def acquire(self) -> None:
        with self._cv:
            ticket = self._next_ticket
            self._next_ticket += 1
            while self._serving != ticket:
                self._cv.wait()

    def release(self) -> None:
        with self._cv:
            self._serving += 1
            self._cv.notify_all()

    def locked(self) -> bool:
        with self._cv:
            return self._serving != self._next_ticket

    def __enter__(self) -> DecodeTurns:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
