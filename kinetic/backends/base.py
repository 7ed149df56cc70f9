"""The one interface every model is served through, whatever serves it: a local llama.cpp engine
behind the chat layer (local.py) or a remote OpenAI-compatible server (upstream/).

Routes ask a backend, never an engine: they translate the wire request to a neutral one, hand it
to the backend, and stream back what it yields (kinetic.protocols.common.streaming.respond). What a backend cannot
do is data (`Capabilities`), checked by the route, which answers 501 naming itself (`lacking`).

Each call a request makes that a backend queues or prepares takes that request's `RequestRecord`
(kinetic.classroom.request_record), handed down by the route: the backend reads the Caller there (the
fair queue's name and priority) and notes on it the media its prompts read. Nothing comes through a
context variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from kinetic.backends.config import ModelConfig
from kinetic.backends.model_file import ModelFile
from kinetic.chat.prepare import RenderedChat
from kinetic.chat.templates import ChatTemplate
from kinetic.chat.types import (
    AnswerFormat,
    ChatRequest,
    InfillRequest,
    Message,
    PreparedRequest,
    PromptInput,
    PromptRequest,
)
from kinetic.classroom.request_record import RequestRecord
from kinetic.engine.base import Generation
from kinetic.engine.types import (
    EngineStats,
    Modalities,
    ModelInfo,
    RankScore,
    SlotFileResult,
    SlotState,
)
from kinetic.errors import KineticError, NotSupportedError


@dataclass(frozen=True)
class Capabilities:
    """What a model's backend can do, as data: a route whose capability is False answers 501."""

    generate: bool = True  # chat and completions (an embedding-only model does not)
    infill: bool = True
    embeddings: bool = False
    rerank: bool = False
    tokenizer: bool = True  # kinetic holds the tokenizer and template: token routes, counting, rendering
    forwards_token_routes: bool = False  # /tokenize, /detokenize, /apply-template answered by the server behind
    slots: bool = True  # slot states and slot files
    lora: bool = False
    sleep: bool = False  # can be unloaded while idle and woken by a request (--sleep-idle-seconds)
    pool: bool = False  # served by a pool of upstream servers, each of which can be drained


@dataclass(frozen=True)
class Description:
    """A loaded model as the listing routes show it (/props, /v1/models, /api/tags, /api/show)."""

    name: str
    aliases: tuple[str, ...]
    info: ModelInfo | None  # None: a remote model, whose file kinetic never sees
    n_ctx: int  # one slot's context (0: the remote server's own)
    n_slots: int
    template: ChatTemplate | None
    pooling: str  # how embeddings are pooled ("" when the backend does not say)
    fingerprint: str
    # a remote model's servers: each one's URL, state, load, requests served and cache hit rate
    members: list[dict[str, Any]] = field(default_factory=list)
    speculative_types: tuple[str, ...] = ()  # the speculative decoding kinds its slots run ("" none)
    modalities: Modalities = field(default_factory=Modalities)  # what its projector reads besides text
    media_marker: str = ""  # the text that stands for one file in a raw prompt (/completion multimodal_data)


@dataclass(frozen=True)
class Embeddings:
    """One vector per input (pooled), or with `per_token` a list of rows per input, and the tokens read."""

    vectors: list[Any]
    n_tokens: int


def lacking(name: str, route: str, why: str) -> NotSupportedError:
    """The 501 of a route whose capability the model's backend lacks."""
    return NotSupportedError(f"model '{name}' cannot serve {route}: {why}")


# What one kind of backend prepares and starts: a local model's GenerationRequest (prompt tokens for its
# engine), an upstream pool's ForwardRequest (the route and body it sends). A backend starts only its own.
RequestT = TypeVar("RequestT", bound=PreparedRequest)


