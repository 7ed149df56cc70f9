"""Resumable streams (llama-server's `X-Conversation-Id`): the bytes of a stream kept after its client left.

A streamed answer sent with the header writes its SSE bytes into a `StreamBuffer`, kept here under the
conversation id; the client that started it, or a later one (the page reloaded, the laptop woke up), reads
them from any byte offset and then follows the live tail (`GET /v1/stream`, llamacpp/stream_routes.py).

Bounds, so that a class cannot fill the server's memory with streams nobody reads:
- a stream keeps its last MAX_STREAM_BYTES (4 MiB, llama-server's `STREAM_SESSION_MAX_BYTES`); older bytes are
  dropped from the front, and a read from before them is refused ("offset lost"), as llama-server refuses it;
- a finished stream is kept KEEP_FINISHED_S (300 s, llama-server's `STREAM_SESSION_TTL_SECONDS`) after its end.
  llama-server sweeps every 60 s; here every call on the registry sweeps first, so an expired stream is never
  answered;
- at most MAX_STREAMS (256) are kept at once; llama-server has no such cap. When full, the oldest finished one
  goes, else the oldest live one is stopped, as a new stream on the same id stops the one before it.

A conversation id belongs to its owner: the key's name on a keyed server (`Caller.name`), None on an open
one. Each owner has ids of its own, so one student can neither read, stop nor replace another's stream.

Everything here runs on the event loop thread: no locks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field

MAX_STREAM_BYTES = 4 * 1024 * 1024
KEEP_FINISHED_S = 300.0
MAX_STREAMS = 256

Owner = str | None


class OffsetLost(Exception):
    """A read from a byte offset the stream has already dropped."""


@dataclass(eq=False)
class StreamBuffer:
    """One kept stream: its bytes (the last `cap` of them), whether it ended, and who started it."""

    owner: Owner
    conversation_id: str
    cap: int = MAX_STREAM_BYTES
    clock: Callable[[], float] = time.time
    started_at: float = field(default_factory=time.time)  # unix seconds, as llama-server's lookup tells them
    completed_at: float | None = None
    cancelled: bool = False
    _kept: bytearray = field(default_factory=bytearray)
    _dropped: int = 0  # bytes dropped from the front to keep within `cap`
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _stop_producer: Callable[[], object] | None = None

    @property
    def done(self) -> bool:
        return self.completed_at is not None

    @property
    def total_bytes(self) -> int:
        """Every byte that entered the stream, the dropped ones included: where the next byte's offset starts."""
        return self._dropped + len(self._kept)

    @property
    def dropped_bytes(self) -> int:
        return self._dropped

    def append(self, data: bytes) -> None:
        if self.done or not data:
            return
        self._kept += data
        excess = len(self._kept) - self.cap
        if excess > 0:
            del self._kept[:excess]
            self._dropped += excess
        self._wake()

    def finish(self) -> None:
        if not self.done:
            self.completed_at = self.clock()
            self._wake()

    def on_stop(self, stop_producer: Callable[[], object]) -> None:
        """How `stop` ends the generation that writes here (the producer task's cancel)."""
        self._stop_producer = stop_producer

    def stop(self) -> None:
        """Ends the stream and the generation behind it: DELETE /v1/stream, or a newer stream on its id."""
        self.cancelled = True
        if self._stop_producer is not None:
            self._stop_producer()
        self.finish()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def read_from(self, offset: int) -> AsyncIterator[bytes]:
        """The bytes from `offset` on, as they are kept and then as they come, until the stream ends."""
        if offset < self._dropped:
            raise OffsetLost(offset)
        while True:
            if offset < self._dropped:  # the reader fell behind by more than the cap: its bytes are gone
                return
            end = self.total_bytes
            if offset < end:
                chunk = bytes(self._kept[offset - self._dropped:])
                offset = end
                yield chunk
                continue
            if self.done:
                return
            await self._changed.wait()


def _key(owner: Owner, conversation_id: str) -> tuple[Owner, str]:
    return owner, conversation_id


class StreamBuffers:
    """Every kept stream, by owner and conversation id (one live stream per id, as in llama-server)."""

    def __init__(self, *, max_streams: int = MAX_STREAMS, max_stream_bytes: int = MAX_STREAM_BYTES,
                 keep_finished_s: float = KEEP_FINISHED_S, clock: Callable[[], float] = time.time):
        self.max_streams = max_streams
        self.max_stream_bytes = max_stream_bytes
        self.keep_finished_s = keep_finished_s
        self._clock = clock
        self._streams: dict[tuple[Owner, str], StreamBuffer] = {}

    def __len__(self) -> int:
        self._sweep()
        return len(self._streams)

    def open(self, owner: Owner, conversation_id: str) -> StreamBuffer:
        """A new stream on the id, stopping the one it had (a client that sent the same id again)."""
        self._sweep()
        previous = self._streams.pop(_key(owner, conversation_id), None)
        if previous is not None:
            previous.stop()
        while len(self._streams) >= self.max_streams:
            self._evict_oldest()
        buffer = StreamBuffer(owner, conversation_id, cap=self.max_stream_bytes, clock=self._clock,
                              started_at=self._clock())
        self._streams[_key(owner, conversation_id)] = buffer
        return buffer

    def get(self, owner: Owner, conversation_id: str) -> StreamBuffer | None:
        self._sweep()
        return self._streams.get(_key(owner, conversation_id))

    def stop(self, owner: Owner, conversation_id: str) -> bool:
        """Stops the stream and forgets it; False when the owner has none on that id."""
        self._sweep()
        buffer = self._streams.pop(_key(owner, conversation_id), None)
        if buffer is None:
            return False
        buffer.stop()
        return True

    def lookup(self, owner: Owner, conversation_ids: Iterable[str]) -> list[StreamBuffer]:
        """The owner's streams on these ids, each id matching itself and its per-model variants
        (`ID::MODEL`, the ids llama-server's web UI sends in router mode); nothing is ever listed unasked."""
        self._sweep()
        found: list[StreamBuffer] = []
        for wanted in conversation_ids:
            for (stream_owner, conversation_id), buffer in self._streams.items():
                if stream_owner == owner and (conversation_id == wanted or conversation_id.startswith(wanted + "::")):
                    found.append(buffer)
        return found

    def stop_all(self) -> None:
        """Every stream ended and forgotten (the server shutting down): no reader waits on."""
        streams, self._streams = list(self._streams.values()), {}
        for buffer in streams:
            buffer.stop()

    def _sweep(self) -> None:
        cutoff = self._clock() - self.keep_finished_s
        expired = [key for key, buffer in self._streams.items()
                   if buffer.completed_at is not None and buffer.completed_at <= cutoff]
        for key in expired:
            del self._streams[key]

    def _evict_oldest(self) -> None:
        finished = [(key, b) for key, b in self._streams.items() if b.done]
        key, buffer = min(finished or self._streams.items(), key=lambda item: item[1].started_at)
        del self._streams[key]
        buffer.stop()
