"""What every model is served through, whatever serves it: a local llama.cpp engine behind the chat layer
(local.py) or a remote OpenAI-compatible server (upstream/), split into the roles its callers need.

Every backend is a `ModelBackend`: it says what it is (`Described`), the registry loads and unloads it
(`Lifecycle`) and reads its counters (`Counting`). The rest are roles a kind of backend has or lacks:
`Generating` (chat and completions), `Infilling`, `Tokenizing`, `Templating`, `ForwardsTokenRoutes`,
`Embedding`, `Reranking`, `Slots`, `Adapters`, `Sleeping`, `ModelFiles`, `Pool`. A backend's class names the
roles it has; a route asks for the one it uses through `role()`, and a backend without it is the one shared
501 naming the model and the route (`lacking`). What a role's backend cannot do today (a local model loaded
without --embeddings or --rerank) is data (`Capabilities`), in llama-server's words.

Routes ask a backend, never an engine: they translate the wire request to a neutral one, hand it to the
backend, and stream back what it yields (kinetic.protocols.common.streaming.respond).

Each call a request makes that a backend queues or prepares takes that request's `RequestRecord`
(kinetic.classroom.request_record), handed down by the route: the backend reads the Caller there (the
fair queue's name and priority) and notes on it the media its prompts read. Nothing comes through a
context variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

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
    """What a backend's roles can do now, as data: a local model loaded without --embeddings or --rerank has
    the role but not the capability, and its route answers 501 in llama-server's words."""

    generate: bool = True  # chat and completions (an embedding-only model does not)
    embeddings: bool = False
    rerank: bool = False


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
    """The 501 of a route the model's backend cannot serve: the one error of a missing role."""
    return NotSupportedError(f"model '{name}' cannot serve {route}: {why}")


# What one kind of backend prepares and starts: a local model's GenerationRequest (prompt tokens for its
# engine), an upstream pool's ForwardRequest (the route and body it sends). A backend starts only its own.
RequestT = TypeVar("RequestT", bound=PreparedRequest)
R = TypeVar("R")


# ------------------------------------------------------------------ what every backend is


class Described(Protocol):
    """What it is: its names, its config, what its roles can do now, and its description."""

    name: str
    aliases: tuple[str, ...]
    config: ModelConfig
    started: int  # when it was built (seconds since the epoch): /metrics' Process-Start-Time-Unix

    @property
    def capabilities(self) -> Capabilities: ...

    def describe(self) -> Description: ...


class Lifecycle(Protocol):
    """Loaded, closed and looked at by the registry."""

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


class Counting(Protocol):
    """Its counters: /metrics, the dashboard, the registry's room for a batch."""

    def stats(self, *, scrape: bool = False) -> EngineStats: ...


class ModelBackend(Described, Lifecycle, Counting, Protocol):
    """One model, served: what the registry builds (unloaded, by its factory, from a ModelConfig), holds and
    hands a route. Whatever else a route needs is a role (below), asked for with `role()`."""


# ------------------------------------------------------------------ the roles a backend has or lacks


@runtime_checkable
class Generating(Protocol[RequestT]):
    """Chat and completions. A route holds it as Generating[Any]: what `prepare_*` gave it goes back to the same
    backend's `start`, unopened but for what every prepared request shows (PreparedRequest)."""

    async def prepare_chat(self, req: ChatRequest, record: RequestRecord) -> tuple[RequestT, AnswerFormat]: ...

    async def prepare_prompt(self, req: PromptRequest, record: RequestRecord) -> RequestT: ...

    async def start(self, request: RequestT) -> Generation: ...

    async def start_together(self, requests: list[RequestT]) -> list[Generation]: ...

    def prompt_text(self, request: RequestT) -> str: ...


@runtime_checkable
class Infilling(Generating[RequestT], Protocol[RequestT]):
    """Fill-in-the-middle (/infill), started as any generation."""

    async def prepare_infill(self, req: InfillRequest, record: RequestRecord) -> RequestT: ...


@runtime_checkable
class Tokenizing(Protocol):
    """The model's tokenizer, here: the token routes and token counting."""

    async def count_chat_tokens(self, req: ChatRequest, record: RequestRecord) -> int: ...

    async def tokenize(self, parts: list[str | int], *, add_special: bool, parse_special: bool) -> list[int]:
        """Text parts tokenized (only a first text part gets the special tokens `add_special` asks for),
        token ids kept as they are, in order."""

    async def token_pieces(self, tokens: list[int]) -> list[bytes]:
        """Each token's bytes, special tokens written out."""

    async def detokenize(self, tokens: list[int]) -> str:
        """The text of the valid tokens among `tokens`, special tokens written out."""


