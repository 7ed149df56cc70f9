"""Background responses without a model: a run that finishes hands its result on as `completed`, an engine
error as `failed`, and a cancel ends a run that is waiting at once, as `cancelled`, its generation cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

from kinetic.classroom.outcome import ErrorTold
from kinetic.engine.base import Generation
from kinetic.engine.types import Event, TextDelta
from kinetic.errors import ServerError
from kinetic.protocols.responses.background import BackgroundRuns
from tests.unit.test_responses_translate import finished


def generation() -> tuple[asyncio.Queue[Event | BaseException], list[bool], Generation]:
    queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()
    cancelled: list[bool] = []
    return queue, cancelled, Generation(queue, lambda: cancelled.append(True))


def test_runs_end_completed_failed_or_cancelled() -> None:
    async def scenario() -> list[tuple[str, Any, ErrorTold | None]]:
        runs = BackgroundRuns()
        endings: list[tuple[str, Any, ErrorTold | None]] = []

        def ended(status: str, body: Any, error: ErrorTold | None, started: float) -> None:
            endings.append((status, body, error))

        done_queue, _, done = generation()
        runs.start("resp_done", done, lambda deltas, end: {"text": "".join(d.text for d in deltas)}, ended)
        done_queue.put_nowait(TextDelta("Hi", token_id=1))
        done_queue.put_nowait(finished("Hi"))
        failing_queue, _, failing = generation()
        runs.start("resp_failed", failing, lambda deltas, end: {}, ended)
        failing_queue.put_nowait(ServerError("the model was unloaded"))
        _, cancelled, waiting = generation()
        runs.start("resp_waiting", waiting, lambda deltas, end: {}, ended)
        await asyncio.sleep(0.01)
        assert runs.running("resp_waiting") and not runs.running("resp_done")
        await runs.cancel("resp_waiting")
        assert cancelled == [True] and not runs.running("resp_waiting")
        return endings

    endings = asyncio.run(scenario())
    assert ("completed", {"text": "Hi"}, None) in endings
    assert ("failed", None, ErrorTold("server_error", "the model was unloaded")) in endings
    assert ("cancelled", None, ErrorTold("cancelled", "the response was cancelled")) in endings
