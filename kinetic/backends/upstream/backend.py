"""The backend of a model an upstream pool serves (see the package's docstring)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from kinetic import __version__
from kinetic.backends.base import (
    Capabilities,
    Description,
    Embedding,
    Embeddings,
    ForwardsTokenRoutes,
    Generating,
    ModelBackend,
    Pool,
)
from kinetic.backends.config import ModelConfig
from kinetic.backends.media_source import resolve_chat
from kinetic.backends.sources import ModelSpec
from kinetic.backends.upstream.body import ForwardRequest, chat_body, prompt_body
from kinetic.backends.upstream.line import WaitingLine
from kinetic.backends.upstream.pool import UpstreamPool
from kinetic.backends.upstream.stream import read_events
from kinetic.chat.types import AnswerFormat, ChatRequest, PromptInput, PromptRequest
from kinetic.classroom.caller import Caller
from kinetic.classroom.request_record import RequestRecord
from kinetic.engine.base import Generation
from kinetic.engine.types import EngineStats, Event, Finished
from kinetic.errors import InvalidRequestError, KineticError, ServerError, UnavailableError
from kinetic.scheduling.inflight import InFlight

DEFAULT_CONNECTIONS = 4  # requests forwarded at once per member when -np is auto
CAPABILITIES = Capabilities(generate=True, embeddings=True)


class UpstreamBackend(ModelBackend, Generating[ForwardRequest], ForwardsTokenRoutes, Embedding, Pool):
    """Only the roles a remote server gives it: generating, embedding, its token routes forwarded, its pool's
    maintenance. Its tokenizer, template, slots, adapters and model file are the server's behind it: a route
    that needs one gets the shared 501 (backends/base.py, `role`)."""

    def __init__(self, spec: ModelSpec, config: ModelConfig, *, own_limit: int = 0, in_flight: InFlight | None = None):
        self.config = config
        self.name = spec.name
        self.aliases = spec.aliases or (spec.name,)
        self.started = int(time.time())
        self.upstream_model = spec.upstreams[0].model or spec.name
        self.pool = UpstreamPool(spec.name, spec.upstreams, config.pool)
        parallel = config.engine.n_parallel
        connections = DEFAULT_CONNECTIONS if parallel < 0 else parallel
        self.line = WaitingLine(connections * len(spec.upstreams), fair=config.engine.fair_share,
                                own_limit=own_limit, shared=in_flight, max_queue=config.engine.max_queue)
        self._loaded = False
        self._streams: dict[asyncio.Task[None], asyncio.Queue[Event | BaseException]] = {}  # open answers
        self._loop: asyncio.AbstractEventLoop | None = None  # the event loop the answers run on

    # ------------------------------------------------------------------ lifecycle

    @property
    def ready(self) -> bool:
        return self._loaded

    async def load(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self.pool.check_now()
        self._loaded = True

    def close(self, error: Exception | None = None) -> None:
        """Unloads (from any thread): every open answer fails with `error` and stops, every waiting
        request gets it too, and the pool's HTTP client is closed."""
        self._loaded = False
        loop = self._loop
        if loop is None or loop.is_closed():
            self.pool.stop_watching()
            return
        failure = error if isinstance(error, KineticError) else UnavailableError(f"model '{self.name}' was unloaded")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._fail_open(failure)
        else:
            asyncio.run_coroutine_threadsafe(self._fail_open_async(failure), loop).result(timeout=10)

    async def _fail_open_async(self, error: KineticError) -> None:
        self._fail_open(error)

    def _fail_open(self, error: KineticError) -> None:
        for task, queue in list(self._streams.items()):
            queue.put_nowait(error)
            task.cancel()
        self.line.fail_waiting(error)
        asyncio.get_running_loop().create_task(self.pool.close())  # its httpx client: one per pool

    def refuse_waiting(self, error: KineticError) -> None:
        self.line.refuse(error)

    @property
    def busy(self) -> bool:
        return self.line.running > 0 or len(self.line) > 0

    @property
    def sleeping(self) -> bool:
        return False  # nothing of it is loaded here to unload (it has no Sleeping role)

    # ------------------------------------------------------------------ what it is

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def describe(self) -> Description:
        return Description(name=self.name, aliases=self.aliases, info=None, n_ctx=0, n_slots=self.line.n_slots,
                           template=None, pooling="", fingerprint=f"b{__version__}-kinetic",
                           members=self.pool.statuses())

    # ------------------------------------------------------------------ generation

    async def prepare_chat(self, req: ChatRequest, record: RequestRecord) -> tuple[ForwardRequest, AnswerFormat]:
        req = await resolve_chat(req, self.config.media)  # URLs loaded under kinetic's rules, sent inline
        body = chat_body(req, self.upstream_model, self.config.defaults.n_predict)
        caller = record.caller
        record.note_prepared()
        # the upstream's reasoning and calls come back as structure (stream.py): nothing is read from the text
        return (ForwardRequest.of("/chat/completions", body, client=caller.queue_name, priority=caller.priority),
                AnswerFormat(reasoning_format=req.reasoning_format or self.config.defaults.reasoning_format))

    async def prepare_prompt(self, req: PromptRequest, record: RequestRecord) -> ForwardRequest:
        caller = record.caller
        record.note_prepared()
        body = prompt_body(req, self.upstream_model, self.config.defaults.n_predict)
        return ForwardRequest.of("/completions", body, client=caller.queue_name, priority=caller.priority)

    async def start(self, request: ForwardRequest) -> Generation:
        """Waits for a turn, then sends the request to a pool member; an upstream 4xx is raised here
        (before any byte goes to the client), a member that is down is skipped."""
        client = request.client
        self.line.count(client)
        try:
            await self.line.take_turn(client, request.priority)
        except BaseException:
            self.line.uncount(client)
            raise
        try:
            member, response = await self.pool.open(request.route, request.payload, client=client)
        except BaseException:
            self.line.end_turn()
            self.line.uncount(client)
            raise
        queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in read_events(response, is_chat=request.route == "/chat/completions"):
                    if isinstance(event, Finished):
                        self.pool.answered(member, event)
                    queue.put_nowait(event)
            except httpx.HTTPError as exc:
                self.pool.mark_down(member, f"stream broken: {exc or type(exc).__name__}")
                queue.put_nowait(ServerError(f"upstream {member.spec.url} failed mid-answer: "
                                             f"{exc or type(exc).__name__}"))
            except KineticError as exc:
                queue.put_nowait(exc)

        def give_back(task: asyncio.Task[None]) -> None:
            # A done callback, not the pump's `finally`: a pump cancelled before it ever ran (the
            # second prompt of a list refused with 429) never reaches its `finally`.
            self._streams.pop(task, None)
            loop.create_task(self.pool.done(member, response))
            self.line.end_turn()
            self.line.uncount(client)

        loop = asyncio.get_running_loop()
        self._loop = loop
        task = loop.create_task(pump())
        self._streams[task] = queue
        task.add_done_callback(give_back)

        def cancel() -> None:
            task.cancel()

        return Generation(queue, cancel)

    async def start_together(self, requests: list[ForwardRequest]) -> list[Generation]:
        generations: list[Generation] = []
        try:
            for request in requests:
                generations.append(await self.start(request))
        except BaseException:
            for generation in generations:
                generation.cancel()
            raise
        return generations

    def prompt_text(self, request: ForwardRequest) -> str:
        return ""  # the upstream rendered and tokenized it; kinetic never saw the prompt's text

    async def _forward_json(self, route: str, payload: dict[str, Any], caller: Caller) -> Any:
        """A non-streamed call (embeddings) made for `caller`, with the same turns, limits and failover."""
        client = caller.queue_name
        self.line.count(client)
        try:
            await self.line.take_turn(client, caller.priority)
            try:
                return await self.pool.json(route, payload)
            finally:
                self.line.end_turn()
        finally:
            self.line.uncount(client)

    # ------------------------------------------------------------------ its token routes, the server's

    async def forward_token_route(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """A token-level route (/tokenize...) answered by a pool member's own native route: at the
        server's root, not under /v1. Cheap: no turn is taken and nothing is counted against the key.
        An OpenAI-only upstream (vLLM) has no such route: a 501 says what is missing."""
        answer: dict[str, Any] = await self.pool.json(route, {**body, "model": self.upstream_model}, native=True)
        return answer

    # ------------------------------------------------------------------ embeddings

    async def embed(self, inputs: list[PromptInput], params: list[str], record: RequestRecord, *,
                    truncate: bool = False, per_token: bool = False) -> Embeddings:
        """The upstream's vectors (it tokenizes and pools) and its count of the tokens read."""
        if not inputs:
            return Embeddings(vectors=[], n_tokens=0)
        answer = await self._forward_json("/embeddings", {"model": self.upstream_model, "input": list(inputs)},
                                          record.caller)
        vectors = [item["embedding"] for item in sorted(answer.get("data", []), key=lambda d: d["index"])]
        n_tokens = int((answer.get("usage") or {}).get("prompt_tokens") or 0)
        return Embeddings(vectors=[[v] for v in vectors] if per_token else vectors, n_tokens=n_tokens)

    # ------------------------------------------------------------------ counters, its pool

    def stats(self, *, scrape: bool = False) -> EngineStats:
        return EngineStats(counters={}, requests_processing=self.line.running, requests_deferred=len(self.line),
                           deferred_by_client=self.line.waiting_by_client())

    async def drain(self, server: str, *, drain: bool, wait_s: float = 0.0) -> dict[str, Any]:
        member = self.pool.find(server)
        if member is None:
            known = ", ".join(m.spec.url for m in self.pool.members)
            raise InvalidRequestError(f"model '{self.name}' has no upstream server {server!r} (its servers: {known})",
                                      param="upstream")
        if drain:
            await self.pool.drain(member, wait_s=wait_s)
        else:
            await self.pool.undrain(member)
        return self.pool.statuses()[self.pool.members.index(member)]
