"""llama-server's POST /v1/chat/completions/control: the chat completions running now, by the `id` their stream
carries, so that a client may act on one while it reads it (`reasoning_end`: its thinking stops and the answer
begins).

A completion is found by its id among the caller's own: on a keyed server another student's id is "not found",
as a finished one is (llama-server answers both with `success: false`); an open server, like llama-server, lets
anyone act on any. Entries go when their generation is done (pruned as new ones come), so the table holds at
most the completions in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.engine.base import Generation
from kinetic.protocols.openai.types import ControlRequest

REASONING_END = "reasoning_end"  # the one action llama-server knows


@dataclass
class RunningCompletion:
    owner: str | None  # the caller's key name; None on an open server
    generation: Generation
    armed: bool  # the request asked for `reasoning_control`


class RunningCompletions:
    """The server's chat completions in flight, by id (one table for every model: ids are random), kept on
    the app's state by create_app (app_parts)."""

    def __init__(self) -> None:
        self._by_id: dict[str, RunningCompletion] = {}

    def add(self, cmpl_id: str, running: RunningCompletion) -> None:
        self._by_id = {key: entry for key, entry in self._by_id.items() if not entry.generation.done}
        self._by_id[cmpl_id] = running

    def find(self, cmpl_id: str, owner: str | None) -> RunningCompletion | None:
        """The running completion `cmpl_id` of `owner` (None: of anyone)."""
        running = self._by_id.get(cmpl_id)
        if running is None or running.generation.done or (running.owner is not None and running.owner != owner):
            return None
        return running


def control(table: RunningCompletions, body: ControlRequest, owner: str | None) -> dict[str, bool | str]:
    """llama-server's answer: `{"success": true}`, or false with the reason (never an error status)."""
    running = table.find(body.id, owner)
    if running is None:
        return {"success": False, "message": "no active completion for this id"}
    if not running.armed:
        return {"success": False, "message": "reasoning control not enabled for this completion"}
    running.generation.end_reasoning()
    return {"success": True}
