"""What every protocol adapter shares: the engine, the chat layer, the served name and defaults.

Built by the model registry (kinetic/router/registry.py), one per model: the `prepare_*` methods run
the chat layer's CPU work (templates, tokenizer, grammars) in a worker thread, so a request with
a large schema never stalls the streams other clients are reading.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from kinetic import __version__
from kinetic.chat.infill import check_fim
from kinetic.chat.prepare import ChatLayer, RenderedChat, ServerDefaults
from kinetic.chat.templates import ChatTemplate, choose_template
from kinetic.chat.types import ChatRequest, InfillRequest, Message, PreparedChat, PromptInput, PromptRequest
from kinetic.classroom.identity import CLIENT
from kinetic.engine.base import Engine
from kinetic.engine.types import GenerationRequest, ModelInfo, RankScore, SamplingParams
from kinetic.errors import InvalidRequestError, NotSupportedError
from kinetic.models import cache_dir
from kinetic.prompt_log import write_prompt
from kinetic.sampling_defaults import default_sampling, default_stops
from kinetic.settings import ServerSettings


@dataclass(frozen=True)
class ModelFile:
    """The served GGUF on disk: its sha256 (what Ollama calls the digest), size and mtime."""

    sha256: str
    size: int
    modified: float  # seconds since the epoch


BUSY_PAUSE_S = 0.05  # per MiB hashed while the engine decodes: at most 20 MiB/s then
DIGEST_CACHE = "digests.json"  # in kinetic's cache dir: path -> size, mtime, sha256


def read_model_file(path: Path, busy: Callable[[], bool] = lambda: False) -> ModelFile:
    """Blocking: the GGUF's sha256, from kinetic's digest cache when the file is unchanged, else
    hashed (seconds for a few GB) and remembered. Hashing slows down while `busy()` (the engine
    is decoding): a core taken by hashing makes llama.cpp's spinning threads stall a stream for a
    second. A model that is not a file on disk (a test engine) gets the hash of its path."""
    try:
        stat = path.stat()
    except OSError:
        return ModelFile(sha256=hashlib.sha256(str(path).encode()).hexdigest(), size=0, modified=0.0)
    cache_file = cache_dir() / DIGEST_CACHE
    try:
        known = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    entry = known.get(str(path.resolve()))
    if isinstance(entry, dict) and entry.get("size") == stat.st_size and entry.get("mtime") == stat.st_mtime:
        return ModelFile(sha256=str(entry["sha256"]), size=stat.st_size, modified=stat.st_mtime)
    digest = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                if busy():  # slowed, never stopped: a class keeps the engine busy for hours
                    time.sleep(BUSY_PAUSE_S)
                digest.update(chunk)
    except OSError:
        return ModelFile(sha256=hashlib.sha256(str(path).encode()).hexdigest(), size=0, modified=0.0)
    known[str(path.resolve())] = {"size": stat.st_size, "mtime": stat.st_mtime, "sha256": digest.hexdigest()}
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(known, indent=1), encoding="utf-8")
        temporary.replace(cache_file)
    except OSError:
        pass  # a read-only cache only costs hashing again next start
    return ModelFile(sha256=digest.hexdigest(), size=stat.st_size, modified=stat.st_mtime)


@dataclass
class Service:
    settings: ServerSettings
    engine: Engine
    model_name: str
    aliases: tuple[str, ...]
    chat: ChatLayer | None = None
    default_template_kwargs: dict[str, Any] = field(default_factory=dict)
    started: int = field(default_factory=lambda: int(time.time()))
    _model_file: asyncio.Future[ModelFile] | None = field(default=None, init=False, repr=False)
    _defaults: ServerDefaults | None = field(default=None, init=False, repr=False)

    @classmethod
    def create(cls, settings: ServerSettings, engine: Engine, resolved_name: str) -> Service:
        aliases = tuple(sorted({a.strip() for a in (settings.alias or "").split(",") if a.strip()}))
        name = aliases[0] if aliases else resolved_name
        return cls(settings=settings, engine=engine, model_name=name, aliases=aliases or (name,),
                   default_template_kwargs=settings.template_kwargs())

    @classmethod
    def for_model(cls, settings: ServerSettings, engine: Engine, name: str, aliases: tuple[str, ...]) -> Service:
        """One model of a router, named by the registry (its -a, preset section or file stem)."""
        return cls(settings=settings, engine=engine, model_name=name, aliases=aliases or (name,),
                   default_template_kwargs=settings.template_kwargs())

    def on_model_loaded(self) -> None:
        info = self.info
        template = choose_template(
            gguf_template=info.chat_template if self.settings.jinja else None,
            architecture=info.architecture,
            bos_token=info.bos_token,
            eos_token=info.eos_token,
            override=self.settings.chat_template,
            override_file=self.settings.chat_template_file,
        )
        self.chat = ChatLayer(self.engine, template, self.defaults())
        self._start_reading_model_file()

    def defaults(self) -> ServerDefaults:
        """What every request leaves out; built once (a --json-schema is compiled to a grammar here)."""
        if self._defaults is None:
            self._defaults = ServerDefaults(
                sampler=default_sampling(self.settings), stop=default_stops(self.settings),
                n_predict=self.settings.n_predict, reasoning_format=self.settings.reasoning_format,
                template_kwargs=self.default_template_kwargs, reasoning=self.settings.reasoning,
                prefill_assistant=self.settings.prefill_assistant, cache_prompt=self.settings.cache_prompt,
                spm_infill=self.settings.spm_infill, n_keep=self.settings.keep,
                reasoning_budget=self.settings.reasoning_budget,
                reasoning_budget_message=self.settings.reasoning_budget_message,
                skip_chat_parsing=self.settings.skip_chat_parsing)
        return self._defaults

    @property
    def ready(self) -> bool:
        """Model loaded and chat template chosen: only then may requests through."""
        return self.engine.ready and self.chat is not None

    @property
    def template(self) -> ChatTemplate | None:
        return self.chat.template if self.chat is not None else None

    @property
    def info(self) -> ModelInfo:
        return self.engine.require_ready()

    @property
    def system_fingerprint(self) -> str:
        return f"b{__version__}-kinetic"

    def default_sampling(self) -> SamplingParams:
        return self.defaults().sampling()

    def _chat(self) -> ChatLayer:
        self.engine.require_ready()
        assert self.chat is not None
        return self.chat

    # ------------------------------------------------ chat-layer work, off the event loop

    def require_generation(self) -> None:
        """A clear 400 for a generation route sent to an embedding-only model (router mode)."""
        if not self.engine.can_generate:
            raise InvalidRequestError(f"model '{self.model_name}' is an embedding model and does not generate "
                                      "text: use /v1/embeddings with it", param="model")

    async def prepare_chat(self, req: ChatRequest) -> tuple[GenerationRequest, PreparedChat]:
        self.require_generation()
        generation, prepared = await anyio.to_thread.run_sync(self._chat().prepare_chat, req)
        self._log_prompt(generation)
        return replace(generation, client=CLIENT.get()), prepared

    async def prepare_prompt(self, req: PromptRequest) -> GenerationRequest:
        self.require_generation()
        generation = await anyio.to_thread.run_sync(self._chat().prepare_prompt, req)
        self._log_prompt(generation)
        return replace(generation, client=CLIENT.get())

    async def prepare_infill(self, req: InfillRequest) -> GenerationRequest:
        generation = await anyio.to_thread.run_sync(self._chat().prepare_infill, req)
        self._log_prompt(generation)
        return replace(generation, client=CLIENT.get())

    def _log_prompt(self, generation: GenerationRequest) -> None:
        """--log-prompts-dir: the prompt as the model reads it, one file per request (llama-server's)."""
        if self.settings.log_prompts_dir:
            write_prompt(self.settings.log_prompts_dir, self.engine.detokenize(generation.prompt_tokens, special=True))

    async def render(self, messages: tuple[Message, ...], *, tools: list[dict[str, Any]] | None = None,
                     template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True,
                     continue_final_message: str | None = None) -> RenderedChat:
        def render() -> RenderedChat:
            return self._chat().render(messages, tools=tools, template_kwargs=template_kwargs,
                                       add_generation_prompt=add_generation_prompt,
                                       continue_final_message=continue_final_message)

        return await anyio.to_thread.run_sync(render)

    async def forward_native(self, route: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """For a model another server serves (router.upstream), that server's answer to one of the
        token-level routes (/tokenize, /detokenize, /apply-template, /v1/messages/count_tokens), which
        need the model's own tokenizer and template. None: this process has them and answers itself."""
        return None

    async def count_chat_tokens(self, req: ChatRequest) -> int:
        """Tokens of the prompt `req` renders to (tools and constraints included), without generating."""
        _, prepared = await self.prepare_chat(req)
        return prepared.prompt_tokens

    def _start_reading_model_file(self) -> None:
        """Hashes the GGUF in the background as soon as it is loaded: Open WebUI lists models with a
        short timeout, and hashing a file of several GB on the first /api/tags could exceed it."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # loaded outside an event loop: hashed on first use instead
            return
        self._model_file = asyncio.ensure_future(anyio.to_thread.run_sync(read_model_file, self.info.path,
                                                                          self._engine_busy))

    def _engine_busy(self) -> bool:
        return self.engine.stats().requests_processing > 0

    async def model_file(self) -> ModelFile:
        """The GGUF's digest, size and mtime: read once in a worker thread, then cached. Concurrent
        first callers share the one read."""
        if self._model_file is None or (self._model_file.done() and (self._model_file.cancelled()
                                                                     or self._model_file.exception() is not None)):
            self._model_file = asyncio.ensure_future(anyio.to_thread.run_sync(read_model_file, self.info.path,
                                                                              self._engine_busy))
        return await asyncio.shield(self._model_file)

    def lora_adapters(self) -> list[dict[str, Any]]:
        """GET /lora-adapters: llama-server's list (a model with no adapters, or not local: empty)."""
        listed = getattr(self.engine, "lora_adapters", None)  # only the llama engine loads adapters
        return [{"id": i, "path": str(path), "scale": scale, "task_name": "", "prompt_prefix": ""}
                for i, (path, scale) in enumerate(listed() if listed else [])]

    async def set_lora_scales(self, scales: dict[int, float]) -> None:
        setter = getattr(self.engine, "set_lora_scales", None)
        if setter is not None:
            await anyio.to_thread.run_sync(setter, scales)  # waits for the current decode step

    def require_infill(self) -> None:
        """llama-server's 501 when the model has no fill-in-the-middle tokens (checked before the body)."""
        check_fim(self.info.fim_tokens)

    def require_embeddings(self) -> None:
        if self.engine.embedding_n_ctx == 0:
            raise NotSupportedError("This server does not support embeddings. Start it with `--embeddings`")

    async def embedding_inputs(self, inputs: list[PromptInput], params: list[str], *,
                               truncate: bool = False) -> list[list[int]]:
        return await anyio.to_thread.run_sync(partial(self._chat().embedding_inputs, inputs, params, truncate=truncate))

    async def embed_all(self, inputs: list[list[int]]) -> list[list[list[float]]]:
        """Raw vectors per input: one pooled, or one per token with --pooling none (native /embedding)."""
        return await anyio.to_thread.run_sync(self.engine.embed_all, inputs)

    async def rerank(self, query: str, documents: list[str]) -> list[RankScore]:
        """Each document's score against the query (--rerank); blocks a worker thread, not the event loop."""
        ranker = getattr(self.engine, "rerank", None)  # a llama engine's; an upstream model has none
        if ranker is None or not self.settings.serves_rerank:
            raise NotSupportedError("This server does not support reranking. Start it with `--reranking`")
        return await anyio.to_thread.run_sync(ranker, query, documents)

    async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        # embed() blocks while it waits for the decode lock and runs llama_decode
        return await anyio.to_thread.run_sync(self.engine.embed, inputs)
