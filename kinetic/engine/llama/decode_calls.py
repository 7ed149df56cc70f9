"""Work handed to the compute thread from other threads (Scheduler.call, CallsOnly.call): the load's warm-up, the
projector's load, embeddings and reranking, so that every llama.cpp computation runs on that one thread
(compute_thread.py says why)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class DecodeCalls:
    """The calls waiting for the compute thread. `lock` is that thread's condition: a call notifies it, and the
    thread's idle wait ends when there is one."""

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

    def take(self) -> Callable[[], None]:
        """Under the lock, on the compute thread: every call waiting now, to be run in order outside the lock."""
        runs, self._waiting = [run for run, _ in self._waiting], []

        def run_all() -> None:
            for run in runs:
                run()
        return run_all

    def fail_all(self, error: BaseException) -> None:
        """Under the lock, as the decode thread stops: every call still waiting gets `error`."""
        waiting, self._waiting = self._waiting, []
        for _, fail in waiting:
            fail(error)
