"""A graceful shutdown: SIGTERM or Ctrl+C stops new connections, lets open streams finish for up to
`--drain-timeout` seconds, then ends what is left in each protocol's own way, and exits 0.

uvicorn alone waits for every open connection however long its stream runs (a 600-token answer
kept a stopped server up for over 30 s), or, with its own timeout, cancels the response tasks, which
cuts each stream without its protocol's ending. Here, when the drain time is up, every engine fails
its open requests (`end_streams`: a 503 "the server is shutting down" that the streaming layer sends
as the protocol's error event and terminator), so the streams end within a second and their
connections close. uvicorn's own timeout stays as a backstop. A second Ctrl+C exits at once
(uvicorn's force exit). The requests still waiting for a slot when the signal comes are not drained: they get
a 503 with Retry-After at once (a restart for an upgrade; the client comes back to the next server).

uvicorn re-raises the signal it caught once it has shut down (so that a parent process sees it);
kinetic's shutdown is complete by then, and a stopped server exits 0 instead. This leans on
uvicorn.Server's `shutdown`, `_serve`, `_captured_signals` and `force_exit`, checked against uvicorn
0.54 (tests/e2e/test_faults.py runs a real process through it).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

BACKSTOP_S = 3.0  # after the streams were ended, how long uvicorn still waits before it cancels tasks
POLL_S = 0.05


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, drain_s: float, end_streams: Callable[[], Awaitable[None]],
                 refuse_waiting: Callable[[], None]):
        config.timeout_graceful_shutdown = int(drain_s + BACKSTOP_S + 1)
        super().__init__(config)
        self.drain_s = drain_s
        self.end_streams = end_streams
        self.refuse_waiting = refuse_waiting

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.refuse_waiting()
        ender = asyncio.get_running_loop().create_task(self._end_streams_after_drain())
        try:
            await super().shutdown(sockets)
        finally:
            ender.cancel()

    async def _end_streams_after_drain(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_s
        while loop.time() < deadline and not self.force_exit and self.server_state.connections:
            await asyncio.sleep(POLL_S)
        if self.server_state.connections and not self.force_exit:
            log.warning("shutting down: ending %d open connection(s) after %.1f s", len(self.server_state.connections),
                        self.drain_s)
            await self.end_streams()

    async def _serve(self, *args: Any, **kwargs: Any) -> None:
        await super()._serve(*args, **kwargs)
        self._captured_signals.clear()  # shut down as asked: exit 0, not by the signal re-raised
