"""The idle decode thread's wait for requests sent together (admission.GATHER_S), without a model: it
waits while a request is still being prepared, never once a slot is generating, and never past the cap; a
request counts at the door until its route has queued it."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
from starlette.types import Message, Receive, Scope, Send

from kinetic.classroom.ledger import LedgerMiddleware
from kinetic.classroom.request_record import request_record
from kinetic.engine.llama import admission as admission_module
from kinetic.engine.llama.admission import SlotAdmission
from kinetic.scheduling.arrivals import DOOR_SCOPE_KEY, Arrivals

LONG = 30.0  # a cap no test waits out unless the wait is wrong


class Admission(SlotAdmission):
    def __init__(self, busy: bool) -> None:
        self._cv = threading.Condition()
        self._preparing = 0
        self._stopping = False
        self.slots = [SimpleNamespace(job=object() if busy else None), SimpleNamespace(job=None)]  # type: ignore[list-item]


def gather_time(admission: Admission) -> float:
    started = time.monotonic()
    with admission._cv:
        admission._gather()
    return time.monotonic() - started


def test_the_first_request_waits_until_the_others_are_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_module, "GATHER_S", LONG)
    admission = Admission(busy=False)
    admission.preparing(3)
    done: list[float] = []
    waiter = threading.Thread(target=lambda: done.append(gather_time(admission)))
    waiter.start()
    admission.preparing(-1)
    admission.preparing(-2)  # the last one queued: the wait ends
    waiter.join(timeout=LONG)
    assert done and done[0] < LONG
    assert admission._preparing == 0


def test_no_wait_with_nothing_in_preparation_or_a_slot_generating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_module, "GATHER_S", LONG)
    assert gather_time(Admission(busy=False)) < LONG
    busy = Admission(busy=True)
    busy.preparing(1)
    # a generating slot's streams must not stall: the new request joins the next step
    assert gather_time(busy) < LONG


def test_the_wait_ends_at_the_cap_when_a_request_never_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_module, "GATHER_S", 0.05)
    admission = Admission(busy=False)
    admission.preparing(1)
    assert 0.05 <= gather_time(admission) < LONG


def test_a_request_at_the_door_keeps_an_idle_scheduler_waiting_until_it_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admission_module, "GATHER_S", LONG)
    door = Arrivals()
    monkeypatch.setattr(admission_module, "DOOR", door)
    admission = Admission(busy=False)
    admission._gathering = False
    door.subscribe(admission._arrival_left)
    leave = door.arrive()  # parsed by the event loop, not yet prepared
    done: list[float] = []
    waiter = threading.Thread(target=lambda: done.append(gather_time(admission)))
    waiter.start()
    time.sleep(0.05)
    assert not done  # still waiting for it
    leave()
    waiter.join(timeout=LONG)
    assert done and done[0] < LONG
    leave()  # its answer starts, then it ends: counted out once
    assert door.count == 0


def test_the_door_counts_each_request_out_once_and_tells_its_listeners() -> None:
    door = Arrivals()
    heard: list[int] = []
    door.subscribe(lambda: heard.append(door.count))
    first, second = door.arrive(), door.arrive()
    assert door.count == 2
    first()
    first()
    second()
    assert door.count == 0 and heard == [1, 0]


def test_a_prepared_request_stays_at_the_door_until_its_route_lets_the_loop_go() -> None:
    # Counted out at once, a scheduler that looked between "prepared" and the route's queueing started without it.
    door = Arrivals()
    seen: list[tuple[str, int]] = []

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        request_record(scope).note_prepared()
        seen.append(("prepared", door.count))  # the route goes on to queue it, without a pause
        await asyncio.sleep(0)
        seen.append(("after the route's first pause", door.count))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def main() -> None:
        middleware = LedgerMiddleware(route, keyed=False)
        # counted in by the transport as its head was read (transport.py)
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "query_string": b"",
                 DOOR_SCOPE_KEY: door.arrive()}

        async def receive() -> Message:
            return {"type": "http.request", "body": b"{}"}

        async def send(message: Message) -> None:
            pass

        await middleware(scope, receive, send)

    asyncio.run(main())
    assert seen == [("prepared", 1), ("after the route's first pause", 0)]
    assert door.count == 0
