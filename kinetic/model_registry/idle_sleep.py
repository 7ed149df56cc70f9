"""--sleep-idle-seconds N: a loaded model that served nothing for N seconds is unloaded, and the next request
that needs it loads it again and waits for the load, as llama-server's server_queue sleeps.

While asleep the model still answers what llama-server answers from its cache without waking: /health,
/props (with `is_sleeping: true`), /v1/models and /metrics. Every other route of the model wakes it. The
engine does the unloading and loading (LlamaEngine.sleep and wake); this module decides when, and makes
sure a request never meets a model half asleep: falling asleep and waking take one lock, and a request
that arrives meanwhile waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from kinetic.backends.base import Sleeping

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kinetic.model_registry.entry import ModelEntry

log = logging.getLogger(__name__)

MAX_POLL_S = 1.0  # how often the watch looks at the models (at most; a short N looks more often)


def can_sleep(entry: ModelEntry) -> bool:
    """A loaded model whose backend has the Sleeping role (an upstream model has nothing to unload)."""
    return isinstance(entry.backend, Sleeping)


class IdleSleep:
    def __init__(self, entries: Mapping[str, ModelEntry], seconds: float):
        self.entries = entries  # the registry's own dict: a model added later is watched too
        self.seconds = seconds
        self._turn = asyncio.Lock()  # one fall asleep or wake-up at a time

    async def watch(self) -> None:
        """Runs for the server's life (a task of the app's lifespan)."""
        for entry in self.entries.values():
            entry.touch()  # llama-server counts the idle time from its start
        while True:
            await asyncio.sleep(min(MAX_POLL_S, self.seconds / 4))
            for entry in list(self.entries.values()):
                if not can_sleep(entry) or entry.sleeping:
                    continue
                if entry.backend is not None and not entry.backend.ready:
                    entry.touch()  # still loading: its idle time starts once it is loaded
                elif self._idle(entry):
                    try:
                        await self.fall_asleep(entry)
                    except Exception:  # the watch goes on for the other models and the next round
                        log.exception("model %s could not enter sleeping state", entry.name)

    def _idle(self, entry: ModelEntry) -> bool:
        backend = entry.backend
        return (backend is not None and backend.ready and entry.leases == 0 and not entry.busy
                and time.monotonic() - entry.last_used >= self.seconds)

    async def fall_asleep(self, entry: ModelEntry) -> None:
        async with self._turn:
            backend = entry.backend
            # looked at again under the lock, with no await in between: a request that took the model
            # since then keeps it awake
            if not isinstance(backend, Sleeping) or entry.sleeping or not self._idle(entry):
                return
            log.info("model %s: idle for %gs, entering sleeping state (unloaded until the next request)",
                     entry.name, self.seconds)
            await backend.sleep()

    async def awake(self, entry: ModelEntry) -> None:
        """Returns once the model is not asleep (loading it again if it was); a request calls it first."""
        if not entry.sleeping and not self._turn.locked():
            return
        async with self._turn:
            backend = entry.backend
            if not isinstance(backend, Sleeping) or not entry.sleeping:
                return
            log.info("model %s: a request arrived, exiting sleeping state (loading)", entry.name)
            await backend.wake()
            entry.touch()


@asynccontextmanager
async def watching(sleeper: IdleSleep | None) -> AsyncIterator[None]:
    """The app's lifespan: the watch runs while the server does (nothing to do without the flag)."""
    task = asyncio.create_task(sleeper.watch()) if sleeper is not None else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()
