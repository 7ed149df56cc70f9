"""kinetic.server.shutdown's stop without fixed waits: the signal wakes uvicorn's main loop at once (not at its
next tick: the tick is set to a minute here, so a loop that waited for it would run into the test's timeout), and
the stop waits for what is still open, then shuts the app down."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest
import uvicorn

from kinetic.server import shutdown
from kinetic.server.shutdown import DrainingServer


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:  # never called: no request is made
    raise AssertionError(scope)


def _server(steps: list[str]) -> DrainingServer:
    async def end_streams() -> None:
        steps.append("streams ended")

    config = uvicorn.Config(_app, lifespan="off", log_level="warning")
    config.load()
    return DrainingServer(config, drain_s=1.0, end_streams=end_streams, refuse_waiting=lambda: steps.append("refused"))


def test_a_signal_wakes_the_main_loop_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutdown, "TICK_S", 60.0)
    server = _server([])

    async def stop_soon() -> None:
        loop_task = asyncio.create_task(server.main_loop())
        await asyncio.sleep(0.05)  # the loop is waiting for its next tick
        server.handle_exit(signal.SIGTERM, None)
        await asyncio.wait_for(loop_task, timeout=5)

    asyncio.run(stop_soon())
    assert server.should_exit and server._captured_signals == [signal.SIGTERM]


def test_a_stop_waits_for_the_open_connection_then_runs_the_lifespan_shutdown() -> None:
    steps: list[str] = []
    server = _server(steps)

    class Connection:
        def shutdown(self) -> None:  # told to close after its response, which takes a moment
            steps.append("connection told")
            asyncio.get_running_loop().call_later(0.1, self.closed)

        def closed(self) -> None:
            steps.append("connection closed")
            server.server_state.connections.discard(self)  # type: ignore[arg-type]

    class Lifespan:
        async def shutdown(self) -> None:
            steps.append("lifespan")

    server.lifespan = Lifespan()  # type: ignore[assignment]
    server.servers = []
    server.server_state.connections.add(Connection())  # type: ignore[arg-type]
    asyncio.run(asyncio.wait_for(server.shutdown(), timeout=5))
    # the waiting were refused first; the connection closed within the drain time, so no stream was ended
    assert steps == ["refused", "connection told", "connection closed", "lifespan"]
