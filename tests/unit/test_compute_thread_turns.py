"""The compute thread's turns (compute_thread.py), with plain members that count: busy members alternate, a
member with nothing to do gets no turn, a failing turn stops nothing, and CallsOnly runs calls on the thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from kinetic.engine.llama.compute_thread import THREAD_NAME, CallsOnly, ComputeThread
from kinetic.errors import UnavailableError


class Counting:
    """A member with `left` turns to take; each turn appends its name to `order`."""

    def __init__(self, thread: ComputeThread, name: str, left: int, order: list[str], *, fail: bool = False):
        self.thread, self.name, self.left, self.order, self.fail = thread, name, left, order, fail
        self.done = threading.Event()

    def has_work(self) -> bool:
        return self.left > 0

    def take_turn(self) -> Callable[[], None]:
        self.left -= 1

        def turn() -> None:
            self.order.append(self.name)
            if self.left == 0:
                self.done.set()
            if self.fail:
                raise RuntimeError("a broken turn")
        return turn


def test_busy_members_alternate_and_an_idle_one_gets_no_turn() -> None:
    thread, order = ComputeThread(), list[str]()
    idle = Counting(thread, "idle", 0, order)
    first, second = Counting(thread, "a", 3, order), Counting(thread, "b", 3, order)
    with thread.cv:  # both join before either takes a turn
        for member in (idle, first, second):
            thread.join(member)
        thread.cv.notify()
    assert first.done.wait(5) and second.done.wait(5)
    assert order == ["a", "b"] * 3


def test_a_failing_turn_stops_neither_the_thread_nor_the_others() -> None:
    thread, order = ComputeThread(), list[str]()
    broken = Counting(thread, "broken", 2, order, fail=True)
    thread.join(broken)
    assert broken.done.wait(5)
    healthy = Counting(thread, "ok", 2, order)
    with thread.cv:
        thread.join(healthy)
        thread.cv.notify()
    assert healthy.done.wait(5)
    assert order == ["broken", "broken", "ok", "ok"]
    assert thread.others_have_work(healthy) is False


def test_calls_run_on_the_compute_thread_and_are_refused_once_closed() -> None:
    calls = CallsOnly()
    assert calls.call(lambda: threading.current_thread().name) == THREAD_NAME
    with pytest.raises(ZeroDivisionError):
        calls.call(lambda: 1 // 0)
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(5)
        return "finished"

    results: list[str] = []
    caller = threading.Thread(target=lambda: results.append(calls.call(slow)))
    caller.start()
    assert started.wait(5)
    closer = threading.Thread(target=calls.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()  # close waits for the call that is running: its caller may free what it uses
    release.set()
    closer.join(5)
    caller.join(5)
    assert results == ["finished"] and not closer.is_alive()
    with pytest.raises(UnavailableError):
        calls.call(lambda: None)
