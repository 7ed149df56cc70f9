"""LlamaEngine: the Engine interface over one GGUF, assembled from the model, scheduler and embeddings."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio

from kinetic.engine.base import Generation
from kinetic.engine.llama import slot_files
from kinetic.engine.llama.compute_thread import CallsOnly
from kinetic.engine.llama.embeddings import EmbeddingContext
from kinetic.engine.llama.inbox import inbox_for
from kinetic.engine.llama.media import MEDIA_MARKER, Projector
from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.llama.reasoning_budget import BudgetedSampler
from kinetic.engine.llama.rerank import rerank_inputs, score
from kinetic.engine.llama.sampler import Sampler, quick_to_build
from kinetic.engine.llama.scheduler import Scheduler
from kinetic.engine.llama.slots import Job, Slot, SlotBusyError
from kinetic.engine.options import EngineConfig, default_threads
from kinetic.engine.turns import DecodeLock, DecodeTurns
from kinetic.engine.types import (
    EngineStats,
    Event,
    GenerationRequest,
    MediaSpan,
    Modalities,
    ModelInfo,
    RankScore,
    SlotFileResult,
    SlotState,
)
from kinetic.errors import (
    ContextOverflowError,
    InvalidRequestError,
    KineticError,
    ModelLoadError,
    NotSupportedError,
    UnavailableError,
)
from kinetic.scheduling.inflight import InFlight

# -np -1: slots over one unified KV cache, as llama-server, but 16 of them rather than its 4. A class
# sends many short requests at once; batching them into one step serves 16 students about as fast as
# 4 (bench/bench_streams.py class-size: 40 students within a 2 s p95 TTFT on 2 cores, against 16
# with 4 slots), and in one cell pool a slot costs no memory until it holds tokens.
AUTO_SLOTS = 16
SLOT_POLL_S = 0.05  # how often a slot action looks again at a busy slot
RATE_GAUGES = ("prompt_tokens_seconds", "predicted_tokens_seconds")  # /metrics gauges over the window between scrapes

log = logging.getLogger(__name__)
T = TypeVar("T")


# Encoder architectures llama.cpp runs for embeddings only (no causal decoder to sample from).
ENCODER_ARCHITECTURES = frozenset({"bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2", "jina-bert-v3",
                                   "modern-bert", "neo-bert", "eurobert"})


def is_embedding_only(model: LoadedModel) -> bool:
    """A BERT-style embedding GGUF: an encoder architecture, or one that declares non-causal attention."""
    info = model.info
    causal = info.metadata.get(f"{info.architecture}.attention.causal")
    return info.architecture in ENCODER_ARCHITECTURES or str(causal).lower() == "false"


def reasoning_control(job: Job) -> Callable[[], None] | None:
    """How reasoning control ends the job's thinking, when its request armed it."""
    sampler = job.sampler
    if isinstance(sampler, BudgetedSampler) and sampler.tracker.budget.controllable:
        return sampler.tracker.end_now
    return None


