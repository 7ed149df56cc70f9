"""The engine over llama.cpp: one model, one context, N slots, one decode thread.

Every slot is a llama.cpp sequence id inside one context. A single worker thread owns the
context: each step it builds one batch holding the next token of every generating slot and as
much pending prompt as fits, calls llama_decode once, and samples each slot from its own row of
logits. So two decodes never run at once (llama.cpp's worker threads spin, and two concurrent
decodes on two cores collapse to about one token a second), every active stream advances each
step, and several slots share one batch. Each slot keeps the tokens in its KV cache and reuses
the longest common prefix of the next prompt (`cache_n`).

This is the only module that imports llama_cpp.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import itertools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

import numpy as np

from kinetic.engine.text import TextAssembler
from kinetic.engine.types import (
    Event,
    Finished,
    GenerationRequest,
    SamplingParams,
    Timings,
    TextDelta,
    TokenLogprob,
    TokenProb,
    Usage,
)
from kinetic.errors import (
    ContextOverflowError,
    InvalidRequestError,
    KineticError,
    ModelLoadError,
    UnavailableError,
)

log = logging.getLogger(__name__)

AUTO_SLOTS = 4  # llama-server's -np -1: four slots over one unified KV cache
MAX_BATCH = 2048
MAX_UBATCH = 512


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class ModelInfo:
    path: Path
    architecture: str
    description: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_params: int
    size: int
    vocab_type: int
    bos_token: str
    eos_token: str
    add_bos: bool
    chat_template: str | None
    metadata: dict[str, str]

    @property
    def ftype(self) -> str:
        """'Q4_K - Medium' out of llama.cpp's 'gemma3 270M Q4_K - Medium'."""
        parts = self.description.split(" ", 2)
        return parts[2] if len(parts) == 3 else self.description


@dataclass
class _Job:
    request: GenerationRequest
    sampler: Any
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    cancelled: bool = False
    done: bool = False

    def emit(self, event: Event | BaseException) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


@dataclass
class Slot:
    id: int
    tokens: list[int] = field(default_factory=list)  # exactly what this slot's KV cache holds
    job: _Job | None = None
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
    # shown by GET /slots
    n_prompt_tokens_processed: int = 0

    @property
    def is_processing(self) -> bool:
        return self.job is not None


