"""--sse-ping-interval N: an SSE comment (`:` and a blank line) whenever a stream stays silent for N seconds, as
llama-server sends one, so that a client with a read timeout (undici's, a proxy's) keeps a stream open while its
request waits for a slot or a long prompt is evaluated. Clients skip comment lines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

PING = b":\n\n"


async def with_pings(frames: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    """`frames` as they come, with a ping after each `interval` seconds without one. Closing this closes them.
    A kept stream's pings (its buffer keeps them, as llama-server's does); a live stream's response sends its own
    from one task (streaming.py), which costs a frame nothing, where this races every frame against a timeout."""
    iterator = frames.__aiter__()
    pending: asyncio.Future[bytes] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield PING
                continue
            try:
                frame = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield frame
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        close = getattr(frames, "aclose", None)
        if close is not None:
            await close()
