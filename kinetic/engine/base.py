"""The engine interface: what a local backend (kinetic/backends/local.py) and the streaming layer
may ask of an engine. The llama.cpp engine satisfies it, generating or embedding-only. It is the
bottom of the engine package: it imports only the neutral types.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from kinetic.engine.types import (
    EngineStats,
    Event,
    Finished,
    GenerationRequest,
    MediaSpan,
    Modalities,
    ModelInfo,
    RankScore,
    SlotFileResult,
    SlotState,
    TextDelta,
)
from kinetic.errors import KineticError, ServerError


class Generation:
    """A submitted request seen from the event loop: iterate `events()`, or await `result()`.

    The engine pushes events (or an exception) into `queue` from whatever thread it runs on (the llama
    engine: through its loop's inbox). Leaving the iteration early cancels the request, which frees its
    slot (or drops it from the queue if it never got one).
    """

    def __init__(self, queue: asyncio.Queue[Event | BaseException], cancel: Callable[[], object],
                 end_reasoning: Callable[[], object] | None = None,
                 first_text_handled: Callable[[], object] | None = None):
        self._queue = queue
        self._cancel = cancel
        self._end_reasoning = end_reasoning  # None: nothing to end (no thinking armed for control)
        # told once the consumer is back for more after the first text (a stream has written it): the engine may
        # hold its next step until then, so that the first token is not sent while that step takes every core
        self._first_text_handled = first_text_handled
        self.done = False

    async def events(self) -> AsyncIterator[Event]:
        try:
            while True:
                event = await self._queue.get()
                if isinstance(event, BaseException):
                    self.done = True
                    raise event
                yield event
                if isinstance(event, TextDelta):
                    self._first_text_is_handled()
                if isinstance(event, Finished):
                    self.done = True
                    return
        finally:
            self._first_text_is_handled()
            if not self.done:
                self.cancel()

    def _first_text_is_handled(self) -> None:
        if self._first_text_handled is not None:
            self._first_text_handled()
            self._first_text_handled = None

    def end_reasoning(self) -> None:
        """Reasoning control: the thinking under way ends at the next token (a no-op when none is)."""
        if not self.done and self._end_reasoning is not None:
            self._end_reasoning()

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            self._cancel()

    async def result(self) -> tuple[list[TextDelta], Finished]:
        deltas: list[TextDelta] = []
        async for event in self.events():
            if isinstance(event, TextDelta):
                deltas.append(event)
            elif isinstance(event, Finished):
                return deltas, event
        raise ServerError("generation ended without a result")


class Tokenizer(Protocol):
    """The model's vocabulary: cheap, thread-safe, callable from any thread."""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str: ...

    def token_piece(self, token: int, *, special: bool = False) -> bytes: ...

    def valid_token(self, token: int) -> bool: ...


@runtime_checkable
class Engine(Tokenizer, Protocol):
    """A loaded model with generation slots (or none, for an embedding-only model)."""

    n_slots: int
    slot_n_ctx: int
    n_batch: int  # most prompt tokens decoded in one step (infill lays its context out within it)

    @property
    def ready(self) -> bool: ...

    def load(self) -> None:
        """Blocking: loads the model; called once from a worker thread."""

    def close(self, error: KineticError | None = None) -> None:
        """Unloads: every open request fails at once with `error` (default: the model was unloaded),
        each waiting one too, and every count they held is given back."""

    def refuse_waiting(self, error: KineticError) -> None:
        """A shutdown's start: the requests waiting for a slot fail with `error`, and later ones are refused;
        the running ones go on."""

    def require_ready(self) -> ModelInfo:
        """The model's description; raises UnavailableError while it loads."""

    # generation
    @property
    def can_generate(self) -> bool: ...

    async def submit(self, request: GenerationRequest) -> Generation:
        """Validates and queues a request; errors a client should see as 4xx are raised here,
        before any response bytes are sent."""

    async def submit_many(self, requests: list[GenerationRequest]) -> list[Generation]:
        """Several requests of one client call (a list of prompts, n_cmpl), started together where the
        engine can (the llama engine: same decode step, so the same arithmetic for the same prompt).
        Either all are queued or none."""

    # media (a multimodal projector)
    @property
    def modalities(self) -> Modalities:
        """What the model reads besides text (nothing without a projector)."""

    @property
    def media_marker(self) -> str:
        """The text that stands for one file in a prompt given to tokenize_media ("" without a projector)."""

    def tokenize_media(self, text: str, files: list[bytes],
                       params: list[str]) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """`text` with one media_marker per file, as tokens with each file's stand-ins, and the files' spans;
        a file the projector cannot read is a 400 naming its field in `params`."""

    # embeddings
    @property
    def embedding_n_ctx(self) -> int:
        """Longest input `embed` accepts (0: this engine has no embeddings)."""

    @property
    def embedding_pooling(self) -> str:
        """How `embed_all` pools: "mean", "cls", "last", "rank", or "none" (a vector per token)."""

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """Blocking: one pooled, L2-normalised vector per token list."""

    def embed_all(self, inputs: list[list[int]]) -> list[list[list[float]]]:
        """Blocking: raw vectors per token list, one pooled or (pooling none) one per token."""

    # slot files (llama-server's POST /slots/{id}); blocking, refused while the slot is busy
    def slot_save(self, id_slot: int, path: Path) -> SlotFileResult: ...

    def slot_restore(self, id_slot: int, path: Path) -> SlotFileResult: ...

    def slot_erase(self, id_slot: int) -> SlotFileResult: ...

    # --sleep-idle-seconds (kinetic/model_registry/idle_sleep.py): unloaded while idle, described as it was
    sleeping: bool

    def sleep(self) -> None:
        """Blocking: frees the model while it is idle; its description and counters stay readable."""

    def wake(self) -> None:
        """Blocking: loads it again after sleep()."""

    # reranking (--rerank: a model with a ranking head)
    def rerank(self, query: str, documents: list[str]) -> list[RankScore]:
        """Blocking: each document's score against the query, in their order."""

    # LoRA adapters loaded with the model (GET/POST /lora-adapters)
    def lora_adapters(self) -> list[tuple[Path, float]]: ...

    def set_lora_scales(self, scales: dict[int, float]) -> None:
        """Blocking: waits for the current decode step."""

    # state, for /slots, /props and /metrics
    def slot_states(self) -> list[SlotState]: ...

    @property
    def speculative_types(self) -> tuple[str, ...]:
        """The speculative decoding kinds the slots run (llama-server's `speculative.types`); () for none."""

    def stats(self, *, scrape: bool = False) -> EngineStats:
        """Counters and gauges; `scrape` (GET /metrics only) starts the next rate interval."""

