"""A graceful shutdown: SIGTERM or Ctrl+C stops new connections, lets open streams finish for up to
`--drain-timeout` seconds, then ends what is left in each protocol's own way, and exits 0.

uvicorn alone waits for every open connection however long its stream runs (a 600-token answer
kept a stopped server up for over 30 s), or, with its own timeout, cancels the response tasks, which
cuts each stream without its protocol's ending. Here, when the drain time is up, every engine fails
its open requests (`end_streams`: a 503 "the server is shutting down" that the streaming layer sends
as the protocol's error event and terminator), so the streams end within a second and their
connections close. uvicorn's graceful timeout stays as a backstop. A second Ctrl+C exits at once
(uvicorn's force exit). The requests still waiting for a slot when the signal comes are not drained: they get
a 503 with Retry-After at once (a restart for an upgrade; the client comes back to the next server).

uvicorn re-raises the signal it caught once it has shut down (so that a parent process sees it);
kinetic's shutdown is complete by then, and a stopped server exits 0 instead.

A stop takes no fixed waits: uvicorn looks at its exit flag every 0.1 s and then sleeps 0.1 s more before it
looks at the connections, 0.15 s of every stop on average, where a restart or a test waits for the port. Here the
signal wakes the main loop at once, and the connections and tasks are polled every POLL_S. This leans on
uvicorn.Server's `main_loop`, `on_tick`, `handle_exit`, `shutdown` (whose steps it takes: `servers`,
`server_state`, `lifespan`), `_serve`, `_captured_signals` and `force_exit`, checked against uvicorn 0.55
(tests/e2e/test_faults.py runs a real process through it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from functools import partial
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

BACKSTOP_S = 3.0  # after the streams were ended, how long the stop still waits before it cancels tasks
POLL_S = 0.02  # how often a stop looks at what is still open
TICK_S = 0.1  # uvicorn's tick: the Date header, --limit-max-requests


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, drain_s: float, end_streams: Callable[[], Awaitable[None]],
                 refuse_waiting: Callable[[], None]):
        config.timeout_graceful_shutdown = int(drain_s + BACKSTOP_S + 1)
        super().__init__(config)
        self.drain_s = drain_s
        self.end_streams = end_streams
        self.refuse_waiting = refuse_waiting
        self._wake_main_loop: Callable[[], object] | None = None  # set once the main loop runs

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._wake_main_loop is not None:
            self._wake_main_loop()

    async def main_loop(self) -> None:
        exit_asked = asyncio.Event()
        # a signal handler runs between two steps of the loop: it wakes it the thread-safe way
        self._wake_main_loop = partial(asyncio.get_running_loop().call_soon_threadsafe, exit_asked.set)
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000  # on_tick's count of ticks, as uvicorn keeps it
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await exit_asked.wait()
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.refuse_waiting()
        ender = asyncio.get_running_loop().create_task(self._end_streams_after_drain())
        try:
            await self._close_then_wait(sockets)
        finally:
            ender.cancel()
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _close_then_wait(self, sockets: list[socket.socket] | None) -> None:
        """uvicorn's steps: no new connections, the idle ones closed, the others told to close after their
        response; then wait for them and their tasks, cancelling the tasks left at the graceful timeout."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:
                    await asyncio.sleep(POLL_S)
        except TimeoutError:
            log.error("cancelling %d running task(s): the graceful shutdown's time is up", len(self.server_state.tasks))
            for task in self.server_state.tasks:
                task.cancel(msg="the graceful shutdown's time is up")
        for server in self.servers:
            await server.wait_closed()

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
