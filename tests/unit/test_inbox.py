"""The decode thread's hand-off to an event loop (kinetic/engine/llama/inbox.py), without a model:
events put from another thread arrive in order, a burst wakes the loop once, a closed loop drops
them, and a loop without `add_reader` gets them through call_soon_threadsafe."""

from __future__ import annotations

import asyncio
import threading
import types
from typing import Any

import pytest

from kinetic.engine.llama import inbox as inbox_module
from kinetic.engine.llama.inbox import LoopInbox, inbox_for


def job() -> Any:
    return types.SimpleNamespace(queue=asyncio.Queue())


async def collect(queue: asyncio.Queue, n: int) -> list[Any]:
    return [await asyncio.wait_for(queue.get(), 5) for _ in range(n)]


def put_from_thread(inbox: LoopInbox, deliveries: list[list[tuple[Any, Any]]]) -> None:
    thread = threading.Thread(target=lambda: [inbox.put(d) for d in deliveries])
    thread.start()
    thread.join()


def test_events_from_another_thread_arrive_in_order() -> None:
    async def main() -> None:
        a, b = job(), job()
        inbox = inbox_for(asyncio.get_running_loop())
        assert inbox_for(asyncio.get_running_loop()) is inbox  # one per loop
        put_from_thread(inbox, [[(a, i), (b, -i)] for i in range(200)])
        assert await collect(a.queue, 200) == list(range(200))
        assert await collect(b.queue, 200) == [-i for i in range(200)]

    asyncio.run(main())


def test_a_burst_wakes_the_loop_once(monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    real_write = inbox_module._write
    assert real_write is not None  # Linux: the GIL-holding write is there

    def counting_write(fd: int, data: bytes, n: int) -> int:
        writes.append(fd)
        return real_write(fd, data, n)

    monkeypatch.setattr(inbox_module, "_write", counting_write)

    async def main() -> None:
        a = job()
        inbox = LoopInbox(asyncio.get_running_loop())
        put_from_thread(inbox, [[(a, i)] for i in range(50)])  # the loop sleeps meanwhile
        assert await collect(a.queue, 50) == list(range(50))
        assert len(writes) == 1
        put_from_thread(inbox, [[(a, "again")]])  # emptied: the next delivery wakes it again
        assert await collect(a.queue, 1) == ["again"] and len(writes) == 2

    asyncio.run(main())


def test_a_closed_loop_drops_what_arrives() -> None:
    loop = asyncio.new_event_loop()
    inbox = LoopInbox(loop)
    loop.close()
    a = job()
    inbox.put([(a, 1)])  # must neither raise nor keep the event
    assert not inbox._deliveries


def test_without_add_reader_events_go_through_call_soon_threadsafe(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()

        def no_readers(*args: Any) -> None:
            raise NotImplementedError  # what a Windows (proactor) loop says

        monkeypatch.setattr(loop, "add_reader", no_readers)
        a = job()
        inbox = LoopInbox(loop)
        assert inbox._write_fd < 0
        put_from_thread(inbox, [[(a, i)] for i in range(10)])
        assert await collect(a.queue, 10) == list(range(10))

    asyncio.run(main())
