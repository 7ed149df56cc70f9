"""Response streaming shared by every protocol: SSE/NDJSON framing and client-disconnect handling.

A client that goes away must free its slot at once: streams race the body against the ASGI
`http.disconnect` message, and non-streamed generations are raced the same way.

Except a stream sent with `X-Conversation-Id` (llama-server's resumable streams): its generation runs
to its end whether or not its client stays, into a kept buffer (stream_buffers.py) that any later
`GET /v1/stream` replays. Only the header makes a generation outlive its connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from kinetic.classroom.outcome import Outcome
from kinetic.classroom.request_record import caller_of, request_record
from kinetic.engine.base import Generation
from kinetic.engine.types import Event, Finished, TextDelta
from kinetic.errors import ClientDisconnected, KineticError, ServerError
from kinetic.protocols.common.app_parts import installed
from kinetic.protocols.common.sse_ping import PING, with_pings
from kinetic.protocols.common.stream_buffers import StreamBuffer, StreamBuffers

log = logging.getLogger(__name__)
T = TypeVar("T")


# One encoder for every frame: json.dumps builds a new one per call when given options (~0.6 us of a frame's 3.6)
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _compact(data: Any) -> str:
    return _COMPACT.encode(data)


def sse_data(data: Any) -> bytes:
    return f"data: {_compact(data)}\n\n".encode()


def sse_event(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {_compact(data)}\n\n".encode()


def sse_done() -> bytes:
    return b"data: [DONE]\n\n"


def ndjson_line(data: Any) -> bytes:
    return (_compact(data) + "\n").encode()


class Encoder(Protocol):
    @property
    def outcome(self) -> Outcome:
        """What the frames told the client so far: the ledger's record of the answer."""

    def encode(self, event: Event) -> list[bytes]: ...

    def error(self, err: KineticError) -> list[bytes]:
        """The frames for a failure mid-stream, ending the stream as the protocol ends it."""


async def encode_events(generation: Generation, encoder: Encoder) -> AsyncIterator[bytes]:
    """The wire frames of a generation. A failure after the headers went out is sent in-band, in
    the protocol's own error frames, which also end the stream the way that protocol ends."""
    try:
        async for event in generation.events():
            for frame in encoder.encode(event):
                yield frame
    except KineticError as err:
        encoder.outcome.failed(err)
        for frame in encoder.error(err):
            yield frame
    except Exception as exc:  # a bug mid-stream: the client still gets an error and an ending
        log.exception("stream failed")
        generation.cancel()
        failure = ServerError(f"internal error: {type(exc).__name__}")
        encoder.outcome.failed(failure)
        for frame in encoder.error(failure):
            yield frame


STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE = "text/event-stream"
CONVERSATION_ID_HEADER = "X-Conversation-Id"


class DisconnectAwareStreamingResponse(StreamingResponse):
    """A StreamingResponse that stops its body, and so the generation, when the client leaves.

    Starlette only notices a gone client when a write fails, which can be a whole token later or
    never while the model is still evaluating a long prompt; this watches for the disconnect
    message the whole time instead.

    Its status line and headers go out with its first frame, as llama-server sends a stream's (it waits for
    the first result): the client wakes once, for the head and the first token together, not once more
    while the prompt is evaluated (on a tiny model, 1.5 ms of a 10 ms TTFT on two cores).

    `ping_s` > 0 (--sse-ping-interval): a ping after each `ping_s` seconds without a frame, from a task of its own
    that sleeps that long, so that a frame costs no timer (racing each frame against a timeout cost ~10-30 us of
    the event loop a token).
    """

    def __init__(self, frames: AsyncIterator[bytes], *, media_type: str, ping_s: float = -1):
        super().__init__(frames, media_type=media_type, headers=STREAM_HEADERS)
        self.ping_s = ping_s
        self._head: Message | None = {"type": "http.response.start", "status": self.status_code,
                                      "headers": self.raw_headers}
        self._sending = asyncio.Lock()
        self._silent_since = 0.0

    async def _send_frame(self, send: Send, body: bytes | memoryview) -> None:
        async with self._sending:  # the pinger and the frames take turns: a send may wait for the client to read
            if self._head is not None:
                head, self._head = self._head, None
                await send(head)
            await send({"type": "http.response.body", "body": body, "more_body": True})
            self._silent_since = asyncio.get_running_loop().time()

    async def stream_response(self, send: Send) -> None:
        async for chunk in self.body_iterator:
            await self._send_frame(send, chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset))
        async with self._sending:
            if self._head is not None:
                await send(self._head)
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _ping_when_silent(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._silent_since + self.ping_s - loop.time())
            if loop.time() - self._silent_since >= self.ping_s:
                await self._send_frame(send, PING)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The frames are sent from this task and the disconnect watched from another, plain asyncio tasks: an anyio
        # task group cost ~50 us of the event loop before a stream's first frame.
        streaming = asyncio.current_task()
        assert streaming is not None
        client_left = False

        async def watch() -> None:
            nonlocal client_left
            await self.listen_for_disconnect(receive)
            client_left = True
            streaming.cancel()

        self._silent_since = asyncio.get_running_loop().time()
        helpers = [asyncio.ensure_future(watch())]
        if self.ping_s > 0:
            helpers.append(asyncio.ensure_future(self._ping_when_silent(send)))
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not client_left or streaming.uncancel() > 0:  # a shutdown's cancel too: that one goes on
                raise
        except OSError:
            log.debug("client went away during a stream")
        finally:
            for helper in helpers:
                helper.cancel()
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
            await asyncio.gather(*helpers, return_exceptions=True)


