"""The kept streams of X-Conversation-Id (kinetic/protocols/common/stream_buffers.py): their bounds in bytes,
time and number, replay from an offset then live, and ids that belong to their owner."""

from __future__ import annotations

import asyncio

import pytest

from kinetic.protocols.common.stream_buffers import OffsetLost, StreamBuffer, StreamBuffers


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def read_all(buffer: StreamBuffer, offset: int) -> bytes:
    return b"".join([chunk async for chunk in buffer.read_from(offset)])


def test_a_stream_keeps_its_last_bytes_and_refuses_a_read_before_them() -> None:
    buffer = StreamBuffer("alice", "c", cap=10)
    buffer.append(b"0123456789")
    buffer.append(b"abcd")
    buffer.finish()
    assert (buffer.total_bytes, buffer.dropped_bytes) == (14, 4)
    assert asyncio.run(read_all(buffer, 4)) == b"456789abcd"
    assert asyncio.run(read_all(buffer, 12)) == b"cd"
    with pytest.raises(OffsetLost):
        asyncio.run(read_all(buffer, 3))
    buffer.append(b"late")  # nothing enters a finished stream
    assert buffer.total_bytes == 14


def test_a_chunk_larger_than_the_cap_keeps_its_tail() -> None:
    buffer = StreamBuffer(None, "c", cap=4)
    buffer.append(b"abcdefgh")
    buffer.finish()
    assert asyncio.run(read_all(buffer, 4)) == b"efgh"


def test_a_reader_follows_the_live_stream_to_its_end() -> None:
    async def main() -> bytes:
        buffer = StreamBuffer(None, "c")
        buffer.append(b"one ")
        reader = asyncio.ensure_future(read_all(buffer, 0))
        await asyncio.sleep(0)
        for word in (b"two ", b"three"):
            buffer.append(word)
            await asyncio.sleep(0)
        assert not reader.done()  # still waiting: the stream has not ended
        buffer.finish()
        return await asyncio.wait_for(reader, 1)

    assert asyncio.run(main()) == b"one two three"


def test_a_finished_stream_expires_after_its_keep_time() -> None:
    clock = Clock()
    buffers = StreamBuffers(keep_finished_s=300, clock=clock)
    live, finished = buffers.open(None, "live"), buffers.open(None, "done")
    finished.finish()
    clock.now += 299
    assert buffers.get(None, "done") is finished
    clock.now += 1
    assert buffers.get(None, "done") is None
    assert buffers.get(None, "live") is live  # a live stream never expires


def test_the_number_of_streams_is_bounded_finished_ones_going_first() -> None:
    clock = Clock()
    buffers = StreamBuffers(max_streams=2, clock=clock)
    oldest_live = buffers.open(None, "a")
    clock.now += 1
    finished = buffers.open(None, "b")
    finished.finish()
    clock.now += 1
    buffers.open(None, "c")
    assert buffers.get(None, "b") is None and buffers.get(None, "a") is oldest_live
    clock.now += 1
    stopped: list[bool] = []
    oldest_live.on_stop(lambda: stopped.append(True))
    buffers.open(None, "d")  # none finished: the oldest live one is stopped
    assert buffers.get(None, "a") is None and stopped == [True] and oldest_live.cancelled
    assert len(buffers) == 2


def test_a_new_stream_on_an_id_stops_the_one_before() -> None:
    buffers = StreamBuffers()
    first = buffers.open("alice", "c")
    second = buffers.open("alice", "c")
    assert first.cancelled and first.done and not second.done
    assert buffers.get("alice", "c") is second


def test_ids_belong_to_their_owner() -> None:
    buffers = StreamBuffers()
    alices = buffers.open("alice", "c")
    bobs = buffers.open("bob", "c")  # the same id, bob's own: alice's goes on
    assert not alices.cancelled
    assert buffers.get("alice", "c") is alices and buffers.get("bob", "c") is bobs
    assert buffers.stop("carol", "c") is False and not alices.cancelled
    assert buffers.lookup("carol", ["c"]) == []
    assert buffers.stop("alice", "c") is True and alices.cancelled and not bobs.cancelled
    assert buffers.get("alice", "c") is None


def test_lookup_matches_an_id_and_its_per_model_variants_only_when_asked() -> None:
    buffers = StreamBuffers()
    plain, variant = buffers.open(None, "conv"), buffers.open(None, "conv::org/model:Q8_0")
    buffers.open(None, "conversation")
    assert buffers.lookup(None, ["conv"]) == [plain, variant]
    assert buffers.lookup(None, []) == []
