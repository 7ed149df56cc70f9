"""Resumable streams (`X-Conversation-Id`) whose request still waits for its model in a router, as
llama-server's router tracks them: while the model loads, `GET /v1/stream` for the id answers 503 (retry
later: the kept stream appears once the load ends) and `DELETE /v1/stream` cancels the waiting request,
which gets a 400, instead of leaving a generation nobody will read. Keyed by owner (the key's name, None
on an open server) and id, as the kept streams are (protocols/common/stream_buffers.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from kinetic.errors import InvalidRequestError

T = TypeVar("T")
Owner = str | None


@dataclass
class _Waiting:
    task: asyncio.Future[Any]
    stopped: bool = False


class WaitingStreams:
    def __init__(self) -> None:
        self._waiting: dict[tuple[Owner, str], _Waiting] = {}

    def waiting(self, owner: Owner, conversation_id: str) -> bool:
        return (owner, conversation_id) in self._waiting

    def stop(self, owner: Owner, conversation_id: str) -> bool:
        """Cancels the request waiting under that id; False when none waits."""
        waiting = self._waiting.pop((owner, conversation_id), None)
        if waiting is None:
            return False
        waiting.stopped = True
        waiting.task.cancel()
        return True

    async def wait(self, owner: Owner, conversation_id: str, acquiring: Awaitable[T]) -> T:
        """`acquiring` awaited under the id (a later request on the same id takes it over); a stop meanwhile
        cancels it (what it held is given back as on any cancel) and raises the 400 llama-server answers."""
        key = (owner, conversation_id)
        task: asyncio.Future[T] = asyncio.ensure_future(acquiring)
        waiting = _Waiting(task)
        self._waiting[key] = waiting
        try:
            return await task
        except asyncio.CancelledError:
            if waiting.stopped:
                raise InvalidRequestError("request cancelled by a stop while the model was loading") from None
            raise
        finally:
            if self._waiting.get(key) is waiting:
                del self._waiting[key]
