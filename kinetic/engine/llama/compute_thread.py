"""The one thread that runs every llama.cpp computation of the process: each loaded model's decode steps, its
warm-up and projector load, embeddings and reranking, for every model a router holds.

ggml's CPU backend computes a graph on an OpenMP team led by the calling thread, and libgomp keeps each leading
thread's team for good. Once the process holds more OpenMP threads than CPUs, libgomp spins only 100 times at a
barrier before it sleeps on a futex, and a graph has a barrier per node. A second computing thread is enough: on 2
cores a model that had decoded once on another thread made every later one-token decode of a tiny LFM2 take 3.4 ms
instead of 2.0, and a router whose three models each had a thread of their own decoded the tiny LFM2 at 0.60x and
the bundled Gemma at 0.83x of their speed alone (bench/bench_router.py, 2026-12-05, AVX-512).

Each model's part is a `Member` (a Scheduler, or an embedding-only model's `CallsOnly`): the thread gives the
members that have work a turn each in rotation, so two busy models alternate step by step. Every member shares
the thread's condition (`cv`) as its own lock, so one notify wakes the thread for any of them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from kinetic.engine.llama.decode_calls import DecodeCalls
from kinetic.errors import KineticError, UnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")
THREAD_NAME = "kinetic-decode"


class Member(Protocol):
    def has_work(self) -> bool:
        """Under the thread's lock: whether a turn now would do anything."""

    def take_turn(self) -> Callable[[], None]:
        """Under the thread's lock, when `has_work`: what the turn runs once the lock is let go."""


class ComputeThread:
    """Started with its first member; it outlives them all (a daemon thread that waits while none has work)."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self._members: list[Member] = []
        self._thread: threading.Thread | None = None

    def join(self, member: Member) -> None:
        with self.cv:
            self._members.append(member)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
                self._thread.start()

    def leave(self, member: Member) -> None:
        with self.cv:
            if member in self._members:
                self._members.remove(member)

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def others_have_work(self, member: object) -> bool:
        """Under the lock: whether a member other than `member` waits for a turn (it must not be held up)."""
        return any(m is not member and m.has_work() for m in self._members)

    def _run(self) -> None:
        while True:
            # a turn's member and work go out of scope with each call: held while the thread waits, they would
            # keep a closed model's context and weights alive (a sleeping model's memory was never freed)
            self._one_turn()

    def _one_turn(self) -> None:
        with self.cv:
            while not (ready := [m for m in self._members if m.has_work()]):
                self.cv.wait()
            member = ready[0]
            # the member taking its turn goes to the back of the line: busy models alternate
            self._members.remove(member)
            self._members.append(member)
            try:
                turn = member.take_turn()
            except Exception:
                log.exception("choosing a turn on the compute thread failed")
                return
        try:
            turn()
        except Exception:  # a member's turn catches its own failures; this one is a bug, and must not stop
            log.exception("a turn on the compute thread failed")  # the thread every model needs


COMPUTE_THREAD = ComputeThread()


class CallsOnly:
    """The member of a model that only takes calls (an embedding-only model: it has no decode steps)."""

    def __init__(self) -> None:
        self._calls = DecodeCalls(COMPUTE_THREAD.cv)
        self._closed_error: KineticError | None = None
        COMPUTE_THREAD.join(self)

    def has_work(self) -> bool:
        return bool(self._calls)

    def take_turn(self) -> Callable[[], None]:
        return self._calls.take()

    def call(self, work: Callable[[], T]) -> T:
        """Runs `work` on the compute thread and returns what it returns (or raises what it raises)."""
        if COMPUTE_THREAD.is_current():
            return work()
        return self._calls.put(work, lambda: self._closed_error)

    def close(self, error: KineticError | None = None) -> None:
        """Refuses calls from now on and fails the waiting ones; returns once a call already running has ended
        (its caller may free what the call uses)."""
        with COMPUTE_THREAD.cv:
            self._closed_error = error or UnavailableError("the model was unloaded")
            self._calls.fail_all(self._closed_error)
        if not COMPUTE_THREAD.is_current():
            self._calls.put(lambda: None, lambda: None)  # runs after whatever the thread runs now
        COMPUTE_THREAD.leave(self)
