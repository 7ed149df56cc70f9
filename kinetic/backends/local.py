"""A model this process runs: the chat layer (templates, tokenizer, grammars) over a llama engine.

The `prepare_*` methods run the chat layer's CPU work in a worker thread, so a request with a large
schema never stalls the streams other clients are reading.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio

from kinetic import __version__
from kinetic.backends.base import (
    Adapters,
    Capabilities,
    Description,
    Embedding,
    Embeddings,
    Infilling,
    ModelBackend,
    ModelFiles,
    Reranking,
    Sleeping,
    Slots,
    Templating,
    Tokenizing,
    rerank_off,
)
from kinetic.backends.config import ModelConfig
from kinetic.backends.media_source import resolve_chat, resolve_prompt
from kinetic.backends.model_file import ModelFile, read_model_file
from kinetic.backends.prompt_log import write_prompt
from kinetic.chat.infill import check_fim
from kinetic.chat.media import check_readable, media_parts
from kinetic.chat.prepare import ChatLayer, RenderedChat, quick_to_prepare, quick_to_prepare_chat
from kinetic.chat.templates import ChatTemplate, choose_template
from kinetic.chat.types import AnswerFormat, ChatRequest, InfillRequest, Message, PromptInput, PromptRequest
from kinetic.classroom.request_record import RequestRecord
from kinetic.engine.base import Engine, Generation
from kinetic.engine.types import (
    EngineStats,
    GenerationRequest,
    ModelInfo,
    RankScore,
    SlotFileResult,
    SlotState,
)
from kinetic.errors import InvalidRequestError, KineticError, NotSupportedError

FINGERPRINT = f"b{__version__}-kinetic"


Request = TypeVar("Request")
Prepared = TypeVar("Prepared")


async def _run_prepare(prepare: Callable[[Request], Prepared], req: Request, *, quick: bool) -> Prepared:
    """A request prepared on the event loop when it is quick to (kinetic.chat.prepare), else on a worker thread. A
    quick one lets the loop turn once first: the requests parsed with it then pass the door (scheduling/arrivals.py)
    before it is queued, and share its first step, as they do when each one's hop to a thread lets the others in
    (four chats sent at once, tiny LFM2: TTFT p90 33-35 ms without the turn, 26-29 with it, 29-30 with the hop)."""
    if quick:
        await asyncio.sleep(0)
        return prepare(req)
    return await anyio.to_thread.run_sync(prepare, req)


class LocalBackend(ModelBackend, Infilling[GenerationRequest], Tokenizing, Templating, Embedding, Reranking, Slots,
                   Adapters, Sleeping, ModelFiles):
    """Every role but a remote model's (ForwardsTokenRoutes, Pool): the model, its tokenizer, template, slots and
    adapters are here."""

    def __init__(self, config: ModelConfig, engine: Engine, name: str, aliases: tuple[str, ...] = ()):
        self.config = config
        self.engine = engine
        self.name = name
        self.aliases = aliases or (name,)
        self.started = int(time.time())
        self.chat: ChatLayer | None = None
        self._model_file: asyncio.Future[ModelFile] | None = None
        self._layers: dict[str, ChatLayer] = {}  # derived models' own templates, each compiled once

    # ------------------------------------------------------------------ lifecycle

    @property
    def ready(self) -> bool:
        """Model loaded and chat template chosen: only then may requests through."""
        return self.engine.ready and self.chat is not None

    @property
    def sleeping(self) -> bool:
        return self.engine.sleeping

    async def sleep(self) -> None:
        await anyio.to_thread.run_sync(self.engine.sleep)

    async def wake(self) -> None:
        await anyio.to_thread.run_sync(self.engine.wake)

    async def load(self) -> None:
        await anyio.to_thread.run_sync(self.engine.load)
        info = self.engine.require_ready()
        choice = self.config.template
        template = choose_template(gguf_template=info.chat_template if choice.jinja else None,
                                   architecture=info.architecture, bos_token=info.bos_token,
                                   eos_token=info.eos_token, override=choice.override,
                                   override_file=choice.override_file)
        self.chat = ChatLayer(self.engine, template, self.config.defaults)
        # Hashed in the background as soon as it is loaded: Open WebUI lists models with a short
        # timeout, and hashing a file of several GB on the first /api/tags could exceed it.
        self._model_file = asyncio.ensure_future(self._read_model_file())

    def close(self, error: Exception | None = None) -> None:
        self.engine.close(error if isinstance(error, KineticError) else None)

    def refuse_waiting(self, error: KineticError) -> None:
        self.engine.refuse_waiting(error)

    @property
    def busy(self) -> bool:
        stats = self.engine.stats()
        return stats.requests_processing > 0 or stats.requests_deferred > 0

    # ------------------------------------------------------------------ what it is

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(generate=self.engine.can_generate, embeddings=self.engine.embedding_n_ctx > 0,
                            rerank=self.config.switches.rerank)

    @property
    def info(self) -> ModelInfo:
        return self.engine.require_ready()

    def describe(self) -> Description:
        return Description(name=self.name, aliases=self.aliases, info=self.info, n_ctx=self.engine.slot_n_ctx,
                           n_slots=self.engine.n_slots, template=self._chat().template if self.ready else None,
                           pooling=self.engine.embedding_pooling, fingerprint=FINGERPRINT,
                           speculative_types=self.engine.speculative_types, modalities=self.engine.modalities,
                           media_marker=self.engine.media_marker)

    async def _read_model_file(self) -> ModelFile:
        return await anyio.to_thread.run_sync(read_model_file, self.info.path, self._decoding)

    def _decoding(self) -> bool:
        return self.engine.stats().requests_processing > 0

    async def model_file(self) -> ModelFile:
        """The GGUF's digest, size and mtime: read once in a worker thread, then cached. Concurrent
        first callers share the one read."""
        if self._model_file is None or (self._model_file.done() and (self._model_file.cancelled()
                                                                     or self._model_file.exception() is not None)):
            self._model_file = asyncio.ensure_future(self._read_model_file())
        return await asyncio.shield(self._model_file)

    # ------------------------------------------------------------------ generation

    def _chat(self, template: str | None = None) -> ChatLayer:
        """The chat layer that renders `template` (a derived model's Jinja source), else the model's own."""
        self.engine.require_ready()
        assert self.chat is not None
        if template is None:
            return self.chat
        layer = self._layers.get(template)
        if layer is None:
            info = self.info
            compiled = ChatTemplate(template, "/api/create", bos_token=info.bos_token, eos_token=info.eos_token)
            layer = self._layers[template] = ChatLayer(self.engine, compiled, self.config.defaults)
        return layer

    def chat_template(self, source: str) -> ChatTemplate:
        return self._chat(source).template

    def _require_generation(self) -> None:
        """A clear 400 for a generation route sent to an embedding-only model (router mode)."""
        if not self.engine.can_generate:
            raise InvalidRequestError(f"model '{self.name}' is an embedding model and does not generate "
                                      "text: use /v1/embeddings with it", param="model")

    async def prepare_chat(self, req: ChatRequest, record: RequestRecord) -> tuple[GenerationRequest, AnswerFormat]:
        self._require_generation()
        # files named by URL are loaded first (the chat layer reads bytes only); no URL, no work. A file the model
        # cannot read is refused before anything is fetched for it.
        check_readable(media_parts(req.messages), self.engine.modalities)
        req = await resolve_chat(req, self.config.media)
        generation, answer_format = await _run_prepare(self._chat(req.template).prepare_chat, req,
                                                       quick=quick_to_prepare_chat(req))
        return self._made(generation, record), answer_format

    async def prepare_prompt(self, req: PromptRequest, record: RequestRecord) -> GenerationRequest:
        self._require_generation()
        req = await resolve_prompt(req, self.config.media)
        return self._made(await _run_prepare(self._chat().prepare_prompt, req, quick=quick_to_prepare(req)), record)

    async def prepare_infill(self, req: InfillRequest, record: RequestRecord) -> GenerationRequest:
        check_fim(self.info.fim_tokens)  # llama-server's 501 naming the missing tokens
        self._require_generation()
        return self._made(await anyio.to_thread.run_sync(self._chat().prepare_infill, req), record)

    def _made(self, generation: GenerationRequest, record: RequestRecord) -> GenerationRequest:
        """A prepared request, its caller's queue name and priority on it, the files its prompt read and its being
        prepared noted on the request's record; with --log-prompts-dir its prompt is written out."""
        if self.config.switches.log_prompts_dir:
            write_prompt(self.config.switches.log_prompts_dir, self.prompt_text(generation))
        if generation.media:
            record.note_media(images=sum(span.modality == "image" for span in generation.media),
                              audio=sum(span.modality == "audio" for span in generation.media),
                              tokens=sum(span.n_tokens for span in generation.media))
        caller = record.caller
        record.note_prepared()
        return replace(generation, client=caller.queue_name, priority=caller.priority)

    async def start(self, request: GenerationRequest) -> Generation:
        return await self.engine.submit(request)

    async def start_together(self, requests: list[GenerationRequest]) -> list[Generation]:
        """Several requests of one call (a list of prompts), started in the same decode step."""
        return await self.engine.submit_many(requests)

    # ------------------------------------------------------------------ token-level work

    async def count_chat_tokens(self, req: ChatRequest, record: RequestRecord) -> int:
        """Tokens of the prompt `req` renders to (tools and constraints included), without generating."""
        generation, _ = await self.prepare_chat(req, record)
        return generation.n_prompt_tokens

    async def render(self, messages: tuple[Message, ...], *, tools: list[dict[str, Any]] | None = None,
                     template_kwargs: dict[str, Any] | None = None, add_generation_prompt: bool = True,
                     continue_final_message: str | None = None, template: str | None = None) -> RenderedChat:
        render = partial(self._chat(template).render, messages, tools=tools, template_kwargs=template_kwargs,
                         add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message)
        return await anyio.to_thread.run_sync(render)

    async def tokenize(self, parts: list[str | int], *, add_special: bool, parse_special: bool) -> list[int]:
        def run() -> list[int]:
            tokens: list[int] = []
            for index, part in enumerate(parts):
                tokens += [part] if isinstance(part, int) else self.engine.tokenize(
                    part, add_special=add_special and index == 0, parse_special=parse_special)
            return tokens
        return await anyio.to_thread.run_sync(run)

    async def token_pieces(self, tokens: list[int]) -> list[bytes]:
        return await anyio.to_thread.run_sync(lambda: [self.engine.token_piece(t, special=True) for t in tokens])

    async def detokenize(self, tokens: list[int]) -> str:
        valid = [token for token in tokens if self.engine.valid_token(token)]
        return await anyio.to_thread.run_sync(partial(self.engine.detokenize, valid, special=True))

    def prompt_text(self, request: GenerationRequest) -> str:
        return self.engine.detokenize(request.prompt_tokens, special=True)

    # ------------------------------------------------------------------ embeddings

    async def embed(self, inputs: list[PromptInput], params: list[str], record: RequestRecord, *,
                    truncate: bool = False, per_token: bool = False) -> Embeddings:
        """Pooled, L2-normalised vectors; with `per_token` the raw rows of each input (one pooled row,
        or one per token with --pooling none), for llama-server's native /embedding."""
        if self.engine.embedding_n_ctx == 0:
            raise NotSupportedError("This server does not support embeddings. Start it with `--embeddings`")
        if not inputs:
            return Embeddings(vectors=[], n_tokens=0)
        token_lists = await anyio.to_thread.run_sync(partial(self._chat().embedding_inputs, inputs, params,
                                                             truncate=truncate))
        # blocks while it waits for the decode lock and runs llama_decode
        vectors: list[Any] = await anyio.to_thread.run_sync(self.engine.embed_all if per_token else self.engine.embed,
                                                            token_lists)
        return Embeddings(vectors=vectors, n_tokens=sum(len(tokens) for tokens in token_lists))

    async def rerank(self, query: str, documents: list[str]) -> list[RankScore]:
        """Each document's score against the query; blocks a worker thread, not the event loop."""
        if not self.config.switches.rerank:
            raise rerank_off()
        return await anyio.to_thread.run_sync(self.engine.rerank, query, documents)

    # ------------------------------------------------------------------ slots, adapters, counters

    def slot_states(self) -> list[SlotState]:
        return self.engine.slot_states()

    async def slot_file(self, action: str, id_slot: int, path: Path | None) -> SlotFileResult:
        """Blocking engine work off the loop: save or restore `path`, or erase (refused while busy)."""
        if action == "erase":
            return await anyio.to_thread.run_sync(self.engine.slot_erase, id_slot)
        assert path is not None
        act = self.engine.slot_save if action == "save" else self.engine.slot_restore
        return await anyio.to_thread.run_sync(act, id_slot, path)

    def lora_adapters(self) -> list[tuple[Path, float]]:
        return self.engine.lora_adapters()

    async def set_lora_scales(self, scales: dict[int, float]) -> None:
        await anyio.to_thread.run_sync(self.engine.set_lora_scales, scales)  # waits for the current decode step

    def stats(self, *, scrape: bool = False) -> EngineStats:
        return self.engine.stats(scrape=scrape)
