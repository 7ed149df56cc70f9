"""The upstream's waiting line: at most `n_slots` requests forwarded at once, the rest waiting in a
line fair across keys (scheduling/fairqueue.py), and every request counted per key (scheduling/inflight.py:
the model's own limit, and the process-wide one in router mode) until it is done."""

from __future__ import annotations

import asyncio

from kinetic.errors import KineticError, QueueFullError
from kinetic.scheduling.fairqueue import FairQueue
from kinetic.scheduling.inflight import InFlight, ModelInFlight


class WaitingLine:
    def __init__(self, n_slots: int, *, fair: bool, own_limit: int, shared: InFlight | None, max_queue: int = 0):
        self.n_slots = n_slots
        self.max_queue = max_queue  # --max-queue: requests that may wait here (0: no cap)
        self.running = 0
        self.in_flight = ModelInFlight(own_limit, shared)  # this model's --max-in-flight, and the router's
        self._waiting: FairQueue[asyncio.Future[None]] = FairQueue(fair=fair)
        self._refusal: KineticError | None = None  # a shutdown's: later requests are refused

    def __len__(self) -> int:
        return len(self._waiting)

    def waiting_by_client(self) -> dict[str, int]:
        return self._waiting.counts()

    def count(self, client: str) -> None:
        """One more request of `client` in flight; past a limit, a 429 instead."""
        self.in_flight.enter({client: 1})

    def uncount(self, client: str) -> None:
        self.in_flight.leave(client)

    async def take_turn(self, client: str, priority: int = 0) -> None:
        """Returns when a connection is free for this request (at once when one is and nobody waits);
        past --max-queue waiting, a 503 at once."""
        if self._refusal is not None:
            raise self._refusal
        if self.running < self.n_slots and not self._waiting:
            self.running += 1
            return
        if self.max_queue and len(self._waiting) >= self.max_queue:
            raise QueueFullError(self.max_queue)
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.push(client, turn, priority)
        try:
            await turn
        except asyncio.CancelledError:
            if not self._waiting.remove(turn):  # the turn was given just as we left: pass it on
                self.end_turn()
            raise

    def end_turn(self) -> None:
        self.running -= 1
        for client, turn in self._waiting.in_order():
            self._waiting.served(client, turn)
            self.running += 1
            turn.set_result(None)
            return

    def refuse(self, error: KineticError) -> None:
        """A shutdown's start: the waiting requests and every later one get `error`; the running go on."""
        self._refusal = error
        self.fail_waiting(error)

    def fail_waiting(self, error: KineticError) -> None:
        """Every waiting request gets `error` (the model is unloaded)."""
        for client, turn in list(self._waiting.in_order()):
            self._waiting.served(client, turn)
            if not turn.done():
                turn.set_exception(error)
