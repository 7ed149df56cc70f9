"""The decode thread's hand-off to an event loop (kinetic/engine/llama/inbox.py), without a model:
events put from another thread arrive in order, a burst wakes the loop once, a closed loop drops
them, a loop without `add_reader` gets them through call_soon_threadsafe, and a step that holds a
request's first text waits for its consumer to have handled it (no longer than the cap)."""

from __future__ import annotations

import asyncio
import threading
import time
import types
from typing import Any

import pytest

from kinetic.engine.base import Generation
from kinetic.engine.llama import inbox as inbox_module
from kinetic.engine.llama.inbox import LoopInbox, deliver_step, inbox_for
from kinetic.engine.types import TextDelta


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


def text_job() -> Any:
    return types.SimpleNamespace(queue=asyncio.Queue(), inbox=inbox_for(asyncio.get_running_loop()),
                                 first_text_out=False, first_text_handled=threading.Event())


def test_a_step_with_a_first_text_waits_until_the_consumer_has_handled_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # the cap is long: only the consumer's coming back ends the wait
    monkeypatch.setattr(inbox_module, "FIRST_TEXT_WAIT_S", 30.0)
    order: list[str] = []

    async def main() -> None:
        a = text_job()
        generation = Generation(a.queue, cancel=lambda: None, first_text_handled=a.first_text_handled.set)
        text = TextDelta(text="x", token_id=1)

        def decode_thread() -> None:
            deliver_step([(a, text)])
            order.append("next step")
            deliver_step([(a, TextDelta(text="y", token_id=2))])

        thread = threading.Thread(target=decode_thread)
        thread.start()
        async for event in generation.events():
            assert isinstance(event, TextDelta)
            order.append(f"sent {event.text}")
            await asyncio.sleep(0.05)  # the write; the decode thread must still be waiting
            if event.text == "y":
                break
        await asyncio.to_thread(thread.join)

    asyncio.run(main())
    assert order == ["sent x", "next step", "sent y"]


def test_a_first_text_nobody_takes_holds_the_step_no_longer_than_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbox_module, "FIRST_TEXT_WAIT_S", 0.05)

    async def main() -> tuple[float, float]:
        a = text_job()
        started = time.monotonic()
        await asyncio.to_thread(deliver_step, [(a, TextDelta(text="x", token_id=1))])
        first = time.monotonic() - started
        started = time.monotonic()
        await asyncio.to_thread(deliver_step, [(a, TextDelta(text="y", token_id=2))])  # not its first: no wait
        return first, time.monotonic() - started

    first, second = asyncio.run(main())
    assert 0.05 <= first < 5 and second < 0.05