class ModelBackend(Protocol[RequestT]):
    """One model, served. Built unloaded by the registry's factory from a ModelConfig. Routes hold it as
    ModelBackend[Any]: what `prepare_*` gave them goes back to the same backend's `start`, unopened but for
    what every prepared request shows (PreparedRequest)."""

    name: str
    aliases: tuple[str, ...]
    config: ModelConfig
    started: int  # when it was built (seconds since the epoch): /metrics' Process-Start-Time-Unix

    # lifecycle, driven by the registry
    @property
    def ready(self) -> bool: ...

    async def load(self) -> None: ...

    def close(self, error: Exception | None = None) -> None:
        """Blocking, from any thread: every open answer and waiting request fails with `error`."""

    def refuse_waiting(self, error: KineticError) -> None:
        """From the event loop, a shutdown's start: each waiting request fails with `error` now, and each later
        one is refused with it; the running ones go on."""

    @property
    def busy(self) -> bool:
        """Requests running or waiting (an LRU unload passes it by)."""

    @property
    def sleeping(self) -> bool:
        """Unloaded while idle (--sleep-idle-seconds) until a request wakes it; described as it was."""

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...

    # what it is
    @property
    def capabilities(self) -> Capabilities: ...

    def describe(self) -> Description: ...

    async def model_file(self) -> ModelFile:
        """The GGUF's digest, size and time (Ollama's /api/tags and /api/show); a remote model has none."""

    # generation
    async def prepare_chat(self, req: ChatRequest, record: RequestRecord) -> tuple[RequestT, AnswerFormat]: ...

    async def prepare_prompt(self, req: PromptRequest, record: RequestRecord) -> RequestT: ...

    async def prepare_infill(self, req: InfillRequest, record: RequestRecord) -> RequestT: ...

    async def start(self, request: RequestT) -> Generation: ...

    async def start_together(self, requests: list[RequestT]) -> list[Generation]: ...

    def with_template(self, template: str) -> ModelBackend[RequestT]:
        """This backend, rendering chats with the Jinja `template` instead of its own (a derived model's)."""

    # token-level work
    async def count_chat_tokens(self, req: ChatRequest, record: RequestRecord) -> int: ...

    async def render(self, messages: tuple[Message, ...], *, tools: list[dict[str, Any]] | None = None,
                     template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True,
                     continue_final_message: str | None = None) -> RenderedChat: ...

    async def tokenize(self, parts: list[str | int], *, add_special: bool, parse_special: bool) -> list[int]:
        """Text parts tokenized (only a first text part gets the special tokens `add_special` asks for),
        token ids kept as they are, in order."""

    async def token_pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's bytes, special tokens written out."""

    async def detokenize(self, tokens: list[int]) -> str:
        """The text of the valid tokens among `tokens`, special tokens written out."""

    def prompt_text(self, request: RequestT) -> str: ...

    async def forward_token_route(self, route: str, body: dict[str, Any]) -> dict[str, Any]: ...

    # embeddings and rerank
    async def embed(self, inputs: list[PromptInput], params: list[str], record: RequestRecord, *,
                    truncate: bool = False, per_token: bool = False) -> Embeddings: ...

    async def rerank(self, query: str, documents: list[str]) -> list[RankScore]: ...

    # slots, adapters, counters
    def slot_states(self) -> list[SlotState]: ...

    async def slot_file(self, action: str, id_slot: int, path: Path | None) -> SlotFileResult: ...

    def lora_adapters(self) -> list[tuple[Path, float]]: ...

    async def set_lora_scales(self, scales: dict[int, float]) -> None: ...

    def stats(self, *, scrape: bool = False) -> EngineStats: ...

    async def drain(self, server: str, *, drain: bool, wait_s: float = 0.0) -> dict[str, Any]:
        """Takes one server of its pool out of rotation (its requests finish) or puts it back: its status."""


def require(capable: bool, backend: ModelBackend[Any], route: str, why: str) -> None:
    """Raises the 501 naming `route` unless the backend has the capability (`capable`)."""
    if not capable:
        raise lacking(backend.name, route, why)


def rerank_off() -> NotSupportedError:
    """llama-server's words for a model loaded without --rerank."""
    return NotSupportedError("This server does not support reranking. Start it with `--reranking`")


def embeddings_off() -> NotSupportedError:
    """llama-server's words for a model loaded without --embeddings."""
    return NotSupportedError("This server does not support embeddings. Start it with `--embeddings`")
