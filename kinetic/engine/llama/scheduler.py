"""Slots and the one decode thread: which request runs where, and one llama_decode per step.

Every slot is a llama.cpp sequence id inside one context. A single worker thread owns the
context: each step it builds one batch holding the next token of every generating slot and as
much pending prompt as fits, calls llama_decode once, and samples each slot from its own row of
logits. So two decodes never run at once (llama.cpp's worker threads spin, and two concurrent
decodes on two cores collapse to about one token a second), every active stream advances each
step, and several slots share one batch. Each slot keeps the tokens in its KV cache and reuses
the longest common prefix of the next prompt (`cache_n`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import llama_cpp
from llama_cpp import _internals

from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.llama.sampler import Sampler, token_logprob
from kinetic.engine.text import TextAssembler
from kinetic.engine.types import (
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    SlotState,
    StopType,
    TextDelta,
    Timings,
    TokenLogprob,
    Usage,
)
from kinetic.errors import ServerError

log = logging.getLogger(__name__)


@dataclass
class Job:
    """A request on its way through the scheduler, and the way back to its event loop."""

    request: GenerationRequest
    sampler: Sampler
    loop: asyncio.AbstractEventLoop
    queue: "asyncio.Queue[Event | BaseException]"
    cancelled: bool = False
    done: bool = False

    def emit(self, event: Event | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


@dataclass
class Slot:
    id: int
    tokens: list[int] = field(default_factory=list)  # exactly what this slot's KV cache holds
    job: Job | None = None
    last_used: int = 0
    # per-job state
    prompt: list[int] = field(default_factory=list)
    to_evaluate: list[int] = field(default_factory=list)
    next_token: int | None = None
    n_cached: int = 0
    generated: list[int] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    assembler: TextAssembler | None = None
    t_prompt_start: float = 0.0
    t_generation_start: float = 0.0
    prompt_ms: float = 0.0
    n_prompt_tokens_processed: int = 0  # shown by GET /slots

    @property
    def is_processing(self) -> bool:
        return self.job is not None

    def state(self) -> SlotState:
        return SlotState(id=self.id, is_processing=self.is_processing, used=bool(self.last_used or self.job),
                         n_prompt_tokens=len(self.prompt), n_prompt_tokens_processed=self.n_prompt_tokens_processed,
                         n_prompt_tokens_cache=self.n_cached,
                         n_decoded=len(self.generated) if self.is_processing else 0)


class Scheduler:
    """Owns the generation context, its slots, the waiting queue and the decode thread."""

    def __init__(self, model: LoadedModel, *, n_ctx: int, n_slots: int, kv_unified: bool, n_threads: int,
                 n_batch: int, n_ubatch: int, decode_lock: threading.Lock):
        self.model = model
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = min(n_batch, n_ctx)
        params.n_ubatch = min(n_ubatch, params.n_batch)
        params.n_seq_max = n_slots
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.kv_unified = kv_unified
        # Full-size sliding-window cache, so a slot's cached prefix stays reusable (Gemma 3 uses SWA).
        params.swa_full = True
        params.no_perf = True
        self.ctx = model.new_context(params)
        self.n_ctx = self.ctx.n_ctx()
        self.n_batch = params.n_batch
        self.slot_n_ctx = self.n_ctx if kv_unified else self.n_ctx // n_slots
        self.batch = _internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1, verbose=model.verbose)
        self.slots = [Slot(id=i) for i in range(n_slots)]
        self.decode_lock = decode_lock
        self.metrics: dict[str, float] = {
            "prompt_tokens_total": 0, "prompt_tokens_cached_total": 0, "prompt_seconds_total": 0.0,
            "tokens_predicted_total": 0, "tokens_predicted_seconds_total": 0.0, "n_decode_total": 0,
            "n_tokens_max": 0}
        self._cv = threading.Condition()
        self._pending: deque[Job] = deque()
        self._stopping = False
        self._use_counter = itertools.count(1)
        self._thread = threading.Thread(target=self._run, name="kinetic-decode", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ from the event loop

    def enqueue(self, job: Job) -> None:
        with self._cv:
            self._pending.append(job)
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        job.cancelled = True
        with self._cv:
            if job in self._pending:
                self._pending.remove(job)
                job.sampler.close()
            self._cv.notify()

    @property
    def n_deferred(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------ the decode thread

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._pending and not any(s.job for s in self.slots):
                    self._cv.wait()
                if self._stopping:
                    return
                self._assign_pending()
            try:
                with self.decode_lock:
                    self._step()
            except Exception as exc:  # a bug must not kill the only decode thread silently
                log.exception("decode step failed")
                for slot in self.slots:
                    if slot.job is not None:
                        slot.job.emit(ServerError(f"generation failed: {exc}"))
                        self._forget_cache(slot)
                        self._release(slot)

    def _assign_pending(self) -> None:
        """Gives waiting jobs to idle slots: the one holding the longest common prefix wins."""
        for job in list(self._pending):
            idle = [s for s in self.slots if s.job is None]
            if job.request.id_slot >= 0:
                idle = [s for s in idle if s.id == job.request.id_slot]
            if not idle:
                continue
            prompt = job.request.prompt_tokens
            slot = max(idle, key=lambda s: (_common_prefix(s.tokens, prompt), -s.last_used))
            self._pending.remove(job)
            self._start(slot, job)

    def _start(self, slot: Slot, job: Job) -> None:
        prompt = job.request.prompt_tokens
        n_common = _common_prefix(slot.tokens, prompt) if job.request.cache_prompt else 0
        # The last prompt token is always evaluated again: its logits give the first sample.
        n_common = min(n_common, len(prompt) - 1)
        memory = self.ctx.memory
        if not llama_cpp.llama_memory_seq_rm(memory, slot.id, n_common, -1):
            llama_cpp.llama_memory_seq_rm(memory, slot.id, -1, -1)
            n_common = 0
        slot.tokens = list(prompt[:n_common])
        slot.job = job
        slot.prompt = list(prompt)
        slot.to_evaluate = list(prompt[n_common:])
        slot.n_cached = n_common
        slot.next_token = None
        slot.generated = []
        slot.text_parts = []
        slot.assembler = TextAssembler(job.request.stop)
        slot.t_prompt_start = 0.0
        slot.t_generation_start = 0.0
        slot.prompt_ms = 0.0
        slot.n_prompt_tokens_processed = len(slot.to_evaluate)

    def _step(self) -> None:
        for slot in self.slots:
            if slot.job is not None and slot.job.cancelled:
                self._release(slot)
        batch = self.batch.batch
        batch.n_tokens = 0
        sample_rows: list[tuple[Slot, int]] = []
        for slot in self.slots:
            if slot.job is not None and slot.next_token is not None:
                sample_rows.append((slot, batch.n_tokens))
                self._batch_add(slot.next_token, len(slot.tokens), slot.id, True)
                slot.tokens.append(slot.next_token)
                slot.next_token = None
        for slot in self.slots:
            if slot.job is None or not slot.to_evaluate:
                continue
            room = self.n_batch - batch.n_tokens
            if room <= 0:
                break
            if not slot.t_prompt_start:
                slot.t_prompt_start = time.perf_counter()
            chunk, slot.to_evaluate = slot.to_evaluate[:room], slot.to_evaluate[room:]
            for i, token in enumerate(chunk):
                last = not slot.to_evaluate and i == len(chunk) - 1
                if last:
                    sample_rows.append((slot, batch.n_tokens))
                self._batch_add(token, len(slot.tokens), slot.id, last)
                slot.tokens.append(token)
        if batch.n_tokens == 0:
            return
        status = llama_cpp.llama_decode(self.ctx.ctx, batch)
        self.metrics["n_decode_total"] += 1
        if status != 0:
            for slot, _ in sample_rows:
                if slot.job is not None:
                    slot.job.emit(ServerError(f"llama_decode failed with status {status} (KV cache full?)"))
                    self._forget_cache(slot)
                    self._release(slot)
            return
        for slot, row in sample_rows:
            if slot.job is not None:
                self._sample(slot, row)

    def _batch_add(self, token: int, pos: int, seq_id: int, logits: bool) -> None:
        batch = self.batch.batch
        i = batch.n_tokens
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq_id
        batch.logits[i] = logits
        batch.n_tokens = i + 1

    def _sample(self, slot: Slot, row: int) -> None:
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
        token = job.sampler.sample(self.ctx, row)
        n_probs = job.request.n_probs
        logprob = token_logprob(self.model, self.ctx, row, token, n_probs) if n_probs > 0 else None
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
        if len(slot.tokens) + 1 >= self.slot_n_ctx:
            self._emit_text(slot, text + slot.assembler.flush(), token, logprob)
            self._finish(slot, "length", "limit", truncated=True)
            return
        self._emit_text(slot, text, token, logprob)
        slot.next_token = token

    def _emit_text(self, slot: Slot, text: str, token: int, logprob: TokenLogprob | None) -> None:
        assert slot.job is not None
        slot.text_parts.append(text)
        slot.job.emit(TextDelta(text=text, token_id=token, logprob=logprob))

    def _finish(self, slot: Slot, reason: FinishReason, stop_type: StopType, *, truncated: bool = False) -> None:
        job = slot.job
        assert job is not None and slot.assembler is not None
        predicted_ms = max((time.perf_counter() - slot.t_generation_start) * 1000.0, 0.001)
        n_predicted = len(slot.generated)
        n_prompt = len(slot.prompt)
        timings = Timings(cache_n=slot.n_cached, prompt_n=n_prompt - slot.n_cached, prompt_ms=slot.prompt_ms,
                          predicted_n=n_predicted, predicted_ms=predicted_ms)
        usage = Usage(prompt_tokens=n_prompt, completion_tokens=n_predicted, cached_tokens=slot.n_cached)
        metrics = self.metrics
        metrics["prompt_tokens_total"] += timings.prompt_n
        metrics["prompt_tokens_cached_total"] += timings.cache_n
        metrics["prompt_seconds_total"] += slot.prompt_ms / 1000.0
        metrics["tokens_predicted_total"] += n_predicted
        metrics["tokens_predicted_seconds_total"] += predicted_ms / 1000.0
        metrics["n_tokens_max"] = max(metrics["n_tokens_max"], n_prompt + n_predicted)
        job.emit(Finished(
            finish_reason=reason,
            stop_type=stop_type,
            stopping_word=slot.assembler.stopping_word,
            text="".join(slot.text_parts),
            tokens=list(slot.generated),
            usage=usage,
            timings=timings,
            id_slot=slot.id,
            tokens_cached=len(slot.tokens),
            truncated=truncated,
        ))
        job.done = True
        self._release(slot)

    def _release(self, slot: Slot) -> None:
        if slot.job is not None:
            slot.job.sampler.close()
        slot.job = None
        slot.next_token = None
        slot.to_evaluate = []
        slot.last_used = next(self._use_counter)
        # Tokens queued for this slot but never decoded are not in the cache: forget them.
        llama_cpp.llama_memory_seq_rm(self.ctx.memory, slot.id, len(slot.tokens), -1)

    def _forget_cache(self, slot: Slot) -> None:
        llama_cpp.llama_memory_seq_rm(self.ctx.memory, slot.id, -1, -1)
        slot.tokens = []


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