class LlamaEngine:
    """Loads a GGUF and serves generation requests from an asyncio program."""

    def __init__(
        self,
        model_path: Path,
        *,
        n_ctx: int = 0,
        n_parallel: int = -1,
        n_threads: int = -1,
        embeddings: bool = False,
        verbose: bool = False,
    ):
        self.model_path = model_path
        self.requested_ctx = n_ctx
        self.n_slots = AUTO_SLOTS if n_parallel < 0 else max(1, n_parallel)
        self.kv_unified = n_parallel < 0
        self.n_threads = default_threads() if n_threads <= 0 else n_threads
        self.embeddings_enabled = embeddings
        self.verbose = verbose
        self.info: ModelInfo | None = None
        self.slots: list[Slot] = []
        self.slot_n_ctx = 0
        self.n_ctx = 0
        self.n_batch = 0
        self._cv = threading.Condition()
        self._decode_lock = threading.Lock()
        self._pending: deque[_Job] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._use_counter = itertools.count(1)
        self.metrics = {"prompt_tokens_total": 0, "prompt_tokens_cached_total": 0, "prompt_seconds_total": 0.0,
                        "tokens_predicted_total": 0, "tokens_predicted_seconds_total": 0.0, "n_decode_total": 0,
                        "n_tokens_max": 0}

    # ---------------------------------------------------------------- loading

    @property
    def ready(self) -> bool:
        return self.info is not None

    def load(self) -> None:
        """Blocking: loads the model and starts the decode thread."""
        import llama_cpp
        from llama_cpp import _internals
        from llama_cpp import _logger as llama_logger

        llama_logger.set_verbose(self.verbose)
        llama_cpp.llama_backend_init()
        self._llama = llama_cpp
        model_params = llama_cpp.llama_model_default_params()
        try:
            self.model = _internals.LlamaModel(path_model=str(self.model_path), params=model_params, verbose=self.verbose)
        except ValueError as exc:
            raise ModelLoadError(f"cannot load model {self.model_path}: llama.cpp rejected the file "
                                 "(truncated, corrupt, or an architecture this build does not know)") from exc
        self.vocab = self.model.vocab
        n_ctx_train = self.model.n_ctx_train()
        total_ctx = self.requested_ctx if self.requested_ctx > 0 else n_ctx_train
        ctx_params = llama_cpp.llama_context_default_params()
        ctx_params.n_ctx = total_ctx
        ctx_params.n_batch = min(MAX_BATCH, total_ctx)
        ctx_params.n_ubatch = min(MAX_UBATCH, ctx_params.n_batch)
        ctx_params.n_seq_max = self.n_slots
        ctx_params.n_threads = self.n_threads
        ctx_params.n_threads_batch = self.n_threads
        ctx_params.kv_unified = self.kv_unified
        # Full-size sliding-window cache, so a slot's cached prefix stays reusable (Gemma 3 uses SWA).
        ctx_params.swa_full = True
        ctx_params.no_perf = True
        try:
            self.ctx = _internals.LlamaContext(model=self.model, params=ctx_params, verbose=self.verbose)
        except ValueError as exc:
            raise ModelLoadError(f"llama.cpp could not create a context of {total_ctx} tokens for {self.model_path}") from exc
        self.n_ctx = self.ctx.n_ctx()
        self.n_batch = ctx_params.n_batch
        self.slot_n_ctx = self.n_ctx if self.kv_unified else self.n_ctx // self.n_slots
        self.batch = _internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1, verbose=self.verbose)
        self.slots = [Slot(id=i) for i in range(self.n_slots)]
        self._embedding_ctx = None
        if self.embeddings_enabled:
            self._create_embedding_context(_internals)
        metadata = self.model.metadata()
        bos, eos = self.model.token_bos(), self.model.token_eos()
        self.info = ModelInfo(
            path=self.model_path,
            architecture=metadata.get("general.architecture", ""),
            description=self.model.desc(),
            n_vocab=self.model.n_vocab(),
            n_ctx_train=n_ctx_train,
            n_embd=self.model.n_embd(),
            n_params=self.model.n_params(),
            size=self.model.size(),
            vocab_type=self.model.vocab_type(),
            bos_token=self.token_piece(bos, special=True).decode("utf-8", "replace") if bos >= 0 else "",
            eos_token=self.token_piece(eos, special=True).decode("utf-8", "replace") if eos >= 0 else "",
            add_bos=self.model.add_bos_token(),
            chat_template=metadata.get("tokenizer.chat_template"),
            metadata=metadata,
        )
        _ = self.eog_tokens  # scan once now rather than inside the first ignore_eos request
        self._thread = threading.Thread(target=self._run, name="kinetic-decode", daemon=True)
        self._thread.start()

    def _create_embedding_context(self, _internals: Any) -> None:
        llama_cpp = self._llama
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = min(self.slot_n_ctx, MAX_BATCH)
        params.n_batch = params.n_ctx
        params.n_ubatch = params.n_ctx  # one input must fit in one micro-batch for pooling
        params.n_seq_max = 1
        params.n_threads = self.n_threads
        params.n_threads_batch = self.n_threads
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_MEAN if self._model_pooling() <= 0 else self._model_pooling()
        self._embedding_ctx = _internals.LlamaContext(model=self.model, params=params, verbose=self.verbose)
        self._embedding_batch = _internals.LlamaBatch(n_tokens=params.n_ctx, embd=0, n_seq_max=1, verbose=self.verbose)
        self.embedding_n_ctx = params.n_ctx

    def _model_pooling(self) -> int:
        arch = self.model.metadata().get("general.architecture", "")
        value = self.model.metadata().get(f"{arch}.pooling_type")
        return int(value) if value is not None else -1

    def close(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # ------------------------------------------------------------ tokenizer

    def require_ready(self) -> ModelInfo:
        if self.info is None:
            raise UnavailableError("Loading model")
        return self.info

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        self.require_ready()
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (self._llama.llama_token * capacity)()
        n = self._llama.llama_tokenize(self.vocab, data, len(data), buffer, capacity, add_special, parse_special)
        if n < 0:
            buffer = (self._llama.llama_token * -n)()
            n = self._llama.llama_tokenize(self.vocab, data, len(data), buffer, -n, add_special, parse_special)
        return list(buffer[:n])

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        n = self._llama.llama_token_to_piece(self.vocab, token, buffer, 64, 0, special)
        if n < 0:
            buffer = ctypes.create_string_buffer(-n)
            n = self._llama.llama_token_to_piece(self.vocab, token, buffer, -n, 0, special)
        return buffer.raw[:n]

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return b"".join(self.token_piece(t, special=special) for t in tokens).decode("utf-8", "replace")

    @functools.cached_property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token (EOS, EOT, <end_of_turn>...): scanned once, the vocabulary is large."""
        n_vocab = self.require_ready().n_vocab
        return tuple(t for t in range(n_vocab) if self._llama.llama_vocab_is_eog(self.vocab, t))

    def valid_token(self, token: int) -> bool:
        return 0 <= token < self.require_ready().n_vocab

    # ---------------------------------------------------------- submission

    def submit(self, request: GenerationRequest) -> "Generation":
        """Validates and queues a request. Errors a client should see as 4xx are raised here, before
        any response bytes are sent."""
        info = self.require_ready()
        n_prompt = len(request.prompt_tokens)
        if n_prompt == 0:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if n_prompt >= self.slot_n_ctx:
            raise ContextOverflowError(n_prompt, self.slot_n_ctx)
        if any(not 0 <= t < info.n_vocab for t in request.prompt_tokens):
            raise InvalidRequestError("Prompt contains invalid tokens", param="prompt")
        if request.id_slot >= 0:
            request = _replace(request, id_slot=request.id_slot % self.n_slots)
        sampler = self._build_sampler(request.sampling)
        job = _Job(request=request, sampler=sampler, loop=asyncio.get_running_loop(), queue=asyncio.Queue())
        with self._cv:
            self._pending.append(job)
            self._cv.notify()
        return Generation(self, job)

    def _cancel(self, job: _Job) -> None:
        job.cancelled = True
        with self._cv:
            if job in self._pending:
                self._pending.remove(job)
            self._cv.notify()

    @property
    def n_deferred(self) -> int:
        return len(self._pending)

    def _build_sampler(self, params: SamplingParams) -> Any:
        from llama_cpp import _internals

        llama_cpp = self._llama
        chain = _internals.LlamaSampler()
        n_vocab = self.require_ready().n_vocab
        if params.grammar:
            grammar = llama_cpp.llama_sampler_init_grammar(self.vocab, params.grammar.encode("utf-8"), b"root")
            if not grammar:
                raise InvalidRequestError("Failed to initialize samplers: failed to parse grammar", param="grammar")
            llama_cpp.llama_sampler_chain_add(chain.sampler, grammar)
        bias = dict(params.logit_bias)
        if params.ignore_eos:
            bias.update({token: float("-inf") for token in self.eog_tokens})
        if bias:
            chain.add_logit_bias(n_vocab, bias)
        chain.add_penalties(n_vocab, params.repeat_last_n, params.repeat_penalty, params.frequency_penalty,
                            params.presence_penalty)
        if params.temperature <= 0:
            chain.add_greedy()
            return chain
        if params.top_k > 0:
            chain.add_top_k(params.top_k)
        if params.typical_p < 1.0:
            chain.add_typical(params.typical_p, 1)
        if params.top_p < 1.0:
            chain.add_top_p(params.top_p, 1)
        if params.min_p > 0.0:
            chain.add_min_p(params.min_p, 1)
        chain.add_temp(params.temperature)
        chain.add_dist(params.seed if params.seed >= 0 else llama_cpp.LLAMA_DEFAULT_SEED)
        return chain

    # --------------------------------------------------------- decode thread

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._pending and not any(s.job for s in self.slots):
                    self._cv.wait()
                if self._stopping:
                    return
                self._assign_pending()
            try:
                with self._decode_lock:
                    self._step()
            except Exception as exc:  # a bug must not kill the only decode thread silently
                log.exception("decode step failed")
                for slot in self.slots:
                    if slot.job is not None:
                        slot.job.emit(KineticError(f"generation failed: {exc}"))
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

    def _start(self, slot: Slot, job: _Job) -> None:
        prompt = job.request.prompt_tokens
        n_common = _common_prefix(slot.tokens, prompt) if job.request.cache_prompt else 0
        # The last prompt token is always evaluated again: its logits give the first sample.
        n_common = min(n_common, len(prompt) - 1)
        memory = self.ctx.memory
        if not self._llama.llama_memory_seq_rm(memory, slot.id, n_common, -1):
            self._llama.llama_memory_seq_rm(memory, slot.id, -1, -1)
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
        status = self._llama.llama_decode(self.ctx.ctx, batch)
        self.metrics["n_decode_total"] += 1
        if status != 0:
            for slot, _ in sample_rows:
                if slot.job is not None:
                    slot.job.emit(KineticError(f"llama_decode failed with status {status} (KV cache full?)"))
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
        token = self._llama.llama_sampler_sample(job.sampler.sampler, self.ctx.ctx, row)
        logprob = self._logprob(row, token, job.request.n_probs) if job.request.n_probs > 0 else None
        slot.generated.append(token)
        if self._llama.llama_vocab_is_eog(self.vocab, token) and not job.request.sampling.ignore_eos:
            self._finish(slot, "stop", "eos")
            return
        text = slot.assembler.push(self.token_piece(token))
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

    def _finish(self, slot: Slot, reason: str, stop_type: str, *, truncated: bool = False) -> None:
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
            finish_reason=reason,  # type: ignore[arg-type]
            stop_type=stop_type,  # type: ignore[arg-type]
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
        memory = self.ctx.memory
        self._llama.llama_memory_seq_rm(memory, slot.id, len(slot.tokens), -1)

    def _forget_cache(self, slot: Slot) -> None:
        self._llama.llama_memory_seq_rm(self.ctx.memory, slot.id, -1, -1)
        slot.tokens = []

    def _logprob(self, row: int, token: int, n_probs: int) -> TokenLogprob:
        """Pre-sampling log-probabilities (plain softmax of the logits), as llama-server reports them."""
        n_vocab = self.info.n_vocab if self.info else 0
        pointer = self._llama.llama_get_logits_ith(self.ctx.ctx, row)
        logits = np.ctypeslib.as_array(pointer, shape=(n_vocab,)).astype(np.float64)
        shifted = logits - logits.max()
        logprobs = shifted - np.log(np.exp(shifted).sum())
        top = np.argpartition(-logprobs, min(n_probs, n_vocab - 1))[:n_probs]
        top = top[np.argsort(-logprobs[top])]
        return TokenLogprob(
            **self._token_prob(token, float(logprobs[token])).__dict__,
            top_logprobs=[self._token_prob(int(t), float(logprobs[t])) for t in top],
        )

    def _token_prob(self, token: int, logprob: float) -> TokenProb:
        piece = self.token_piece(token)
        return TokenProb(id=token, token=piece.decode("utf-8", "ignore"), bytes=list(piece), logprob=logprob)

    # ------------------------------------------------------------- embeddings

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One pooled, L2-normalised vector per input (mean pooling unless the model names its own).

        Blocking; call it from a worker thread. It takes the decode lock, so it never runs at the
        same time as a generation step."""
        if self._embedding_ctx is None:
            raise KineticError("embeddings are not enabled")
        llama_cpp = self._llama
        n_embd = self.require_ready().n_embd
        vectors: list[list[float]] = []
        with self._decode_lock:
            for tokens in inputs:
                if self._embedding_ctx.memory is not None:  # encoder-only models keep no cache
                    llama_cpp.llama_memory_clear(self._embedding_ctx.memory, True)
                batch = self._embedding_batch.batch
                batch.n_tokens = 0
                for pos, token in enumerate(tokens):
                    i = batch.n_tokens
                    batch.token[i] = token
                    batch.pos[i] = pos
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = True
                    batch.n_tokens = i + 1
                if llama_cpp.llama_decode(self._embedding_ctx.ctx, batch) != 0:
                    raise KineticError("llama_decode failed while computing an embedding")
                pointer = llama_cpp.llama_get_embeddings_seq(self._embedding_ctx.ctx, 0)
                vector = np.ctypeslib.as_array(pointer, shape=(n_embd,)).astype(np.float64)
                norm = float(np.linalg.norm(vector))
                vectors.append((vector / norm if norm > 0 else vector).tolist())
        return vectors


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _replace(request: GenerationRequest, **changes: Any) -> GenerationRequest:
    import dataclasses

    return dataclasses.replace(request, **changes)


class Generation:
    """A queued request: iterate `events()`; leaving the iteration early cancels it and frees the slot."""

    def __init__(self, engine: LlamaEngine, job: _Job):
        self._engine = engine
        self._job = job

    async def events(self) -> AsyncIterator[Event]:
        try:
            while True:
                event = await self._job.queue.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            if not self._job.done:
                self._engine._cancel(self._job)

    def cancel(self) -> None:
        if not self._job.done:
            self._engine._cancel(self._job)

    async def result(self) -> tuple[list[TextDelta], Finished]:
        deltas: list[TextDelta] = []
        async for event in self.events():
            if isinstance(event, TextDelta):
                deltas.append(event)
            else:
                return deltas, event
        raise KineticError("generation ended without a result")


def grammar_from_json_schema(schema: Any) -> str:
    """GBNF text accepting exactly the JSON documents `schema` allows (llama.cpp's converter).

    Lives here because this is the one module allowed to import llama_cpp. Raises ValueError with
    the converter's reason when the schema is not one it understands."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema must be an object, but got {type(schema).__name__}")
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except RecursionError as exc:
        raise ValueError("the schema nests too deeply") from exc
    except (AssertionError, AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        # The converter reports bad schemas with asserts and incidental errors alike.
        raise ValueError(str(exc) or type(exc).__name__) from exc