class LlamaEngine:
    """One GGUF served from N slots of one llama.cpp context (see scheduler.py for the decode loop)."""

    def __init__(self, model_path: Path, config: EngineConfig = EngineConfig(), *,  # noqa: B008  frozen dataclass
                 max_in_flight_per_client: int = 0, decode_lock: DecodeLock | None = None,
                 in_flight: InFlight | None = None):
        self.model_path = model_path
        self.config = config
        self.requested_ctx = config.n_ctx
        self.n_slots = AUTO_SLOTS if config.n_parallel < 0 else max(1, config.n_parallel)
        self.options = config.options  # -ngl, -fa, -ctk... (kinetic.engine.llama.params builds llama.cpp's params)
        self.spec = config.spec  # speculative decoding (-md, --spec-type...): speculative.py
        self.projector = config.projector  # the multimodal projector (-mm, -hf's mmproj); its path None: text only
        self.kv_unified = config.n_parallel < 0 if self.options.kv_unified is None else self.options.kv_unified
        self.n_threads = default_threads() if config.n_threads <= 0 else config.n_threads
        self.n_batch = config.n_batch
        self.n_ubatch = config.n_ubatch
        self.embeddings_enabled = config.embeddings
        self.fair_share = config.fair_share
        self.max_queue = config.max_queue  # --max-queue: the waiting line's cap (0: none)
        self.max_in_flight_per_client = max_in_flight_per_client
        self.in_flight = in_flight  # router mode: every model's requests counted per key together
        self.cache_ram_mib = config.cache_ram_mib
        self.ctx_checkpoints = config.ctx_checkpoints
        self.long_context = config.long_context  # --context-shift, --cache-reuse (context_shift.py)
        self.pooling = config.pooling  # None: the model's own (mean when it declares none)
        self._projector: Projector | None = None
        self._closed = False  # close() was called: requests get a 503, not "an embedding model"
        # --sleep-idle-seconds (kinetic/model_registry/idle_sleep.py): unloaded until woken, its description kept
        self.sleeping = False
        self._asleep: tuple[ModelInfo, EngineStats] | None = None
        self._asleep_rates_shown = False  # a scrape while asleep reported the snapshot's rate gauges
        self._asleep_modalities = Modalities()
        self._scrape = {"prompt_tokens_total": 0.0, "prompt_seconds_total": 0.0, "tokens_predicted_total": 0.0,
                        "tokens_predicted_seconds_total": 0.0}  # counters at the previous /metrics scrape
        self.verbose = config.verbose
        self.slot_n_ctx = 0
        self._model: LoadedModel | None = None
        self._scheduler: Scheduler | None = None
        self._embeddings: EmbeddingContext | None = None
        self._calls_only: CallsOnly | None = None  # an embedding-only model's part of the compute thread
        self.generates = True  # False once load() finds an embedding-only (encoder) model
        # Generation steps and embedding decodes take turns on the CPU; in router mode every model's
        # engine gets the same DecodeTurns, so two models never decode at once either.
        self._decode_lock: DecodeLock = decode_lock if decode_lock is not None else DecodeTurns()

    # ---------------------------------------------------------------- lifecycle

    @property
    def ready(self) -> bool:
        return self._scheduler is not None or self._embeddings is not None

    def load(self) -> None:
        self._closed = False
        model = LoadedModel(self.model_path, verbose=self.verbose, options=self.options)
        if is_embedding_only(model):
            self._load_embedding_only(model)
            return
        long_context = self.long_context
        if self.projector.enabled and (long_context.context_shift or long_context.cache_reuse):
            # shifting or moving cells would split an image's embeddings: llama-server turns both off too
            log.warning("--context-shift and --cache-reuse are not supported with a multimodal projector: both off")
            long_context = replace(long_context, context_shift=False, cache_reuse=0)
        total_ctx = self.requested_ctx if self.requested_ctx > 0 else model.info.n_ctx_train
        if self.requested_ctx <= 0 and self.long_context.slot_limit > 0:  # --kv-unified-per-slot sizes the pool
            total_ctx = self.n_slots * self.long_context.slot_limit
        try:
            scheduler = Scheduler(model, n_ctx=total_ctx, n_slots=self.n_slots, kv_unified=self.kv_unified,
                                  n_threads=self.n_threads, n_batch=self.n_batch, n_ubatch=self.n_ubatch,
                                  decode_lock=self._decode_lock, fair=self.fair_share, max_queue=self.max_queue,
                                  max_in_flight=self.max_in_flight_per_client, cache_ram_mib=self.cache_ram_mib,
                                  ctx_checkpoints=self.ctx_checkpoints, in_flight=self.in_flight,
                                  long_context=long_context, spec=self.spec)
        except ValueError as exc:
            raise ModelLoadError(f"llama.cpp could not create a context of {total_ctx} tokens "
                                 f"for {self.model_path}") from exc
        projector = None
        try:
            if self.projector.enabled:  # mtmd's warm-up encodes: on the decode thread, as every computation
                projector = scheduler.projector = scheduler.call(partial(Projector, model, self.projector,
                                                                         self.n_threads))
            if self.embeddings_enabled:
                self._embeddings = EmbeddingContext(model, n_ctx=scheduler.slot_n_ctx, n_threads=self.n_threads,
                                                    decode_lock=self._decode_lock, pooling=self.pooling)
        except BaseException:
            scheduler.close()  # its context and decode thread go with the failed load
            raise
        self._model = model
        self._projector = projector
        self.slot_n_ctx = scheduler.slot_n_ctx
        self._scheduler = scheduler

    def _load_embedding_only(self, model: LoadedModel) -> None:
        """A BERT-style encoder: one pooled embedding context, no generation slots and no sampler."""
        # an encoder reads at most the positions it was trained on (BERT: 512)
        n_ctx = min(self.requested_ctx, model.info.n_ctx_train) if self.requested_ctx > 0 else model.info.n_ctx_train
        self._embeddings = EmbeddingContext(model, n_ctx=n_ctx, n_threads=self.n_threads,
                                            decode_lock=self._decode_lock, pooling=self.pooling)
        # no decode steps here: its computations still run on the compute thread (compute_thread.py says why)
        self._calls_only = CallsOnly()
        self.generates = False
        self.n_slots = 0
        self.slot_n_ctx = self._embeddings.n_ctx
        self._model = model

    def close(self, error: KineticError | None = None) -> None:
        """Stops the decode thread and lets llama.cpp free the contexts and weights (an unload, or the
        server's shutdown): every open request fails at once with `error` (default: the model was
        unloaded), in its protocol's way."""
        self._closed = True
        if self._scheduler is not None:
            self._scheduler.close(error)
        if self._calls_only is not None:
            self._calls_only.close(error)
        self._scheduler = None
        self._calls_only = None
        self._embeddings = None
        self._model = None
        self._projector = None

    def refuse_waiting(self, error: KineticError) -> None:
        if self._scheduler is not None:
            self._scheduler.refuse_waiting(error)

    def sleep(self) -> None:
        """Blocking: frees the weights and contexts of an idle model; /props, /v1/models and /metrics still
        describe it (as llama-server's cached answers do) until wake() loads it again."""
        self._asleep = (self._require_model().info, self.stats())
        self._asleep_rates_shown = False
        self._asleep_modalities = self.modalities
        self.sleeping = True
        self.close()
        # some of the Python objects that own llama.cpp's contexts and weights sit in reference cycles: without a
        # collection now they, and the memory, would stay until Python's next full collection (seen: RSS unchanged)
        gc.collect()

    def wake(self) -> None:
        """Blocking: loads the model again after sleep(). The counters run on from where they were (llama-server's
        metrics outlive its sleep); a rate window a scrape reported while asleep is not reported again."""
        self.load()
        scheduler = self._scheduler
        if scheduler is not None and self._asleep is not None:
            for name, value in self._asleep[1].counters.items():
                before = scheduler.metrics.get(name, 0)
                scheduler.metrics[name] = max(before, value) if name == "n_tokens_max" else before + value
            if self._asleep_rates_shown:
                self._scrape = {name: self._asleep[1].counters.get(name, 0.0) for name in self._scrape}
        self.sleeping = False

    def require_ready(self) -> ModelInfo:
        if self.sleeping and self._model is None and self._asleep is not None:
            return self._asleep[0]
        return self._require_model().info

    def _require_model(self) -> LoadedModel:
        if self._model is None or not self.ready:
            raise UnavailableError("Loading model")
        return self._model

    # ---------------------------------------------------------------- tokenizer

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._require_model().tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return self._require_model().detokenize(tokens, special=special)

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        return self._require_model().token_piece(token, special=special)

    def valid_token(self, token: int) -> bool:
        return self._require_model().valid_token(token)

    # ---------------------------------------------------------------- media

    @property
    def modalities(self) -> Modalities:
        """What the loaded projector reads (while asleep: what it read)."""
        if self._projector is not None:
            return self._projector.modalities
        return self._asleep_modalities if self.sleeping else Modalities()

    @property
    def media_marker(self) -> str:
        return MEDIA_MARKER if self.projector.enabled else ""

    def tokenize_media(self, text: str, files: list[bytes],
                       params: list[str]) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """A prompt holding one media_marker per file: its tokens, each file's stand-ins among them."""
        self._require_model()
        if self._projector is None:
            raise InvalidRequestError("Multimodal data provided, but model does not support multimodal requests.",
                                      param=params[0] if params else "prompt")
        return self._projector.tokenize(text, files, params)

    # ---------------------------------------------------------------- generation

    @property
    def can_generate(self) -> bool:
        return self.generates

    async def submit(self, request: GenerationRequest) -> Generation:
        (generation,) = await self.submit_many([request])
        return generation

    async def submit_many(self, requests: list[GenerationRequest]) -> list[Generation]:
        """Queues requests together, so that they start in the same decode step and then advance in
        lockstep, as llama-server runs the prompts of one request (`[p1, p2]`, n_cmpl); copies of one
        prompt also start from the same KV cells (Scheduler._twin). llama.cpp's arithmetic depends on
        the shape of each batch: two copies of one prompt evaluated in differently shaped batches may
        part ways at a near tie even when greedy (llama.cpp's test_completion_with_tokens_input)."""
        scheduler = self._scheduler_or_fail()
        jobs: list[Job] = []
        scheduler.preparing(len(requests))
        try:
            for request in requests:
                jobs.append(await self._job(request))
            scheduler.enqueue_many(jobs)
        except BaseException:
            for job in jobs:
                job.sampler.close()
            raise
        finally:
            scheduler.preparing(-len(requests))
        return [Generation(job.queue, partial(scheduler.cancel, job), end_reasoning=reasoning_control(job),
                           first_text_handled=job.first_text_handled.set) for job in jobs]

    def _scheduler_or_fail(self) -> Scheduler:
        scheduler = self._scheduler
        if scheduler is None and self._closed:
            raise UnavailableError(f"the model {self.model_path.name} was unloaded")
        if scheduler is None:
            raise InvalidRequestError(f"{self.model_path.name} is an embedding model: it does not generate text "
                                      "(use /v1/embeddings)", param="model")
        return scheduler

    async def _job(self, request: GenerationRequest) -> Job:
        model = self._require_model()
        n_prompt = len(request.prompt_tokens)
        if n_prompt == 0:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if n_prompt >= self.slot_n_ctx:
            raise ContextOverflowError(n_prompt, self.slot_n_ctx)
        text_tokens = request.text_tokens
        if any(not model.valid_token(t) for t in text_tokens):
            raise InvalidRequestError("Prompt contains invalid tokens", param="prompt")
        if request.media and request.media[-1].end >= n_prompt:
            # its first sample would come from an embedding row; every projector closes media with a text token
            raise InvalidRequestError("the prompt must not end with an image or audio clip", param="prompt")
        if request.id_slot >= 0:
            request = replace(request, id_slot=request.id_slot % self.n_slots)
        # Parsing a grammar, feeding a long prompt to the penalties: both off the event loop (quick_to_build).
        budget = request.reasoning_budget  # --reasoning-budget: a sampler that forces the end of thinking
        make = Sampler if budget is None else partial(BudgetedSampler, budget=budget)
        if quick_to_build(request.sampling, len(text_tokens)):
            sampler = make(model, request.sampling, text_tokens)
        else:
            sampler = await anyio.to_thread.run_sync(make, model, request.sampling, text_tokens)
        queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()
        return Job(request=request, sampler=sampler, inbox=inbox_for(asyncio.get_running_loop()), queue=queue,
                   lora=model.lora_scales(request.lora))

    # ---------------------------------------------------------------- embeddings

    @property
    def embedding_n_ctx(self) -> int:
        return self._embeddings.n_ctx if self._embeddings is not None else 0

    @property
    def embedding_pooling(self) -> str:
        return self._embeddings.pooling if self._embeddings is not None else ""

    # Embeddings and reranking go to the compute thread one input a call: a request of many inputs held every
    # stream of every model still while it ran (32 inputs on the bundled Gemma: a 12.6 s gap in a stream).
    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        context = self._require_embeddings()
        return [self._compute(partial(context.embed, tokens)) for tokens in inputs]

    def embed_all(self, inputs: list[list[int]]) -> list[list[list[float]]]:
        context = self._require_embeddings()
        return [self._compute(partial(context.embed_raw, tokens)) for tokens in inputs]

    def rerank(self, query: str, documents: list[str]) -> list[RankScore]:
        """Blocking: each document's score against the query (--rerank: pooling rank), in their order."""
        context = self._require_embeddings()
        return [self._compute(partial(score, context, tokens)) for tokens in rerank_inputs(context, query, documents)]

    def _compute(self, work: Callable[[], T]) -> T:
        """Runs a llama.cpp computation on the process's one compute thread (compute_thread.py says why)."""
        if self._scheduler is not None:
            return self._scheduler.call(work)
        if self._calls_only is not None:
            return self._calls_only.call(work)
        raise UnavailableError(f"the model {self.model_path.name} was unloaded")

    def _require_embeddings(self) -> EmbeddingContext:
        if self._embeddings is None and self._closed:
            raise UnavailableError(f"the model {self.model_path.name} was unloaded")
        if self._embeddings is None:
            raise NotSupportedError("This server does not support embeddings. Start it with `--embeddings`")
        return self._embeddings

    # ---------------------------------------------------------------- slot files

    def slot_save(self, id_slot: int, path: Path) -> SlotFileResult:
        return self._on_idle_slot(id_slot, lambda scheduler, slot: slot_files.save(scheduler, slot, path))

    def slot_restore(self, id_slot: int, path: Path) -> SlotFileResult:
        return self._on_idle_slot(id_slot, lambda scheduler, slot: slot_files.restore(scheduler, slot, path))

    def slot_erase(self, id_slot: int) -> SlotFileResult:
        return self._on_idle_slot(id_slot, slot_files.erase)

    def _on_idle_slot(self, id_slot: int, action: Callable[[Scheduler, Slot], SlotFileResult]) -> SlotFileResult:
        """Blocking: runs `action` once the slot is idle (llama-server defers the task while it is busy)."""
        self._require_model()
        scheduler = self._scheduler
        assert scheduler is not None
        while True:
            try:
                return scheduler.with_idle_slot(id_slot % self.n_slots, lambda slot: action(scheduler, slot))
            except SlotBusyError:
                time.sleep(SLOT_POLL_S)


    # ---------------------------------------------------------------- LoRA adapters

    def lora_adapters(self) -> list[tuple[Path, float]]:
        """The server's adapters (their ids are their positions) and their current scales."""
        return [(adapter.path, adapter.scale) for adapter in self._require_model().lora]

    def set_lora_scales(self, scales: dict[int, float]) -> None:
        """Blocking: the adapters' new scales by id, for the requests that start from now on without their own
        `lora` (as in llama-server, one running keeps the scales it started with); an adapter left out gets 0
        and an unknown id is ignored. The scheduler sets each step's scales on its context itself."""
        model = self._require_model()
        with self._decode_lock:
            for index, adapter in enumerate(model.lora):
                adapter.scale = scales.get(index, 0.0)
            if self._embeddings is not None:
                model.apply_lora(self._embeddings.ctx)

    # ---------------------------------------------------------------- state

    @property
    def speculative_types(self) -> tuple[str, ...]:
        """The speculative decoding kinds the slots run (none on a model whose state cannot be rolled back)."""
        speculator = self._scheduler.speculator if self._scheduler is not None else None
        return speculator.types if speculator is not None else ()

    def slot_states(self) -> list[SlotState]:
        return [slot.state() for slot in self._scheduler.slots] if self._scheduler else []

    def stats(self, *, scrape: bool = False) -> EngineStats:
        """The engine's counters and gauges. The rate gauges cover the time since the previous
        `scrape` (GET /metrics, as llama-server's do): other readers (the dashboard, the router,
        the digest) leave that baseline alone."""
        scheduler = self._scheduler
        if scheduler is None and self.sleeping and self._asleep is not None:
            info, snapshot = self._asleep
            if scrape:  # as llama-server: the snapshot's rates are reported once, then the window is empty
                self._asleep = (info, replace(snapshot, gauges={**snapshot.gauges, **dict.fromkeys(RATE_GAUGES, 0.0)}))
                self._asleep_rates_shown = True
            return snapshot
        if scheduler is None:
            return EngineStats(counters={}, requests_processing=0, requests_deferred=0)
        counters = dict(scheduler.metrics)
        if self._embeddings is not None:
            for name, value in self._embeddings.counters.items():
                counters[name] = counters.get(name, 0) + value
        # llama-server's rate gauges cover the time since the previous scrape
        delta = {name: counters.get(name, 0.0) - before for name, before in self._scrape.items()}
        if scrape:
            self._scrape = {name: counters.get(name, 0.0) for name in self._scrape}
        gauges = {
            "prompt_tokens_seconds": delta["prompt_tokens_total"] / delta["prompt_seconds_total"]
            if delta["prompt_seconds_total"] > 0 else 0.0,
            "predicted_tokens_seconds": delta["tokens_predicted_total"] / delta["tokens_predicted_seconds_total"]
            if delta["tokens_predicted_seconds_total"] > 0 else 0.0,
            "n_busy_slots_per_decode":
                counters.get("n_busy_slots_total", 0) / max(counters.get("n_decode_total", 0), 1),
        }
        return EngineStats(counters=counters, requests_processing=sum(1 for s in scheduler.slots if s.is_processing),
                           requests_deferred=scheduler.n_deferred, gauges=gauges,
                           deferred_by_client=scheduler.deferred_by_client())
