"""GET /models/sse: the router's model state changes, streamed to whoever listens (llama-server's
router has the same route; its web UI shows models loading and unloading with it).

Each change is one SSE `data:` line in llama-server's shape: `{"model": NAME, "event": EVENT, "data":
{...}}`, with EVENT `model_status` when a load starts, then `status_change` for each state the model
enters (`loading`, `loaded`, `unloaded` with an `exit_code`: 0 for an unload, 1 for a failed load);
a download (downloads.py) adds `download_progress`, `download_finished`, `download_failed`, and a removed
model `model_remove`.
A listener that reads too slowly is not waited for: its line holds every event until it reads them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any


class ModelEvents:
    def __init__(self) -> None:
        self._listeners: set[asyncio.Queue[dict[str, Any] | None]] = set()

    def publish(self, model: str, event: str, data: dict[str, Any]) -> None:
        """From the event loop (the registry's loads and unloads run there)."""
        message = {"model": model, "event": event, "data": data}
        for queue in self._listeners:
            queue.put_nowait(message)

    def status(self, model: str, status: str, **extra: Any) -> None:
        self.publish(model, "status_change", {"status": status, **extra})

    def subscribe(self) -> AsyncGenerator[dict[str, Any], None]:
        """A new listener's events. It listens from this call on (not from the first read), so no
        event between the call and the first read is lost."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._listeners.add(queue)

        async def messages() -> AsyncGenerator[dict[str, Any], None]:
            try:
                while (message := await queue.get()) is not None:
                    yield message
            finally:
                self._listeners.discard(queue)

        return messages()

    def stream(self) -> AsyncIterator[str]:
        """A new listener's SSE lines (listening from this call on, as subscribe())."""
        messages = self.subscribe()

        async def lines() -> AsyncIterator[str]:
            async for message in messages:
                yield f"data: {json.dumps(message, separators=(',', ':'))}\n\n"

        return lines()

    def close(self) -> None:
        """Shutdown: every listener's stream ends (None is the end of a queue)."""
        for queue in self._listeners:
            queue.put_nowait(None)

    @property
    def listeners(self) -> int:
        return len(self._listeners)
