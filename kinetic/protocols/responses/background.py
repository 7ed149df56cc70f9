"""Background responses (`background: true`): the request is answered at once with a `queued` response, and the
generation goes on without the connection, queued like any request (its key's fair share, its limits); the
stored response says `in_progress` until it is `completed`, `failed`, or `cancelled` (POST .../cancel ends it
within a second). Its counts reach the ledger and the budgets when it ends, under the key that asked."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from kinetic.classroom.outcome import ErrorTold
from kinetic.engine.base import Generation
from kinetic.errors import KineticError

Ended = Callable[[str, dict[str, Any] | None, ErrorTold | None, float], None]  # status, body, error, started


class BackgroundRuns:
    """The background responses running now, by id; shutdown cancels what is left."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, response_id: str, generation: Generation, finish: Callable[[Any, Any], dict[str, Any]],
              ended: Ended) -> None:
        """Runs `generation` to its end: `finish(deltas, finished)` makes the response, `ended` keeps it."""
        task = asyncio.get_running_loop().create_task(self._run(generation, finish, ended))
        self._tasks[response_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(response_id, None))

    @staticmethod
    async def _run(generation: Generation, finish: Callable[[Any, Any], dict[str, Any]], ended: Ended) -> None:
        started = time.monotonic()
        try:
            deltas, finished = await generation.result()
        except asyncio.CancelledError:
            ended("cancelled", None, ErrorTold("cancelled", "the response was cancelled"), started)
            raise
        except KineticError as err:
            ended("failed", None, ErrorTold(err.kind, err.message), started)
            return
        ended("completed", finish(deltas, finished), None, started)

    def running(self, response_id: str) -> bool:
        return response_id in self._tasks

    async def cancel(self, response_id: str) -> None:
        """Ends the run now; its generation gives its slot back."""
        task = self._tasks.get(response_id)
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def cancel_all(self) -> None:
        await asyncio.gather(*(self.cancel(response_id) for response_id in list(self._tasks)))
