"""Slots and the one decode thread: which request runs where, and one llama_decode per step.

Every slot is a llama.cpp sequence id inside one context. A single worker thread owns the context: each step it
builds one batch holding the next token of every generating slot and as much pending prompt as fits, calls
llama_decode once, and samples each slot from its own row of logits. So two decodes never run at once (llama.cpp's
worker threads spin, and two concurrent decodes on two cores collapse to about one token a second), every active
stream advances each step, and several slots share one batch. Each slot keeps the tokens in its KV cache and reuses
the longest common prefix of the next prompt (`cache_n`), or, when another slot holds a longer one (the shared
system prompt of a class), copies those KV cells over instead of evaluating them.

Hybrid and recurrent models (LFM2, Qwen3.5, Mamba) keep, beside or instead of the KV cells, one state per sequence
for their recurrent layers: it is valid only at the position it reached, cannot be trimmed back, and a copy takes
all of it. On them (`exact_states`) a cached prefix is reused only whole: the slot's own state when the prompt
extends everything it holds, or a state saved at exactly a prefix of the prompt. The scheduler saves such states on
the way through a prompt (its checkpoints: a few tokens before the end, as llama-server's context checkpoints, and
where the prompt parts from the longest one seen before it, which is the end of a class's shared system prompt), so
that the next prompts that start the same way restore one instead of evaluating it again, on any slot.

Which idle slot a waiting job gets and how much of its prompt it can skip is admission.py's part; what a step does
when the KV pool is full, full_pool.py's; the slots and jobs themselves are slots.py's. With speculative decoding
(speculative.py) a generating slot puts a draft after its last token in the same batch, and its rows are verified
one after the other.

Waiting requests queue per client and free slots go round-robin across clients (fairqueue.py); the prompt budget of
each step is shared by every slot still reading its prompt, so a long prompt never holds back the others. Events
reach each event loop through its inbox (inbox.py), once per step, in a way that never makes the decode thread wait
for the event loop.

Every llama.cpp computation of the model runs on the decode thread, the warm-up, the projector's load, embeddings and
reranking too (`call`); that thread is the process's one compute thread, which every model of a router shares
(compute_thread.py: libgomp slows every decode once a second thread has computed).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import llama_cpp
from llama_cpp import _internals

from kinetic.engine.llama import admission
from kinetic.engine.llama.adapter_turns import AdapterTurns
from kinetic.engine.llama.batch import add_token, decode_failure
from kinetic.engine.llama.compute_thread import COMPUTE_THREAD
from kinetic.engine.llama.context_shift import MemoryCells, allowed, shift_slot
from kinetic.engine.llama.decode_calls import DecodeCalls
from kinetic.engine.llama.full_pool import FullPool
from kinetic.engine.llama.host_cache import HostPrefixCache
from kinetic.engine.llama.inbox import deliver_step
from kinetic.engine.llama.media import Projector
from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.llama.params import context_params
from kinetic.engine.llama.sampler import GrammarDeadEnd, token_logprob
from kinetic.engine.llama.slots import Job, Slot, SlotBusyError
from kinetic.engine.llama.speculative import make_speculator
from kinetic.engine.options import LongContext, SpecOptions
from kinetic.engine.turns import DecodeLock
from kinetic.engine.types import Event, FinishReason, StopType, TextDelta, TokenLogprob
from kinetic.errors import InvalidRequestError, KineticError, QueueFullError, ServerError, UnavailableError
from kinetic.scheduling.arrivals import DOOR
from kinetic.scheduling.fairqueue import FairQueue
from kinetic.scheduling.inflight import InFlight, ModelInFlight

log = logging.getLogger(__name__)
T = TypeVar("T")


class Scheduler(FullPool):
    """Owns the generation context, its slots and the waiting queue; a member of the compute thread."""

    def __init__(self, model: LoadedModel, *, n_ctx: int, n_slots: int, kv_unified: bool, n_threads: int,
                 n_batch: int, n_ubatch: int, decode_lock: DecodeLock, fair: bool = True, max_queue: int = 0,
                 max_in_flight: int = 0, share_prefixes: bool = True, cache_ram_mib: int = 0,
                 ctx_checkpoints: int = 32, in_flight: InFlight | None = None,
                 long_context: LongContext = LongContext(),  # noqa: B008  frozen: a shared default is safe
                 spec: SpecOptions | None = None, projector: Projector | None = None):
        self.model = model
        self.projector = projector  # image and audio input: each span is evaluated on its own (_evaluate_media)
        params = context_params(model.options, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_slots,
                                n_threads=n_threads, kv_unified=kv_unified)
        self.ctx = model.new_context(params)
        self.adapters = AdapterTurns(model, self.ctx)  # per-request LoRA scales, a set per step
        self.n_ctx = self.ctx.n_ctx()
        self.n_batch = params.n_batch
        self.kv_unified = kv_unified
        self.slot_n_ctx = self.n_ctx if kv_unified else self.n_ctx // n_slots
        if long_context.slot_limit > 0:  # --kv-unified-per-slot
            self.slot_n_ctx = min(self.slot_n_ctx, long_context.slot_limit)
        self.batch = _internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1, verbose=model.verbose)
        self.slots = [Slot(id=i) for i in range(n_slots)]
        self.decode_lock = decode_lock
        self.metrics: dict[str, float] = {
            "prompt_tokens_total": 0, "prompt_tokens_cached_total": 0, "prompt_seconds_total": 0.0,
            "tokens_predicted_total": 0, "tokens_predicted_seconds_total": 0.0, "n_decode_total": 0,
            "n_tokens_max": 0, "n_busy_slots_total": 0}
        self.exact_states = model.info.memory_kind != "attention"
        self.cells = MemoryCells(self.ctx.memory)
        self.long_context = allowed(long_context, can_shift=bool(llama_cpp.llama_memory_can_shift(self.ctx.memory)),
                                    exact_states=self.exact_states)
        self.host_cache = HostPrefixCache(self.ctx, max(0, cache_ram_mib) * 1024 * 1024, exact=self.exact_states,
                                          max_entries=max(0, ctx_checkpoints) * n_slots if self.exact_states else 0)
        # checkpoints live in the host cache, shared by every slot (llama-server keeps them per slot)
        self.ctx_checkpoints = max(0, ctx_checkpoints) if self.exact_states and self.host_cache.enabled else 0
        cannot_roll_back = admission.cannot_roll_back(exact_states=self.exact_states, swa_full=model.options.swa_full,
                                                      n_swa=llama_cpp.llama_model_n_swa(model.model.model))
        self.prompt_end_breaks = admission.end_breaks(n_batch=self.n_batch, n_ubatch=params.n_ubatch,
                                                      cannot_roll_back=cannot_roll_back)
        # per client, waiting or running: this model's limit (0: none) and, in router mode, the process-wide one
        self.in_flight = ModelInFlight(max_in_flight, in_flight)
        self.share_prefixes = share_prefixes
        self.speculator = make_speculator(spec, model, n_ctx=self.n_ctx, n_slots=n_slots, n_batch=self.n_batch,
                                          n_ubatch=params.n_ubatch, n_threads=n_threads, kv_unified=kv_unified,
                                          exact_states=self.exact_states) if spec is not None else None
        self._cv = COMPUTE_THREAD.cv  # shared by every model's scheduler: one notify wakes the one thread
        self._pending: FairQueue[Job] = FairQueue(fair=fair)
        self.max_queue = max_queue  # --max-queue: jobs that may wait for a slot (0: no cap)
        self._outbox: list[tuple[Job, Event | BaseException]] = []
        self._prompt_turn = 0
        self._stopping = False
        # requests between submit_many's start and their enqueue_many; whether admission._gather waits for some
        self._preparing, self._gathering = 0, False
        DOOR.subscribe(self._arrival_left)
        self._closed_error: KineticError = UnavailableError("the model was unloaded")
        self._refusal: KineticError | None = None  # a shutdown's: new requests are refused, the running go on
        self._use_counter, self._task_ids, self._group_ids = itertools.count(1), itertools.count(), itertools.count()
        self._calls = DecodeCalls(self._cv)  # call()'s work for the decode thread
        self._stopped, self._calls_ran_last = threading.Event(), False
        COMPUTE_THREAD.join(self)
        if model.options.warmup:
            log.info("warming up the model with an empty run (--no-warmup to disable)")
            try:
                self.call(lambda: model.warm_up(self.ctx, params.n_batch))
            except BaseException:
                self.close()
                raise

    def call(self, work: Callable[[], T]) -> T:
        """Runs `work` on the decode thread between two steps and returns what it returns (or raises what it
        raises). Blocking; `work` takes the decode lock itself if it needs it."""
        if COMPUTE_THREAD.is_current():
            return work()
        return self._calls.put(work, lambda: self._closed_error if self._stopping else None)

    # ------------------------------------------------------------ from the event loop

    def enqueue_many(self, jobs: list[Job]) -> None:
        """Queues jobs at once (the decode thread sees all or none of them, so free slots start them in
        the same step); a client that would go past its limit of requests in flight gets a 429 for all."""
        if len(jobs) > 1:
            group = next(self._group_ids)
            for job in jobs:
                job.group = group
        with self._cv:
            if self._stopping:  # raced an unload: the model is gone
                raise self._closed_error
            if self._refusal is not None:
                raise self._refusal
            idle = sum(slot.job is None for slot in self.slots)
            if self.max_queue and len(self._pending) + len(jobs) - idle > self.max_queue:
                raise QueueFullError(self.max_queue)
            self.in_flight.enter(dict(Counter(job.request.client for job in jobs)))
            for job in jobs:
                self._pending.push(job.request.client, job, job.request.priority)
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        job.cancelled = True
        with self._cv:
            if self._pending.remove(job):  # never got a slot: it leaves the line without one
                job.sampler.close()
                self._uncount(job)
            self._cv.notify()

    def _uncount(self, job: Job) -> None:
        """Called under the lock."""
        if job.counted:
            job.counted = False
            self.in_flight.leave(job.request.client)

    def with_idle_slot(self, slot_id: int, action: Callable[[Slot], T]) -> T:
        """Runs `action` on slot `slot_id` while no step decodes and no waiting job can take the slot
        (POST /slots save/restore/erase). A busy slot raises SlotBusyError: the caller waits and retries.
        The decode thread's lock order: decode_lock, then the condition."""
        with self.decode_lock, self._cv:
            slot = self.slots[slot_id]
            if slot.job is not None:
                raise SlotBusyError(slot_id)
            return action(slot)

    @property
    def n_deferred(self) -> int:
        with self._cv:  # the decode thread changes the queue
            return len(self._pending)

    def deferred_by_client(self) -> dict[str, int]:
        with self._cv:
            return self._pending.counts()

    def refuse_waiting(self, error: KineticError) -> None:
        """A shutdown's start: every request still waiting for a slot fails with `error` now, and so does
        every later one; the running ones go on (their drain)."""
        with self._cv:
            self._refusal = error
            for _, job in list(self._pending.in_order()):
                self._fail_now(job, error)
            self._cv.notify_all()

    def close(self, error: KineticError | None = None) -> None:
        """Stops the decode thread. Every request it holds, running or waiting, fails at once with
        `error` (default: the model was unloaded) and gives back its count: the decode thread may be
        inside a long prompt step, and its streams must not wait for it."""
        with self._cv:
            self._stopping = True
            if error is not None:
                self._closed_error = error
            for job in [s.job for s in self.slots if s.job is not None] + [job for _, job in self._pending.in_order()]:
                self._fail_now(job, self._closed_error)
            self._cv.notify_all()
        DOOR.unsubscribe(self._arrival_left)
        if COMPUTE_THREAD.is_current():  # from a turn of the thread itself: nothing of this model is running
            with self._cv:
                self._stop()
        elif not self._stopped.wait(timeout=10):
            log.error("the decode thread did not stop within 10 s (a llama_decode still running)")

    def _fail_now(self, job: Job, error: KineticError) -> None:
        """From any thread, under the lock: `job` gets `error` now and its count back; the decode thread
        frees its slot (if it had one) at its next step, as for a cancelled job."""
        if job.done:
            return
        job.done = job.cancelled = True
        job.inbox.put([(job, error)])
        if self._pending.remove(job):
            job.sampler.close()
        self._uncount(job)

    # ------------------------------------------------------------ the decode thread

    def has_work(self) -> bool:
        """Under the lock: whether the compute thread has something to do for this model."""
        return bool(self._stopping or self._calls or self._pending or any(s.job for s in self.slots))

    def take_turn(self) -> Callable[[], None]:
        """Under the lock, on the compute thread: this model's next turn, run once the lock is let go."""
        if self._stopping:  # close() has failed every job
            self._stop()
            return _nothing
        # work handed over by call(); with streams running, calls and steps alternate (an embedding of many inputs
        # comes one input a call)
        if self._calls and not (self._calls_ran_last and any(s.job for s in self.slots)):
            self._calls_ran_last = True
            return self._calls.take()
        self._calls_ran_last = False
        self._gather()
        return self._decode_step

    def _stop(self) -> None:
        """Under the lock: frees what the slots still hold and leaves the compute thread."""
        for slot in self.slots:
            if slot.job is not None:
                self._release(slot)
        self._calls.fail_all(self._closed_error)
        COMPUTE_THREAD.leave(self)
        self._stopped.set()

    def _decode_step(self) -> None:
        # Nothing may kill the one compute thread: a failure is logged, the requests it touched fail, and the
        # others go on.
        try:
            with self._cv:
                self._assign_pending()
            with self.decode_lock:
                self._step()
        except Exception as exc:
            log.exception("decode step failed")
            for slot in self.slots:
                if slot.job is not None:
                    self._fail_slot(slot, ServerError(f"generation failed: {exc}"))
        try:
            self._flush()
        except Exception:
            log.exception("delivering a step's events failed")
            self._outbox = []

    def _emit(self, job: Job, event: Event | BaseException) -> None:
        self._outbox.append((job, event))

    def _flush(self) -> None:
        if self._outbox:
            outbox, self._outbox = self._outbox, []
            deliver_step(outbox)

    def _step(self) -> None:
        for slot in self.slots:
            if slot.job is not None and slot.job.cancelled:
                self._release(slot)
            elif slot.job is not None and slot.to_evaluate and slot.media:
                self._evaluate_media(slot)
        batch = self.batch.batch
        batch.n_tokens = 0
        lora = self.adapters.next_turn(self.slots)
        generated = self._generated(lora)
        shares = {slot.id: take for slot, take in self._prompt_shares(
            self.n_batch - sum(map(len, generated.values())), lora)}
        sample_rows: list[tuple[Slot, int]] = []
        evaluated: list[Slot] = []  # slots with prompt tokens in this batch
        # in slot order: llama.cpp puts sequences in one ubatch only in increasing order (admission._busy_neighbours)
        for slot in self.slots:
            if slot.id in generated:
                sample_rows.append((slot, batch.n_tokens))
                self._add(slot, generated[slot.id], logits=True)
            elif slot.id in shares:
                evaluated.append(slot)
                self._read_prompt(slot, shares[slot.id], sample_rows)
        if batch.n_tokens == 0:
            return
        self.adapters.use(lora)
        status = llama_cpp.llama_decode(self.ctx.ctx, batch)
        while status == 1 and self._make_room(sample_rows, evaluated):  # status 1 changed nothing (full_pool.py)
            if batch.n_tokens == 0:
                return
            status = llama_cpp.llama_decode(self.ctx.ctx, batch)
        self.metrics["n_decode_total"] += 1
        self.metrics["n_busy_slots_total"] += sum(1 for s in self.slots if s.job is not None)
        if status != 0:
            # every slot with tokens in the batch: a slot midway through its prompt holds none of them either
            in_batch = {s.id for s, _ in sample_rows} | {s.id for s in evaluated}
            for slot in self.slots:
                if slot.id in in_batch and slot.job is not None:
                    self._fail_slot(slot, ServerError(decode_failure(status)))
            return
        for slot in evaluated:
            self._save_checkpoint(slot)
            self._progress(slot)
        for slot, row in sample_rows:
            if slot.job is not None and slot.drafts and self.speculator is not None:
                self.speculator.verify(slot, row, self._sample, self._trim, self.metrics, self.model.is_eog)
            elif slot.job is not None:
                self._sample(slot, row)

    def _evaluate_media(self, slot: Slot) -> None:
        """Every image or clip the slot's prompt has reached, before this step's batch: mtmd encodes it and decodes
        its embeddings in batches of their own (non-causal where the model wants it), so it cannot share one."""
        assert slot.job is not None and self.projector is not None
        while slot.to_evaluate and (span := slot.media.get(len(slot.tokens))) is not None:
            if not slot.t_prompt_start:
                slot.t_prompt_start = time.perf_counter()
                self._progress(slot, start=True)
            try:
                self.adapters.use(slot.job.lora)
                self.projector.evaluate(self.ctx, span, slot.id, self.n_batch)
            except RuntimeError as exc:
                log.exception("evaluating media on slot %d failed", slot.id)
                self._fail_slot(slot, ServerError(f"generation failed: {exc}"))
                return
            slot.tokens += slot.to_evaluate[:span.n_pos]
            slot.to_evaluate = slot.to_evaluate[span.n_pos:]
            self._save_checkpoint(slot)
            self._progress(slot)

    def _trim(self, seq: int, n: int) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.ctx.memory, seq, n, -1))

    def _generated(self, lora: tuple[float, ...]) -> dict[int, list[int]]:
        """Each slot of adapter scales `lora` with a sampled token to read back: that token, then the slot's draft
        when it speculates (speculative.py)."""
        generating = [s for s in self.slots if s.job is not None and s.next_token is not None and s.job.lora == lora]
        # a prompt with media is not drafted from: its stand-ins are no tokens a draft could propose or a draft
        # model read (llama-server runs no speculation with a projector at all)
        drafts = self.speculator.drafts_for([s for s in generating if not s.media], slot_n_ctx=self.slot_n_ctx,
                                            n_batch=self.n_batch) if self.speculator is not None else {}
        generated: dict[int, list[int]] = {}
        for slot in generating:
            assert slot.next_token is not None
            slot.drafts = drafts.get(slot.id, [])
            generated[slot.id], slot.next_token = [slot.next_token, *slot.drafts], None
        return generated

    def _add(self, slot: Slot, tokens: list[int], *, logits: bool, last: bool = False) -> None:
        """Puts `tokens` in the batch at the end of `slot`'s sequence: every one with logits, or only the last."""
        for i, token in enumerate(tokens):
            add_token(self.batch, token, len(slot.tokens), slot.id, logits or (last and i == len(tokens) - 1))
            slot.tokens.append(token)

    def _progress(self, slot: Slot, *, start: bool = False) -> None:
        if slot.job is not None and slot.job.request.return_progress:
            self._emit(slot.job, slot.progress(start=start))

    def _sample(self, slot: Slot, row: int, forced: int | None = None) -> None:
        """Picks `row`'s token and emits it, or finishes; a `forced` token (--spec-synth-*) stands for the pick."""
        job = slot.job
        assert job is not None and slot.assembler is not None
        if job.cancelled:
            self._release(slot)
            return
        now = time.perf_counter()
        if not slot.t_generation_start:
            slot.t_generation_start = now
            slot.prompt_ms = (now - slot.t_prompt_start) * 1000.0
        if job.request.max_tokens == 0:
            self._finish(slot, "length", "limit", truncated=False)
            return
        n_probs = job.request.n_probs
        logprob: TokenLogprob | None = None
        try:
            if n_probs > 0 and job.request.post_sampling_probs:
                token, logprob = job.sampler.sample_with_candidates(self.ctx, row, n_probs)
            else:
                token = job.sampler.sample(self.ctx, row)
                logprob = token_logprob(self.model, self.ctx, row, token, n_probs) if n_probs > 0 else None
        except GrammarDeadEnd as dead_end:
            if dead_end.complete:  # the constrained output is whole: ignore_eos cannot extend it
                self._finish(slot, "stop", "eos")
            else:
                self._emit(job, InvalidRequestError(f"{dead_end}: the logit_bias removes every token the grammar "
                                                    "allows next", param="logit_bias"))
                self._release(slot)
            return
        if forced is not None:
            token, logprob = forced, token_logprob(self.model, self.ctx, row, forced, n_probs) if n_probs > 0 else None
        slot.generated.append(token)
        if self.model.is_eog(token) and not job.request.sampling.ignore_eos:
            self._finish(slot, "stop", "eos")
            return
        text = slot.assembler.push(self.model.token_piece(token))
        if slot.assembler.stopping_word:
            self._emit_text(slot, text, token, logprob)
            self._finish(slot, "stop", "word")
            return
        max_tokens = job.request.max_tokens
        if 0 < max_tokens <= len(slot.generated):
            self._emit_text(slot, text + slot.assembler.flush(), token, logprob)
            self._finish(slot, "length", "limit")
            return
        if len(slot.tokens) + 1 >= self.slot_n_ctx and not self._shift_context(slot):
            self._emit_text(slot, text + slot.assembler.flush(), token, logprob)
            self._finish(slot, "length", "limit", truncated=True)
            return
        self._emit_text(slot, text, token, logprob)
        slot.next_token = token

    def _shift_context(self, slot: Slot) -> bool:
        return shift_slot(self.cells, slot, enabled=self.long_context.context_shift, add_bos=self.model.info.add_bos,
                          n_ctx=self.slot_n_ctx)

    def _emit_text(self, slot: Slot, text: str, token: int, logprob: TokenLogprob | None) -> None:
        assert slot.job is not None
        slot.text_parts.append(text)
        self._emit(slot.job, TextDelta(text=text, token_id=token, logprob=logprob, timings=slot.timings()))

    def _finish(self, slot: Slot, reason: FinishReason, stop_type: StopType, *, truncated: bool = False) -> None:
        job = slot.job
        assert job is not None
        self._emit(job, slot.finished(reason, stop_type, self.metrics, truncated=truncated))
        job.done = True
        self._release(slot)

    def _release(self, slot: Slot) -> None:
        if slot.job is not None:
            slot.job.sampler.close()
            with self._cv:
                self._uncount(slot.job)
        slot.job = None
        slot.next_token = None
        slot.to_evaluate = []
        slot.checkpoints = []
        slot.breaks = []
        # what the cells hold stays keyed by the stand-ins; the encoded chunks can go, their records (for slot
        # files) stay
        slot.held_media = self.projector.held(list(slot.media.values()), len(slot.tokens)) \
            if slot.media and self.projector is not None else ()
        slot.media = {}
        slot.last_used = next(self._use_counter)
        # Tokens queued for this slot but never decoded are not in the cache: forget them.
        if not llama_cpp.llama_memory_seq_rm(self.ctx.memory, slot.id, len(slot.tokens), -1):
            self._forget_cache(slot)

    def _forget_cache(self, slot: Slot) -> None:
        self._drop_cells(slot)
        slot.tokens = []

    def _fail_slot(self, slot: Slot, error: KineticError) -> None:
        """On the decode thread: the slot's request gets `error`, and the slot is freed with nothing cached (what a
        failed computation left in its cells is not known)."""
        assert slot.job is not None
        self._emit(slot.job, error)
        self._forget_cache(slot)
        self._release(slot)


def _nothing() -> None:
    pass
