"""A slot of the scheduler and the job it serves: plain state, read by the scheduler, its prompt admission
(admission.py), speculative decoding (speculative.py), slot files and GET /slots."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from kinetic.engine.llama.inbox import LoopInbox
from kinetic.engine.llama.sampler import Sampler
from kinetic.engine.text import TextAssembler
from kinetic.engine.types import (
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    MediaSpan,
    PromptProgress,
    SlotState,
    StopType,
    Timings,
    Usage,
)


@dataclass(frozen=True)
class HeldMedia:
    """An image or clip a slot's cells hold, as a slot file records it: where its stand-ins sit in the token
    list, and mtmd's saved chunk (`record`: its size, layout and content key, not its pixels; llama-server's
    mtmd_input_chunk_save), which is all a restore needs, since the cells already hold its embeddings."""

    start: int
    n_pos: int
    n_tokens: int
    key: str
    record: bytes

    @property
    def end(self) -> int:
        return self.start + self.n_pos


class SlotBusyError(Exception):
    """The slot a slot action named is serving a request."""


@dataclass
class Job:
    """A request on its way through the scheduler, and the way back to its event loop."""

    request: GenerationRequest
    sampler: Sampler
    inbox: LoopInbox  # how events reach the event loop that owns `queue`
    queue: asyncio.Queue[Event | BaseException]
    cancelled: bool = False
    done: bool = False
    counted: bool = True  # still counted against its client's requests in flight
    group: int | None = None  # the jobs of one submit_many (a list of prompts, n_cmpl) share one
    lora: tuple[float, ...] = ()  # the adapter scales it decodes with, every adapter's (its request's or the server's)
    first_text_out: bool = False  # its first text has left the decode thread (inbox.deliver_step)
    # set on its event loop once the consumer has handled that text (a stream: written it)
    first_text_handled: threading.Event = field(default_factory=threading.Event)


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
    checkpoints: list[int] = field(default_factory=list)  # prompt positions at which to save the state
    breaks: list[int] = field(default_factory=list)  # prompt positions at which a batch ends (checkpoints among them)
    shared: int = 0  # first cells possibly shared with another slot (unified cache): never moved
    shifted: bool = False  # the context was shifted during this job (llama-server's `truncated`)
    t_prompt_start: float = 0.0
    t_generation_start: float = 0.0
    prompt_ms: float = 0.0
    n_prompt_tokens_processed: int = 0  # shown by GET /slots
    client: str = ""
    request: GenerationRequest | None = None  # the last task's, shown by GET /slots
    id_task: int = -1
    # speculative decoding: the draft in this step's batch after the last token, and the request's counts
    drafts: list[int] = field(default_factory=list)
    n_draft: int = 0
    n_draft_accepted: int = 0
    media: dict[int, MediaSpan] = field(default_factory=dict)  # the job's images and clips by first position
    lora: tuple[float, ...] = ()  # the adapter scales its cells were computed with
    # the media among `tokens` once a job has ended (its encoded chunks are freed then) or a file restored them
    held_media: tuple[HeldMedia, ...] = ()

    @property
    def is_processing(self) -> bool:
        return self.job is not None

    def begin(self, job: Job, n_cached: int, checkpoints: list[int], id_task: int, breaks: list[int]) -> None:
        """Takes `job`, whose prompt's first `n_cached` tokens the slot's cells already hold: every per-job
        field starts again."""
        request = job.request
        self.job, self.request, self.client, self.id_task = job, request, request.client, id_task
        self.prompt = list(request.prompt_tokens)
        self.tokens = self.prompt[:n_cached]
        self.to_evaluate = self.prompt[n_cached:]
        self.n_cached = n_cached
        self.n_prompt_tokens_processed = len(self.to_evaluate)
        self.checkpoints = checkpoints
        self.breaks = sorted({p for p in [*checkpoints, *breaks] if p > n_cached})
        self.next_token = None
        self.generated, self.text_parts = [], []
        self.assembler = TextAssembler(request.stop)
        self.shifted = False
        self.t_prompt_start = self.t_generation_start = self.prompt_ms = 0.0
        self.drafts, self.n_draft, self.n_draft_accepted = [], 0, 0
        self.media = {span.start: span for span in request.media}

    def room_to_break(self) -> int:
        """Prompt tokens the slot may put in this step's batch before its next break (all when none is left)."""
        here = len(self.tokens)
        while self.breaks and self.breaks[0] <= here:  # passed inside an image, evaluated apart
            self.breaks.pop(0)
        return self.breaks[0] - here if self.breaks else len(self.to_evaluate)

    def room_to_media(self) -> int:
        """Prompt tokens before the next image or clip still to evaluate (all of them when none is left)."""
        here = len(self.tokens)
        return min((start - here for start in self.media if start >= here), default=len(self.to_evaluate))

    def media_extra(self, upto: int) -> int:
        """Embeddings beyond positions in the media before `upto`: an image on an M-RoPE model takes fewer
        positions (its stand-ins in the token list) than the embeddings it counts as in usage."""
        return sum(span.extra_tokens for span in self.media.values() if span.end <= upto)

    def progress(self, *, start: bool = False) -> PromptProgress:
        """llama-server's prompt_progress: once at the start, then after each prompt batch."""
        total = len(self.prompt)
        elapsed_ms = 0.0 if start else (time.perf_counter() - self.t_prompt_start) * 1000.0
        return PromptProgress(total=total, cache=self.n_cached, processed=total - len(self.to_evaluate),
                              time_ms=elapsed_ms)

    def timings(self) -> Timings:
        """The job's llama-server `timings` so far: each streamed token's and, at the end, the answer's."""
        cached = self.n_cached + self.media_extra(self.n_cached)
        prompt = len(self.prompt) + self.media_extra(len(self.prompt))
        return Timings(cache_n=cached, prompt_n=prompt - cached, prompt_ms=self.prompt_ms,
                       predicted_n=len(self.generated),
                       predicted_ms=max((time.perf_counter() - self.t_generation_start) * 1000.0, 0.001),
                       draft_n=self.n_draft, draft_n_accepted=self.n_draft_accepted)

    def finished(self, reason: FinishReason, stop_type: StopType, metrics: dict[str, float], *,
                 truncated: bool) -> Finished:
        """The answer's last event (what the slot generated, its usage and timings), counted into the model's
        `metrics` (/metrics)."""
        assert self.assembler is not None
        timings = self.timings()
        n_predicted = len(self.generated)
        metrics["prompt_tokens_total"] += timings.prompt_n
        metrics["prompt_tokens_cached_total"] += timings.cache_n
        metrics["prompt_seconds_total"] += self.prompt_ms / 1000.0
        metrics["tokens_predicted_total"] += n_predicted
        metrics["tokens_predicted_seconds_total"] += timings.predicted_ms / 1000.0
        metrics["n_tokens_max"] = max(metrics["n_tokens_max"], len(self.prompt) + n_predicted)
        return Finished(
            finish_reason=reason, stop_type=stop_type, stopping_word=self.assembler.stopping_word,
            text="".join(self.text_parts), tokens=list(self.generated),
            usage=Usage(prompt_tokens=timings.cache_n + timings.prompt_n, completion_tokens=n_predicted,
                        cached_tokens=timings.cache_n),
            timings=timings, id_slot=self.id, tokens_cached=len(self.tokens), truncated=truncated or self.shifted)

    def state(self) -> SlotState:
        return SlotState(id=self.id, is_processing=self.is_processing, used=bool(self.last_used or self.job),
                         n_prompt_tokens=len(self.prompt), n_prompt_tokens_processed=self.n_prompt_tokens_processed,
                         n_prompt_tokens_cache=self.n_cached,
                         n_decoded=len(self.generated) if self.is_processing else 0, client=self.client,
                         id_task=self.id_task, request=self.request)
