"""Prompt admission: which idle slot a waiting job gets, how much of its prompt the slot need not
evaluate (its own cached prefix, another slot's cells, a state saved in host memory), as the Scheduler
(scheduler.py) runs it at the start of a step, and how a step's prompt budget is shared by the slots
still reading theirs. See the scheduler's docstring for the whole picture."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import llama_cpp
from llama_cpp import _internals

from kinetic.engine.llama.compute_thread import COMPUTE_THREAD
from kinetic.engine.llama.context_shift import MemoryCells, reuse_chunks
from kinetic.engine.llama.host_cache import HostPrefixCache
from kinetic.engine.llama.slots import Job, Slot
from kinetic.engine.options import LongContext
from kinetic.engine.text import common_prefix
from kinetic.engine.types import Event, GenerationRequest, MediaSpan
from kinetic.errors import ServerError
from kinetic.scheduling.arrivals import DOOR
from kinetic.scheduling.fairqueue import FairQueue

log = logging.getLogger(__name__)

# Copying another slot's cells pays off only for a real shared prefix, not a BOS and a few tokens.
MIN_SHARED_PREFIX = 16
# A checkpoint this many tokens before a prompt's end (llama-server's offset): a prompt sent again, or a
# chat's next turn whose template renders the last answer otherwise, restores it.
CHECKPOINT_END_OFFSET = 4


def cannot_roll_back(*, exact_states: bool, n_swa: int, swa_full: bool) -> bool:
    """Whether llama-server takes a model's memory for one that cannot roll back to any prefix: recurrent layers,
    or a sliding window kept at its size (without --swa-full)."""
    return exact_states or (n_swa > 0 and not swa_full)


def end_breaks(*, n_batch: int, n_ubatch: int, cannot_roll_back: bool) -> tuple[int, ...]:
    """How many tokens before a prompt's end llama-server ends a prompt batch, on a model whose memory cannot
    roll back to any prefix (recurrent layers, or a sliding window, which llama-server keeps at its size):
    there it saves a checkpoint. kinetic ends its batches at the same places, checkpoint or not, so that a
    prompt is evaluated in llama-server's shapes: llama.cpp's arithmetic depends on a batch's shape, and
    on Gemma 3 the last token read in one batch with the first gave other logits than read after them
    (2026-12-03, AVX2: 0.55 apart at most, enough to change a seeded sample), so a prompt sent again, its
    head now cached, was answered otherwise than the first time. llama-server never reads the two together."""
    if not cannot_roll_back:
        return ()
    return tuple(sorted({min(n_batch, CHECKPOINT_END_OFFSET + n_ubatch), CHECKPOINT_END_OFFSET}, reverse=True))

# How long an idle decode thread waits for requests still on their way (between the server's door and their
# queue: scheduling/arrivals.py, and Scheduler.preparing) before it starts the first one's prompt: requests
# sent together then share the first batch instead of the later ones waiting out a step that evaluates the
# first prompt alone.
GATHER_S = 0.02


def media_floor(media: tuple[MediaSpan, ...], n: int) -> int:
    """`n` moved back to the start of an image it falls inside: cells hold a whole image or none of it."""
    for span in media:
        if span.start < n < span.end:
            return span.start
    return n


class SlotAdmission:
    """The Scheduler's admission half (a mixin: it shares the scheduler's state and decode thread)."""

    ctx: _internals.LlamaContext
    batch: _internals.LlamaBatch
    slots: list[Slot]
    host_cache: HostPrefixCache
    metrics: dict[str, float]
    exact_states: bool
    kv_unified: bool
    share_prefixes: bool
    ctx_checkpoints: int
    prompt_end_breaks: tuple[int, ...]
    cells: MemoryCells
    _prompt_turn: int
    long_context: LongContext
    _pending: FairQueue[Job]
    _task_ids: itertools.count[int]
    _cv: threading.Condition
    _preparing: int
    _gathering: bool
    _stopping: bool
    _awaiting_room: frozenset[int] = frozenset()  # tasks running when a prompt last found no room (full_pool.py)

    def preparing(self, delta: int) -> None:
        """A request is being prepared (+1) or is queued or refused (-1): see GATHER_S."""
        with self._cv:
            self._preparing += delta
            if not self._preparing:
                self._cv.notify()

    def _gather(self) -> None:
        """Under the lock, on an idle scheduler with a job to start: waits up to GATHER_S for the requests
        still on their way. A scheduler already generating never waits: its streams would stall, nor while
        another model has work for the compute thread."""
        if any(s.job for s in self.slots) or COMPUTE_THREAD.others_have_work(self):
            return
        deadline = time.monotonic() + GATHER_S
        self._gathering = True
        try:
            while ((self._preparing or DOOR.count) and not self._stopping
                   and not COMPUTE_THREAD.others_have_work(self)  # another model's turn must not wait
                   and (left := deadline - time.monotonic()) > 0):
                self._cv.wait(left)
        finally:
            self._gathering = False

    def _arrival_left(self) -> None:
        """A request has left the door (DOOR calls this on the event loop): a gathering scheduler looks again."""
        if self._gathering:
            with self._cv:
                self._cv.notify()

    def _emit(self, job: Job, event: Event | BaseException) -> None:
        raise NotImplementedError

    def _release(self, slot: Slot) -> None:
        raise NotImplementedError

    def _forget_cache(self, slot: Slot) -> None:
        raise NotImplementedError

    def _uncount(self, job: Job) -> None:
        raise NotImplementedError

    def _add(self, slot: Slot, tokens: list[int], *, logits: bool, last: bool = False) -> None:
        raise NotImplementedError

    def _progress(self, slot: Slot, *, start: bool = False) -> None:
        raise NotImplementedError

    def _assign_pending(self) -> None:
        """Gives waiting jobs to idle slots, clients in turn (fairqueue.py); among idle slots the one
        holding the longest common prefix of the prompt wins, if that is more than -sps of the prompt, else
        one beside busy slots (_busy_neighbours), else the least recently used one."""
        while self._pending and any(s.job is None for s in self.slots) and not self._room_awaited():
            for client, job in self._pending.in_order():
                idle = [s for s in self.slots if s.job is None]
                if job.request.id_slot >= 0:
                    idle = [s for s in idle if s.id == job.request.id_slot]
                if idle:
                    prompt = job.request.prompt_tokens
                    # cells computed under other adapter scales are no prefix of this job's
                    slot = max(idle, key=lambda s: (self._similar_prefix(s.tokens, prompt) if s.lora == job.lora
                                                    else 0, self._busy_neighbours(s), -s.last_used))
                    self._pending.served(client, job)
                    try:
                        self._start(slot, job)
                    except Exception as exc:  # e.g. a host-cache copy: this job fails, the slot stays usable
                        log.exception("starting a request on slot %d failed", slot.id)
                        self._emit(job, ServerError(f"generation failed to start: {exc}"))
                        if slot.job is job:
                            self._release(slot)
                        else:
                            job.sampler.close()
                            self._uncount(job)
                        self._forget_cache(slot)
                    break
            else:
                return  # every waiting job wants a busy slot

    def _busy_neighbours(self, slot: Slot) -> int:
        """How many of the slots beside `slot` (ids one less and one more) hold a request. Without a unified KV
        pool each slot has its own stream of cells, and llama.cpp puts several sequences in one ubatch only if their
        ids follow on (llama_batch_allocr::split_equal, sequential): a step over slots 1, 5, 6 and 9 is three graph
        computations, each reading all the weights. So an idle slot next to busy ones comes before the least
        recently used one (on the tiny LFM2, four prompts read in one ubatch took 5.8 ms, in two 8.0, in three
        10.4). A unified pool splits by token, whatever the ids."""
        if self.kv_unified:
            return 0
        return sum(1 for i in (slot.id - 1, slot.id + 1) if 0 <= i < len(self.slots) and self.slots[i].job is not None)

    def _room_awaited(self) -> bool:
        """Whether a prompt that gave its slot back for want of room (full_pool.py) still waits: no waiting job starts
        until one of the requests running then has ended, as it would find no room either."""
        if self._awaiting_room and self._awaiting_room <= {s.id_task for s in self.slots if s.job is not None}:
            return True
        self._awaiting_room = frozenset()
        return False

    def _similar_prefix(self, tokens: list[int], prompt: list[int]) -> int:
        """The usable prefix when it is more than -sps of the prompt (llama-server's slot similarity), else 0."""
        threshold = self.long_context.slot_similarity
        n = self._usable_prefix(tokens, prompt) if threshold > 0 else 0
        return n if prompt and n / len(prompt) > threshold else 0

    def _usable_prefix(self, tokens: list[int], prompt: list[int]) -> int:
        """How much of what a slot holds `prompt` could start from (on exact states: all of it, or none)."""
        n = common_prefix(tokens, prompt)
        return n if not self.exact_states or n == len(tokens) else 0

    def _reuse_prefix(self, slot: Slot, prompt: list[int], media: tuple[MediaSpan, ...] = ()) -> int:
        """How many prompt tokens `slot` need not evaluate: its own cached prefix, a longer one copied
        from another slot's cells (also while that slot is still generating), or one restored from the
        host-memory cache. The slot's old cells are saved there first when a real prefix is dropped."""
        # The last prompt token is always evaluated again: its logits give the first sample.
        limit = len(prompt) - 1
        n_own = media_floor(media, min(common_prefix(slot.tokens, prompt), limit))
        memory = self.ctx.memory
        source, n_source = None, n_own
        if self.share_prefixes:
            for other in self.slots:
                n = media_floor(media, min(common_prefix(other.tokens, prompt), limit)) \
                    if other is not slot and other.lora == slot.lora else 0
                if n >= MIN_SHARED_PREFIX and n > n_source:
                    source, n_source = other, n
        # Saved before the lookup: a save may drop older states (the budget, or a shorter prefix it supersedes),
        # and the one the lookup found must still be there to restore (an hour of a class hit this once the
        # cache was full: 25 requests failed to start).
        if self.long_context.cache_idle_slots and len(slot.tokens) - n_own >= MIN_SHARED_PREFIX:  # about to go
            self.host_cache.save(slot.id, slot.tokens, slot.lora)
        saved, n_saved = self.host_cache.longest_prefix(prompt, limit, slot.lora)
        n_saved = media_floor(media, n_saved)
        if saved is not None and n_saved >= MIN_SHARED_PREFIX and n_saved > n_source:
            return self._restore(saved, n_saved, slot)
        if source is not None:
            return self._copy_cells(source, slot, n_source)
        if self.long_context.cache_reuse:  # --cache-reuse: move cached chunks the prompt goes on with
            n_own = len(reuse_chunks(self.cells, slot.id, slot.tokens, prompt, n_own, limit=limit,
                                     min_chunk=self.long_context.cache_reuse, movable_from=slot.shared))
        if not llama_cpp.llama_memory_seq_rm(memory, slot.id, n_own, -1):
            self._drop_cells(slot)
            return 0
        return n_own

    def _reuse_state(self, slot: Slot, prompt: list[int]) -> int:
        """`_reuse_prefix` on a memory that cannot be trimmed (hybrid, recurrent): the slot's own state when
        the prompt extends all it holds, or a saved state (host cache, checkpoints) the prompt starts with."""
        limit = len(prompt) - 1
        n_own = len(slot.tokens) if self._usable_prefix(slot.tokens, prompt) == len(slot.tokens) <= limit else 0
        if not n_own:  # about to go: saved before the lookup, as in _reuse_prefix
            self._save_before_it_goes(slot, slot.tokens)
        saved, n_saved = self.host_cache.longest_prefix(prompt, limit, slot.lora)
        if saved is not None and n_saved > n_own:
            return self._restore(saved, n_saved, slot)
        if not n_own:
            self._drop_cells(slot)
        return n_own

    def _restore(self, saved: tuple[int, ...], n: int, slot: Slot) -> int:
        """Gives `slot` the host cache's state `saved`, cut to its first `n` tokens (whole on exact states)."""
        self._drop_cells(slot)
        restored = self.host_cache.restore(saved, slot.id)
        # A full pool: idle slots make room, as for a batch, up to the state's own size (a state refused for another
        # reason costs no more caches than that), while the state is kept (a purge saves one too).
        freed = 0
        while not restored and freed < len(saved) and saved in self.host_cache.entries and (
                purged := self._purge_idle_slot(but=slot)):
            freed += purged
            restored = self.host_cache.restore(saved, slot.id)
        if restored and (n == len(saved) or llama_cpp.llama_memory_seq_rm(self.ctx.memory, slot.id, n, -1)):
            self.metrics["prompt_tokens_restored_total"] = self.metrics.get("prompt_tokens_restored_total", 0) + n
            return n
        self._drop_cells(slot)
        return 0

    def _purge_idle_slot(self, but: Slot | None = None) -> int:
        """Frees the cells of the least recently used idle slot (`but` aside) that holds any, where one KV pool
        holds every slot's and has no room left (full_pool.py), its state saved to the host cache first as when a
        new prompt takes a slot (--cache-idle-slots): how many tokens it held. 0 when no such slot is left, or the
        slots do not share one pool."""
        holding = [s for s in self.slots if s.job is None and s.tokens and s is not but] if self.kv_unified else []
        if not holding:
            return 0
        slot = min(holding, key=lambda s: s.last_used)
        log.warning("the KV cache is full: purging idle slot %d with %d tokens", slot.id, len(slot.tokens))
        self._save_before_it_goes(slot, slot.tokens)
        n_tokens = len(slot.tokens)
        self._forget_cache(slot)
        return n_tokens

    def _save_before_it_goes(self, slot: Slot, tokens: list[int]) -> None:
        """--cache-idle-slots: what `slot`'s cells hold (`tokens`), about to be dropped, is saved to the host cache
        when it is a prefix worth restoring."""
        if self.long_context.cache_idle_slots and len(tokens) >= MIN_SHARED_PREFIX:
            self.host_cache.save(slot.id, tokens, slot.lora)

    def _drop_cells(self, slot: Slot) -> None:
        """Empties the slot's sequence: removing a whole sequence always succeeds, on every memory kind."""
        llama_cpp.llama_memory_seq_rm(self.ctx.memory, slot.id, -1, -1)
        slot.shared = 0

    def _checkpoints(self, request: GenerationRequest, n_common: int, lora: tuple[float, ...]) -> list[int]:
        """The positions of the prompt at which its state is saved on the way (exact states only): a few
        tokens before its end, where its last chat message starts (`checkpoint_at`), and where it parts
        from the longest prompt seen before it. The next prompt that starts the same way, on any slot,
        restores that state instead of evaluating it."""
        if not self.ctx_checkpoints:
            return []
        prompt = request.prompt_tokens
        seen = max([common_prefix(s.tokens, prompt) for s in self.slots if s.lora == lora]
                   + [self.host_cache.longest_match(prompt, lora)])
        positions = {p for p in (media_floor(request.media, min(seen, len(prompt) - 1)),
                                 media_floor(request.media, min(request.checkpoint_at, len(prompt) - 1)))
                     if p - n_common >= MIN_SHARED_PREFIX}
        # The checkpoint before the end is kept for any prompt evaluated past it, however short (llama-server's
        # too): the same short prompt sent again (a retry, a regenerated answer) then evaluates only its last
        # tokens, and on a model as costly as the course's a few tokens are most of a step's time.
        end = media_floor(request.media, len(prompt) - CHECKPOINT_END_OFFSET)
        if end > n_common:
            positions.add(end)
        return sorted(positions)

    def _save_checkpoint(self, slot: Slot) -> None:
        """Saves the slot's state when its prompt has reached its next checkpoint (`_checkpoints` chose them, and
        how short a prefix is worth one)."""
        if slot.checkpoints and len(slot.tokens) == slot.checkpoints[0]:
            slot.checkpoints.pop(0)
            self.host_cache.save(slot.id, slot.tokens, slot.lora, min_tokens=1)

    def _copy_cells(self, source: Slot, slot: Slot, n: int) -> int:
        """Gives `slot` the first `n` KV cells of `source` (its own cells are dropped). On exact states the
        source must hold exactly `n` tokens: llama.cpp copies a recurrent state whole, whatever the range."""
        memory = self.ctx.memory
        self._drop_cells(slot)
        if n <= 0:
            return 0
        if self.exact_states:
            assert len(source.tokens) == n, "a recurrent state is copied whole"
            llama_cpp.llama_memory_seq_cp(memory, source.id, slot.id, -1, -1)
        elif self.kv_unified:  # one cell pool: the cells are shared, nothing is copied
            llama_cpp.llama_memory_seq_cp(memory, source.id, slot.id, 0, n)
            source.shared, slot.shared = max(source.shared, n), n
        else:
            # Each slot has its own stream, and llama.cpp copies between streams only whole:
            # copy all of it, then drop what is past the shared prefix.
            llama_cpp.llama_memory_seq_cp(memory, source.id, slot.id, -1, -1)
            if not llama_cpp.llama_memory_seq_rm(memory, slot.id, n, -1):
                self._drop_cells(slot)
                return 0
        self.metrics["prompt_tokens_shared_total"] = self.metrics.get("prompt_tokens_shared_total", 0) + n
        return n

    def _twin(self, job: Job) -> Slot | None:
        """A slot started in this same step for the same prompt of the same request (`[p, p]`, n_cmpl)."""
        if job.group is None:
            return None
        return next((s for s in self.slots if s.job is not None and s.job.group == job.group
                     and not s.t_prompt_start and s.prompt == job.request.prompt_tokens), None)

    def _start(self, slot: Slot, job: Job) -> None:
        prompt = job.request.prompt_tokens
        if slot.lora != job.lora:  # cells computed under other adapter scales are no prefix of this prompt's
            if len(slot.tokens) >= MIN_SHARED_PREFIX:
                self.host_cache.save(slot.id, slot.tokens, slot.lora)
            self._forget_cache(slot)
            slot.lora = job.lora
        twin = self._twin(job) if job.request.cache_prompt else None
        if twin is not None:
            # The copies of one prompt start from the very same cells, then evaluate the same tokens
            # side by side: llama.cpp's arithmetic depends on the shape of each batch, and a copy that
            # evaluated its prompt in other batches could part ways at a near tie even when greedy.
            # (llama-server does this for n_cmpl: the children take the parent's state.)
            if len(slot.tokens) >= MIN_SHARED_PREFIX:
                self.host_cache.save(slot.id, slot.tokens, slot.lora)
            n_common = self._copy_cells(twin, slot, twin.n_cached)
        elif not job.request.cache_prompt:
            self.host_cache.save(slot.id, slot.tokens, slot.lora)
            self._drop_cells(slot)
            n_common = 0
        elif self.exact_states:
            n_common = self._reuse_state(slot, prompt)
        else:
            n_common = self._reuse_prefix(slot, prompt, job.request.media)
        slot.begin(job, n_common, self._checkpoints(job.request, n_common, job.lora), next(self._task_ids),
                   breaks=[media_floor(job.request.media, len(prompt) - k) for k in self.prompt_end_breaks])

    def _read_prompt(self, slot: Slot, take: int, rows: list[tuple[Slot, int]]) -> None:
        """Puts the next `take` tokens of `slot`'s prompt in the step's batch; the prompt's last token, once there, is
        a row to sample (`rows`)."""
        if not slot.t_prompt_start:
            slot.t_prompt_start = time.perf_counter()
            self._progress(slot, start=True)
        chunk, slot.to_evaluate = slot.to_evaluate[:take], slot.to_evaluate[take:]
        if not slot.to_evaluate:
            rows.append((slot, self.batch.batch.n_tokens + len(chunk) - 1))
        self._add(slot, chunk, logits=False, last=not slot.to_evaluate)

    def _prompt_shares(self, budget: int, lora: tuple[float, ...]) -> list[tuple[Slot, int]]:
        """The step's prompt budget split evenly across the slots still reading a prompt with adapter scales
        `lora` (what one does not need goes to the others), starting from a different slot each step."""
        reading = [s for s in self.slots if s.job is not None and s.to_evaluate and s.job.lora == lora]
        if not reading or budget <= 0:
            return []
        self._prompt_turn = (self._prompt_turn + 1) % len(self.slots)
        reading.sort(key=lambda s: (s.id - self._prompt_turn) % len(self.slots))
        # a slot's batch ends at its next break (a checkpoint's state is saved after the decode)
        # ... and before its next image: the media are evaluated apart (Scheduler._evaluate_media)
        room = {s.id: min(len(s.to_evaluate), s.room_to_media(), s.room_to_break()) for s in reading}
        shares = {s.id: 0 for s in reading}
        open_slots = list(reading)
        while budget > 0 and open_slots:
            even = max(1, budget // len(open_slots))
            for slot in list(open_slots):
                give = min(even, room[slot.id] - shares[slot.id], budget)
                shares[slot.id] += give
                budget -= give
                if shares[slot.id] == room[slot.id]:
                    open_slots.remove(slot)
                if budget == 0:
                    break
        return [(slot, shares[slot.id]) for slot in reading if shares[slot.id]]
