"""A stream's status line and headers go out with its first frame (protocols/common/streaming.py), as llama-server
sends a stream's once its first result is there: the client wakes once for both, not once more while the prompt
is evaluated. Without a model: the response is called as an ASGI app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.types import Message

from kinetic.protocols.common.sse_ping import PING
from kinetic.protocols.common.streaming import SSE, event_stream


def sent_by(frames: AsyncIterator[bytes], *, ping_s: float = -1, log: list[str] | None = None) -> list[str]:
    log = [] if log is None else log

    async def main() -> None:
        response = event_stream(frames, SSE, ping_s=ping_s)
        disconnected = asyncio.Event()

        async def receive() -> Message:
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                log.append(f"head {message['status']}")
            elif message.get("body"):
                log.append(message["body"].decode())
            elif not message.get("more_body", False):
                log.append("end")

        await response({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}, receive, send)

    asyncio.run(main())
    return log


def test_the_head_waits_for_the_first_frame() -> None:
    log: list[str] = []

    async def frames() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.05)  # the prompt
        log.append("first frame ready")
        yield b"data: 1\n\n"
        yield b"data: 2\n\n"

    sent_by(frames(), log=log)
    assert log == ["first frame ready", "head 200", "data: 1\n\n", "data: 2\n\n", "end"]


def test_a_stream_with_no_frame_still_gets_its_head() -> None:
    async def frames() -> AsyncIterator[bytes]:
        return
        yield b""  # an async generator that yields nothing

    assert sent_by(frames()) == ["head 200", "end"]


def test_a_ping_sends_the_head_of_a_stream_still_waiting() -> None:
    async def frames() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.25)  # waiting for a slot: the pings keep the client's read timeout at bay
        yield b"data: 1\n\n"

    sent = sent_by(frames(), ping_s=0.1)
    assert sent[:2] == ["head 200", PING.decode()] and sent[-2:] == ["data: 1\n\n", "end"]


def test_a_stream_silent_between_frames_gets_pings_and_a_busy_one_none() -> None:
    async def frames(gaps: list[float]) -> AsyncIterator[bytes]:
        for index, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            yield f"data: {index}\n\n".encode()

    sent = sent_by(frames([0.0, 0.35, 0.0]), ping_s=0.1)
    pings = sent.count(PING.decode())
    assert sent[:2] == ["head 200", "data: 0\n\n"] and sent[-3:] == ["data: 1\n\n", "data: 2\n\n", "end"]
    assert 2 <= pings <= 4 and sent[2:2 + pings] == [PING.decode()] * pings
    assert PING.decode() not in sent_by(frames([0.0] * 20), ping_s=0.1)