def event_stream(frames: AsyncIterator[bytes], media_type: str = SSE, ping_s: float = -1) -> StreamingResponse:
    # never a ping in NDJSON, where a comment is no line
    return DisconnectAwareStreamingResponse(frames, media_type=media_type, ping_s=ping_s if media_type == SSE else -1)


def replay_stream(buffer: StreamBuffer, offset: int) -> StreamingResponse:
    """A kept stream read from byte `offset`, then live until it ends (its pings are kept in it, as
    llama-server keeps them, so offsets count the same bytes). Leaving stops the reading, never the generation."""
    return event_stream(buffer.read_from(offset), SSE)


async def _keep(frames: AsyncIterator[bytes], buffer: StreamBuffer) -> None:
    try:
        async for frame in frames:
            buffer.append(frame)
    finally:
        close = getattr(frames, "aclose", None)
        if close is not None:
            await close()
        buffer.finish()


class KeptStreamResponse(DisconnectAwareStreamingResponse):
    """A stream sent with X-Conversation-Id: the generation writes into its kept buffer, and the client
    reads that buffer live. A client that leaves stops reading; the generation goes on to its end (or to
    DELETE /v1/stream), and the response returns only then, so the request's ledger line holds the
    whole answer, once."""

    def __init__(self, frames: AsyncIterator[bytes], buffer: StreamBuffer):
        super().__init__(buffer.read_from(0), media_type=SSE)
        self.frames = frames
        self.buffer = buffer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        producer = asyncio.ensure_future(_keep(self.frames, self.buffer))
        self.buffer.on_stop(producer.cancel)
        try:
            await super().__call__(scope, receive, send)
        finally:
            await asyncio.gather(producer, return_exceptions=True)


def stream_response(request: Request, frames: AsyncIterator[bytes], media_type: str = SSE) -> StreamingResponse:
    """The frames as the response's body; kept for replay when the request names a conversation (SSE
    streams only, as llama-server keeps them: Ollama's NDJSON is not llama-server's)."""
    conversation_id = request.headers.get(CONVERSATION_ID_HEADER, "")
    ping_s = ping_interval(request)
    if conversation_id and media_type == SSE:
        buffers = installed(request.app, StreamBuffers)
        kept = with_pings(frames, ping_s) if ping_s > 0 else frames
        return KeptStreamResponse(kept, buffers.open(caller_of(request).name, conversation_id))
    return event_stream(frames, media_type, ping_s=ping_s)


@dataclass(frozen=True)
class StreamSettings:
    """What every protocol's streams share, kept on the app's state by create_app (app_parts)."""

    ping_interval_s: float = -1  # --sse-ping-interval (-1: no pings)


def ping_interval(request: Request) -> float:
    return installed(request.app, StreamSettings).ping_interval_s


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Awaits `work`, cancelling it if the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientDisconnected()


async def respond(request: Request, generation: Generation, *, stream: bool, encoder: Encoder,
                  to_body: Callable[[list[TextDelta], Finished], Any],
                  media_type: str = "text/event-stream",
                  render: Callable[[Any], Response] = JSONResponse) -> Response:
    """A generation the way the client asked for it: an event stream (SSE, or NDJSON for Ollama),
    or one body at the end, JSON unless `render` says otherwise (the generation is cancelled if the
    client leaves before then). The encoder's outcome (which `to_body` fills for a whole answer) goes
    to the ledger."""
    request_record(request).add_outcomes(encoder.outcome)
    if stream:
        return stream_response(request, encode_events(generation, encoder), media_type)
    deltas, finished = await until_disconnect(request, generation.result())
    return render(to_body(deltas, finished))


async def merge_frames(streams: list[AsyncIterator[bytes]]) -> AsyncIterator[bytes]:
    """Frames of several streams in the order they come (llama-server streams a list of prompts
    this way, each event carrying its `index`). Closing the merge closes every stream."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def pump(stream: AsyncIterator[bytes]) -> None:
        try:
            async for frame in stream:
                await queue.put(frame)
        finally:
            await queue.put(None)

    tasks = [asyncio.ensure_future(pump(stream)) for stream in streams]
    try:
        remaining = len(tasks)
        while remaining:
            frame = await queue.get()
            if frame is None:
                remaining -= 1
            else:
                yield frame
    finally:
        for task in tasks:
            task.cancel()
        # A pump still inside `async for` holds its stream running: aclose() on it raises
        # RuntimeError. Once the cancelled pumps have finished, each stream is closed or idle.
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()


async def respond_many(request: Request, generations: list[Generation], *, stream: bool, encoders: list[Encoder],
                       to_body: Callable[[int, list[TextDelta], Finished], Any]) -> Response:
    """Several generations answered as one: their events merged into one stream, or a JSON array
    of their bodies in order (all cancelled if the client leaves)."""
    request_record(request).add_outcomes(*(encoder.outcome for encoder in encoders))
    if stream:
        return stream_response(request,
                               merge_frames([encode_events(g, e) for g, e in zip(generations, encoders, strict=False)]))

    async def all_results() -> list[tuple[list[TextDelta], Finished]]:
        try:
            return list(await asyncio.gather(*(g.result() for g in generations)))
        finally:
            for generation in generations:
                generation.cancel()

    results = await until_disconnect(request, all_results())
    return JSONResponse([to_body(i, deltas, finished) for i, (deltas, finished) in enumerate(results)])