@runtime_checkable
class Templating(Protocol):
    """The model's chat template, here: /apply-template, and a derived model's own template (its Jinja source,
    `ChatRequest.template`) rendered instead of the model's."""

    async def render(self, messages: tuple[Message, ...], *, tools: list[dict[str, Any]] | None = None,
                     template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True,
                     continue_final_message: str | None = None, template: str | None = None) -> RenderedChat: ...

    def chat_template(self, source: str) -> ChatTemplate:
        """`source` made this model's template (its BOS and EOS), as a derived model's description shows it."""


@runtime_checkable
class ForwardsTokenRoutes(Protocol):
    """The token routes (/tokenize, /detokenize, /apply-template, count_tokens) answered by the server behind."""

    async def forward_token_route(self, route: str, body: dict[str, Any]) -> dict[str, Any]: ...



@runtime_checkable
class Embedding(Protocol):
    async def embed(self, inputs: list[PromptInput], params: list[str], record: RequestRecord, *,
                    truncate: bool = False, per_token: bool = False) -> Embeddings: ...


@runtime_checkable
class Reranking(Protocol):
    async def rerank(self, query: str, documents: list[str]) -> list[RankScore]: ...


@runtime_checkable
class Slots(Protocol):
    """Its slots, here: their states (/slots, the dashboard) and their files (/slots/{id}?action=)."""

    def slot_states(self) -> list[SlotState]: ...

    async def slot_file(self, action: str, id_slot: int, path: Path | None) -> SlotFileResult: ...


@runtime_checkable
class Adapters(Protocol):
    """Its LoRA adapters and their scales (/lora-adapters)."""

    def lora_adapters(self) -> list[tuple[Path, float]]: ...

    async def set_lora_scales(self, scales: dict[int, float]) -> None: ...


@runtime_checkable
class Sleeping(Protocol):
    """Unloaded while idle and woken by a request (--sleep-idle-seconds)."""

    async def sleep(self) -> None: ...

    async def wake(self) -> None: ...


@runtime_checkable
class ModelFiles(Protocol):
    async def model_file(self) -> ModelFile:
        """The GGUF's digest, size and time (Ollama's /api/tags and /api/show)."""


@runtime_checkable
class Pool(Protocol):
    """Served by a pool of upstream servers, each of which can be drained."""

    async def drain(self, server: str, *, drain: bool, wait_s: float = 0.0) -> dict[str, Any]:
        """Takes one server of its pool out of rotation (its requests finish) or puts it back: its status."""


# Why a backend without the role cannot serve its route: the end of the 501's message (`lacking`).
LACKS: dict[type, str] = {
    Generating: "it does not generate text",
    Infilling: "it has no fill-in-the-middle here (a server behind it is reached by its OpenAI routes)",
    Tokenizing: "its tokenizer is not here: it is the server's behind it",
    Templating: "its chat template is not here: it is the server's behind it",
    ForwardsTokenRoutes: "it is answered here, with the model's own tokenizer",
    Embedding: "it does not embed",
    Reranking: "it does not rank documents here (a server behind it is reached by its OpenAI routes)",
    Slots: "its slots are not here: they are the server's behind it",
    Adapters: "its adapters are not here: they are the server's behind it",
    Sleeping: "nothing of it is loaded here to unload",
    ModelFiles: "its model file is not here: it is the server's behind it",
    Pool: "it is not served by a pool of upstream servers",
}


# (backend class, role) -> whether the class plays it. An isinstance() against a Protocol walks the protocol's
# members on every call (~10 us warm, several times that on a request's cold path); a backend class plays the same
# roles for its whole life.
_PLAYS: dict[tuple[type, type], bool] = {}


def role(backend: ModelBackend, wanted: type[R], *, name: str, route: str) -> R:
    """`backend` as the role `wanted`, or the one 501 of a missing role, naming the model (`name`, as the request
    knows it) and the route."""
    key = (type(backend), wanted)
    plays = _PLAYS.get(key)
    if plays is None:
        plays = _PLAYS[key] = isinstance(backend, wanted)
    if plays:
        return cast(R, backend)
    raise lacking(name, route, LACKS[wanted])


def rerank_off() -> NotSupportedError:
    """llama-server's words for a model loaded without --rerank."""
    return NotSupportedError("This server does not support reranking. Start it with `--reranking`")


def embeddings_off() -> NotSupportedError:
    """llama-server's words for a model loaded without --embeddings."""
    return NotSupportedError("This server does not support embeddings. Start it with `--embeddings`")
