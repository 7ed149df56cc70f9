"""The waiting line for slots, fair across clients.

First come, first served lets one student's loop of twenty requests push everyone else back
twenty places. Here each client (a key's name) has its own line, and a free slot goes to the
client served least recently; within one client, requests keep their order. With `fair=False`
it is plain arrival order, as llama-server does.

A client's priority (the key file's `priority=`; the instructor's key is above the students') goes
before both: every waiting request of a higher priority is served before any of a lower one, so
the instructor's demonstration does not wait behind the class.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(self, *, fair: bool = True):
        self.fair = fair
        self._lines: dict[str, deque[tuple[int, T]]] = {}
        self._last_served: dict[str, int] = {}
        self._priority: dict[str, int] = {}  # of the clients waiting now
        self._arrivals = itertools.count()
        self._returns = itertools.count(-1, -1)  # given back: before every arrival, the latest first
        self._services = itertools.count(1)

    def push(self, client: str, item: T, priority: int = 0) -> None:
        self._lines.setdefault(client, deque()).append((next(self._arrivals), item))
        self._priority[client] = priority

    def give_back(self, client: str, item: T, priority: int = 0) -> None:
        """An item that had been served and lost its place (a prompt with no room to be read) waits again at the head
        of the whole line: first of its client's, and its client first among those of its priority."""
        self._lines.setdefault(client, deque()).appendleft((next(self._returns), item))
        self._priority[client] = priority
        self._last_served[client] = 0

    def remove(self, item: T) -> bool:
        for client, line in self._lines.items():
            for entry in line:
                if entry[1] is item:
                    line.remove(entry)
                    if not line:
                        del self._lines[client]
                        self._priority.pop(client, None)
                    return True
        return False

    def served(self, client: str, item: T) -> None:
        """Takes `item` out of the line: it got a slot."""
        self.remove(item)
        self._last_served[client] = next(self._services)

    def in_order(self) -> Iterator[tuple[str, T]]:
        """Waiting items in the order they should get a slot (a later one may go first when the
        slot an earlier one asked for by id is busy)."""
        for priority in sorted(set(self._priority.values()), reverse=True):
            yield from self._in_order_among([c for c in self._lines if self._priority.get(c, 0) == priority])

    def _in_order_among(self, clients: list[str]) -> Iterator[tuple[str, T]]:
        if not self.fair:
            entries = [(seq, client, item) for client in clients for seq, item in self._lines[client]]
            for _, client, item in sorted(entries, key=lambda e: e[0]):
                yield client, item
            return
        # Round-robin: each client's first, in order of least recent service, then each one's second...
        clients = sorted(clients, key=lambda c: (self._last_served.get(c, 0), self._lines[c][0][0]))
        depth = max((len(self._lines[client]) for client in clients), default=0)
        for rank in range(depth):
            for client in clients:
                line = self._lines[client]
                if rank < len(line):
                    yield client, line[rank][1]

    def __len__(self) -> int:
        return sum(len(line) for line in self._lines.values())

    def __bool__(self) -> bool:
        return bool(self._lines)

    def counts(self) -> dict[str, int]:
        return {client: len(line) for client, line in self._lines.items()}
