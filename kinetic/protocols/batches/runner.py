"""Runs the batches: one line at a time, oldest batch first, below every live request.

A line starts only when no live request waits for a slot and a slot stays free for the next live one (a model of
one slot: when it is idle); it then waits in the fair queue at the lowest priority, so a live request that comes
meanwhile goes first. Each line is its owner's request, made in-process through the whole app (`Dispatch`):
the gate checks the owner's key and budget as they are now, the ledger writes its line (with the batch's id),
and the budgets count it.

The runner picks up after a restart where the store says the batch is: a line whose result was not kept runs
again. Cancelling ends a batch after the line running (within a second while it waits for room); what was done
is in its output file.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from kinetic.classroom.caller import BatchOrigin
from kinetic.protocols.batches.store import Batch, BatchLine, BatchStore, read_lines
from kinetic.protocols.common import translate as common

log = logging.getLogger(__name__)

Dispatch = Callable[[str, dict[str, Any], BatchOrigin], Awaitable[tuple[int, dict[str, Any]]]]
ROOM_POLL_S = 0.1
FAILED_STORE_RETRY_S = 5.0


class BatchRunner:
    def __init__(self, store: BatchStore, dispatch: Dispatch, room: Callable[[], bool],
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.dispatch = dispatch
        self.room = room
        self.clock = clock
        self._wake = asyncio.Event()
        self._stopping = False

    def stop(self) -> None:
        """A shutdown has begun: no line starts, and the answer of the one running (a 503 if it was waiting) is
        not kept, so that it runs again after the restart."""
        self._stopping = True

    def wake(self) -> None:
        """A batch was made or cancelled."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            batch = None if self._stopping else self.store.runnable()
            if batch is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._advance(batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug or a full disk must not stop every later batch: this one fails, in the log
                log.exception("batch %s failed", batch.id)
                try:
                    self.store.update(batch.id, status="failed", failed_at=self._now(), errors=errors_list([{
                        "code": "server_error", "message": "kinetic failed to run this batch: see the server's log",
                        "param": None, "line": None}]))
                except Exception:  # the store itself cannot be written: try again later, not in a tight loop
                    log.exception("batch %s: its failure could not be stored", batch.id)
                    await asyncio.sleep(FAILED_STORE_RETRY_S)

    async def _advance(self, batch: Batch) -> None:
        if batch.status == "validating":
            self._validate(batch)
        elif batch.status == "in_progress":
            await self._run_lines(batch)
        else:  # finalizing, cancelling: the lines left will not run
            self._finish(batch)

    def _now(self) -> int:
        return int(self.clock())

    def _validate(self, batch: Batch) -> None:
        content = self.store.input_bytes(batch)
        if content is None:
            problems = [{"code": "missing_file", "message": f"the input file {batch.body['input_file_id']} was "
                         "deleted", "param": "input_file_id", "line": None}]
        else:
            lines, problems = read_lines(content, batch.body["endpoint"])
        if problems:
            self.store.update(batch.id, status="failed", failed_at=self._now(), errors=errors_list(problems))
            return
        self.store.update(batch.id, status="in_progress", in_progress_at=self._now(),
                          request_counts={"total": len(lines), "completed": 0, "failed": 0})

    def _input_lines(self, batch: Batch) -> list[BatchLine]:
        """The batch's requests, read again from its input (validated when it began; none once it is deleted)."""
        content = self.store.input_bytes(batch)
        return read_lines(content, batch.body["endpoint"])[0] if content is not None else []

    async def _run_lines(self, batch: Batch) -> None:
        done = self.store.finished_lines(batch.id)
        for line in self._input_lines(batch):
            if line.number in done:
                continue
            if not await self._wait_for_room(batch):
                return  # cancelled or expired: the next turn ends it
            origin = BatchOrigin(batch.id, line.custom_id, batch.owner, batch.admin)
            status, body = await self.dispatch(batch.body["endpoint"], line.body, origin)
            if self._stopping:
                return
            self.store.add_result(batch.id, line.number, 200 <= status < 300, {
                "id": common.random_id("batch_req_", 24), "custom_id": line.custom_id,
                "response": {"status_code": status, "request_id": common.random_id("req_", 24), "body": body},
                "error": None})
        self.store.update(batch.id, status="finalizing", finalizing_at=self._now())

    async def _wait_for_room(self, batch: Batch) -> bool:
        """Until a line may start; False once the batch is cancelled or past its window (then marked expired)."""
        while True:
            body = self.store.get_body(batch.id)
            if self._stopping or body is None or body["status"] != "in_progress":
                return False
            if self._now() >= body["expires_at"]:
                self.store.update(batch.id, status="finalizing", finalizing_at=self._now(), expired_at=self._now())
                return False
            if self.room():
                return True
            await asyncio.sleep(ROOM_POLL_S)

    def _finish(self, batch: Batch) -> None:
        """The output and error files from the lines that ran, and the batch's last status."""
        body = self.store.get_body(batch.id) or batch.body
        if body.get("expired_at"):  # OpenAI's error file holds each line the window left, as batch_expired
            self._expire_lines(batch)
        ids = self.store.write_results(batch)
        now = self._now()
        if body["status"] == "cancelling":
            ending = {"status": "cancelled", "cancelled_at": now}
        elif body.get("expired_at"):
            ending = {"status": "expired"}
        else:
            ending = {"status": "completed", "completed_at": now}
        self.store.update(batch.id, **ids, **ending)

    def _expire_lines(self, batch: Batch) -> None:
        done = self.store.finished_lines(batch.id)
        for line in self._input_lines(batch):
            if line.number not in done:
                self.store.add_result(batch.id, line.number, False, {
                    "id": common.random_id("batch_req_", 24), "custom_id": line.custom_id, "response": None,
                    "error": {"code": "batch_expired", "message": "This request could not be executed before the "
                              "completion window expired."}})


def errors_list(problems: list[dict[str, Any]]) -> dict[str, Any]:
    return {"object": "list", "data": problems}
