"""Work handed to a model's decode thread from other threads (Scheduler.call): the load's warm-up, the projector's
load, embeddings and reranking, so that every llama.cpp computation of the model runs on that one thread.

ggml's CPU backend computes a graph on an OpenMP team led by the calling thread, and libgomp keeps each leading
thread's team for good. Once the process holds more OpenMP threads than CPUs, libgomp spins only 100 times at a
barrier before it sleeps on a futex, and a graph has a barrier per node. On 2 cores one decode on a second thread
(the warm-up, on the loading thread) made every later one-token decode of a tiny LFM2 take 3.4 ms instead of 2.0
(2026-12-05, AVX-512), and every decode of the bundled Gemma slower too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class DecodeCalls:
    """The calls waiting for the decode thread. `lock` is the scheduler's condition: a call notifies it, and the
    decode thread's idle wait ends when there is one."""

    def __init__(self, lock: threading.Condition):
        self._lock = lock
        self._waiting: list[tuple[Callable[[], None], Callable[[BaseException], None]]] = []  # (run it, fail it)

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def put(self, work: Callable[[], T], refusal: Callable[[], BaseException | None]) -> T:
        """Hands `work` to the decode thread and waits for what it returns or raises, unless `refusal`, read
        under the lock, gives an error (the scheduler has stopped): then that is raised."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(work())
            except BaseException as exc:  # the caller gets it; the decode thread goes on
                future.set_exception(exc)

        with self._lock:
            if (error := refusal()) is not None:
                raise error
            self._waiting.append((run, future.set_exception))
            self._lock.notify()
        return future.result()

    def take(self) -> list[Callable[[], None]]:
        """Under the lock, on the decode thread: every call waiting now, in order, each to be run outside it."""
        waiting, self._waiting = self._waiting, []
        return [run for run, _ in waiting]

    def fail_all(self, error: BaseException) -> None:
        """Under the lock, as the decode thread stops: every call still waiting gets `error`."""
        waiting, self._waiting = self._waiting, []
        for _, fail in waiting:
            fail(error)
