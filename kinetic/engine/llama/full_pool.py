"""A step whose batch finds the unified KV pool full (llama_decode's status 1, which leaves the memory as it was).

With one pool for every slot (-kvu, the default with -np auto), idle slots keep their last prompt's cells there, and
a class's distinct prompts filled it until each new one found no room: every request after that failed with a 500
while none was running (2026-12-07: four 237-token prompts filled `-c 1024`). llama-server then purges one idle
slot's cells at a time and decodes the batch again (try_clear_idle_slots); kinetic does too, the least recently used
first, its state saved to the host cache (--cache-idle-slots) as when a new prompt takes a slot (admission.py purges
the same way when a saved state finds no room to be restored into).

When the running requests alone overfill the pool, llama-server fails every request in the batch ("Context size has
been exceeded.", its own TODO: "terminate only the largest active slot"): one student's long prompt ended every
other stream. kinetic takes one request's tokens out of the batch, so the others go on. A prompt still being read
(the newest first) has streamed nothing: it gives its slot back and waits at the head of the line, and no waiting
request starts until one of those running has ended and freed its cells; its student sees a slower answer instead of
a 500. Where every request in the batch is generating, the slot that holds the most cells fails with llama-server's
500 (its stream has started: it cannot start again unseen).
"""

from __future__ import annotations

import logging

from llama_cpp import _internals

from kinetic.engine.llama.admission import SlotAdmission
from kinetic.engine.llama.batch import decode_failure, drop_sequence
from kinetic.engine.llama.slots import Slot
from kinetic.errors import KineticError, ServerError

log = logging.getLogger(__name__)


class FullPool(SlotAdmission):
    """The Scheduler's way out of a full KV pool, over its admission half (a mixin as that one is)."""

    batch: _internals.LlamaBatch

    def _fail_slot(self, slot: Slot, error: KineticError) -> None:
        raise NotImplementedError

    def _make_room(self, rows: list[tuple[Slot, int]], evaluated: list[Slot]) -> bool:
        """After a batch found no free cells: purges an idle slot (admission.py), else takes one request out of the
        batch (its tokens, and its rows in `rows` and `evaluated`): a prompt still being read waits, a generating
        request fails. False where nothing can give way: then the batch fails. Slots with pools of their own (-np
        without -kvu) outgrow only their own: nothing here."""
        return self.kv_unified and (self._purge_idle_slot() > 0 or self._shed(rows, evaluated))

    def _shed(self, rows: list[tuple[Slot, int]], evaluated: list[Slot]) -> bool:
        in_batch = {s.id: s for s, _ in rows} | {s.id: s for s in evaluated}
        running = [s for s in in_batch.values() if s.job is not None]
        if len(running) < 2:  # the batch's one request fails as a whole batch does
            return False
        reading = [s for s in running if not s.generated]
        slot = max(reading, key=lambda s: s.id_task) if reading else max(running, key=lambda s: len(s.tokens))
        moved = drop_sequence(self.batch, slot.id)
        if reading:
            self._give_way(slot, n_read=len(slot.tokens) - moved.count(-1))
        else:
            log.warning("the KV cache is full: request %d on slot %d fails (%d tokens)", slot.id_task, slot.id,
                        len(slot.tokens))
            self._fail_slot(slot, ServerError(decode_failure(1)))
        rows[:] = [(s, moved[row]) for s, row in rows if s is not slot]
        evaluated[:] = [s for s in evaluated if s is not slot]
        return True

    def _give_way(self, slot: Slot, n_read: int) -> None:
        """`slot`'s request, a prompt still being read, waits again at the head of the line, to start once one of the
        requests running now has ended. What its earlier steps read (`n_read` tokens: the failed batch's are not in
        its cells) is saved to the host cache first, so that a long prompt starts again from there."""
        job = slot.job
        assert job is not None
        if not job.cancelled:
            self._save_before_it_goes(slot, slot.tokens[:n_read])
        with self._cv:
            back = not job.cancelled  # else its client has gone, and Scheduler.cancel found it in no line
            if back:
                self._pending.give_back(job.request.client, job, job.request.priority)
                self._awaiting_room = frozenset(s.id_task for s in self.slots if s.job is not None and s is not slot)
        log.warning("the KV cache is full: request %d on slot %d waits for a running request to end (%d prompt "
                    "tokens)", slot.id_task, slot.id, len(slot.prompt))
        if back:
            slot.job = None  # detached before the slot is freed: the job keeps its sampler and its count in flight
        self._forget_cache(slot)
        self._release(slot)
