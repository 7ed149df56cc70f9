"""How the decode thread's events reach the event loop that waits for them: one inbox per loop.

The decode thread appends a step's events to the loop's inbox and, when the loop has not been
woken since it last emptied the inbox, writes one byte to a pipe the loop watches. That write
goes through `ctypes.PyDLL`, which keeps the GIL for the call: the loop wakes, finds the GIL
taken, and runs only once the decode thread lets go of it inside the next llama_decode.
`call_soon_threadsafe` lets go of the GIL while it writes to the loop's socket, and on two cores
the loop then took the GIL and encoded and sent its tokens while the decode thread waited to
start the next step (0.24 ms a token on the bundled model, measured). The hand-off thread that
replaced it (fed by a SimpleQueue, which keeps the GIL) cost one more thread wake-up per step:
the server's CPU per streamed token, measured without a model, fell from about 0.13 to 0.10 ms
with this inbox.

Where the pipe or PyDLL is missing (a Windows event loop has no `add_reader`), the inbox falls
back to `call_soon_threadsafe`.

A step that holds a request's first text is the exception: the decode thread then waits, a few
milliseconds at most, for the loop to hand that text on (to the wire, for a stream) before it starts
the next step. Otherwise the loop (and, on one machine, the client) wakes while llama.cpp's threads hold
both cores for that step, and the first token reached the client a step late (deliver_step).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from kinetic.engine.types import TextDelta

Delivery = list[tuple[Any, Any]]  # (job, event or exception) pairs; each job's `queue` takes its events

# How long the decode thread waits, at most, for its loop to hand on a step's first texts (see the top).
FIRST_TEXT_WAIT_S = 0.003


def _gil_holding_write() -> Callable[[int, bytes, int], int] | None:
    try:
        write = ctypes.PyDLL(None).write
    except (OSError, AttributeError, TypeError):
        return None
    write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    write.restype = ctypes.c_ssize_t
    return write


_write = _gil_holding_write()


class LoopInbox:
    """Events on their way to one event loop. `put` is called by the decode thread only."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._deliveries: collections.deque[Delivery] = collections.deque()
        self._woken = False  # a byte is in the pipe (or a callback scheduled) and not yet handled
        self._write_fd = -1
        if _write is not None:
            read_fd, write_fd = os.pipe()
            os.set_blocking(read_fd, False)
            os.set_blocking(write_fd, False)
            try:
                loop.add_reader(read_fd, self._on_readable, read_fd)
            except NotImplementedError:
                os.close(read_fd)
                os.close(write_fd)
            else:
                self._write_fd = write_fd
                # The loop's reader keeps this inbox alive as long as the loop lives: both go together.
                weakref.finalize(self, _close_pipe, read_fd, write_fd)

    def put(self, delivery: Delivery) -> None:
        if self.loop.is_closed():  # nobody is listening any more
            self._deliveries.clear()
            return
        self._deliveries.append(delivery)
        if self._woken:
            return
        self._woken = True
        if self._write_fd >= 0 and _write is not None:
            _write(self._write_fd, b"\0", 1)  # a full pipe (EAGAIN) still wakes the loop
            return
        try:
            self.loop.call_soon_threadsafe(self._deliver_all)
        except RuntimeError:  # that loop has closed: nobody is listening any more
            self._deliveries.clear()

    def _on_readable(self, read_fd: int) -> None:
        try:
            os.read(read_fd, 4096)
        except BlockingIOError:
            pass
        self._deliver_all()

    def _deliver_all(self) -> None:
        self._woken = False  # before emptying: what arrives from now on wakes the loop again
        while self._deliveries:
            for job, event in self._deliveries.popleft():
                job.queue.put_nowait(event)


def deliver_step(delivery: Delivery) -> None:
    """On the decode thread: a step's events to the loops of their jobs (a slots.Job: `inbox`, `queue`,
    `first_text_out`, `first_text_handled`), then the wait for any first text among them (see the top)."""
    by_inbox: dict[LoopInbox, Delivery] = {}
    first_texts: list[threading.Event] = []
    for job, event in delivery:
        by_inbox.setdefault(job.inbox, []).append((job, event))
        if isinstance(event, TextDelta) and not job.first_text_out:
            job.first_text_out = True
            first_texts.append(job.first_text_handled)
    for inbox, events in by_inbox.items():
        inbox.put(events)
    deadline = time.monotonic() + FIRST_TEXT_WAIT_S
    for handled in first_texts:
        if not handled.wait(deadline - time.monotonic()):
            return


def _close_pipe(read_fd: int, write_fd: int) -> None:
    os.close(read_fd)
    os.close(write_fd)


_inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopInbox] = weakref.WeakKeyDictionary()


def inbox_for(loop: asyncio.AbstractEventLoop) -> LoopInbox:
    """The loop's inbox, made on first use. Call it on that loop's own thread (add_reader)."""
    inbox = _inboxes.get(loop)
    if inbox is None:
        inbox = _inboxes[loop] = LoopInbox(loop)
    return inbox
