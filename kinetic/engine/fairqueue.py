"""The waiting line for slots, fair across clients.

First come, first served lets one student's loop of twenty requests push everyone else back
twenty places. Here each client (a key's name) has its own line, and a free slot goes to the
client served least recently; within one client, requests keep their order. With `fair=False`
it is plain arrival order, as llama-server does.
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
        self._arrivals = itertools.count()
        self._services = itertools.count(1)

    def push(self, client: str, item: T) -> None:
        self._lines.setdefault(client, deque()).append((next(self._arrivals), item))

    def remove(self, item: T) -> bool:
        for client, line in self._lines.items():
            for entry in line:
                if entry[1] is item:
                    line.remove(entry)
                    if not line:
                        del self._lines[client]
                    return True
        return False

    def served(self, client: str, item: T) -> None:
        """Takes `item` out of the line: it got a slot."""
        self.remove(item)
        self._last_served[client] = next(self._services)

    def in_order(self) -> Iterator[tuple[str, T]]:
        """Waiting items in the order they should get a slot (a later one may go first when the
        slot an earlier one asked for by id is busy)."""
        entries = [(seq, client, item) for client, line in self._lines.items() for seq, item in line]
        if not self.fair:
            for _, client, item in sorted(entries, key=lambda e: e[0]):
                yield client, item
            return
        # Round-robin: each client's first, in order of least recent service, then each one's second...
        clients = sorted(self._lines, key=lambda c: (self._last_served.get(c, 0), self._lines[c][0][0]))
        depth = max((len(line) for line in self._lines.values()), default=0)
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
