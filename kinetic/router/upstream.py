"""Remote models: an OpenAI-compatible server (vLLM, llama-server, another kinetic) behind kinetic.

Where it plugs in. kinetic's Engine takes token prompts, and an upstream wants messages, so the
upstream sits one level up, at the Service: `UpstreamService.prepare_chat` turns the neutral
ChatRequest every protocol translator already produces into an OpenAI chat-completions body
(instead of rendering and tokenizing it), and `UpstreamEngine.submit` forwards that body and turns
the upstream's SSE chunks back into kinetic's neutral engine events (TextDelta..., Finished with
usage and, when the upstream sends them, llama-server's timings). The protocol translators and
routes are untouched: an Anthropic, Responses or llama-server native request reaches the upstream's
OpenAI route the same way. The classroom layer stays in front: key names, the per-key in-flight
limit (429), a waiting line fair across keys (fairqueue.py) when every upstream connection is busy,
the ledger.

Several upstreams under one name form a pool: each request goes to the healthy member with the
fewest requests outstanding; a member that refuses connections or answers 5xx before the first byte
is taken out of rotation and the request tried on the next one. Every member is probed (GET /models)
every 10 seconds, and one out of rotation also when a request comes 3 seconds or more after it
failed; it comes back when it answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kinetic.chat.constraints import template_tools, tool_plan
from kinetic.chat.reasoning import CLOSE_TAG, OPEN_TAG
from kinetic.chat.types import ChatRequest, Message, OutputConstraint, PreparedChat, PromptInput, PromptRequest
from kinetic.classroom.identity import CLIENT
from kinetic.engine.base import Generation
from kinetic.engine.fairqueue import FairQueue
from kinetic.engine.inflight import InFlight
from kinetic.engine.types import (
    EngineStats,
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    ModelInfo,
    SlotFileResult,
    SlotState,
    TextDelta,
    Timings,
    Usage,
)
from kinetic.errors import (
    InvalidRequestError,
    KineticError,
    NotFoundError,
    NotSupportedError,
    RateLimitError,
    ServerError,
    UnauthorizedError,
    UnavailableError,
)
from kinetic.router.sources import ModelSpec, UpstreamSpec
from kinetic.service import Service
from kinetic.settings import ServerSettings

log = logging.getLogger(__name__)

RETRY_DOWN_AFTER_S = 3.0  # a member out of rotation is probed again after this long
HEALTH_INTERVAL_S = 10.0  # every member is probed this often while the server runs
PROBE_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 600.0  # a long generation may pause between chunks while the upstream is busy
DEFAULT_CONNECTIONS = 4  # requests forwarded at once per member when -np is auto
STATUS_ERRORS: dict[int, type[KineticError]] = {400: InvalidRequestError, 401: UnauthorizedError,
                                                404: NotFoundError, 429: RateLimitError}


@dataclass(frozen=True)
class ForwardRequest(GenerationRequest):
    """A generation request that carries the OpenAI body to forward instead of prompt tokens."""

    route: str = "/chat/completions"
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class Member:
    spec: UpstreamSpec
    outstanding: int = 0
    healthy: bool = True
    down_since: float = 0.0
    last_error: str = ""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.spec.key}"} if self.spec.key else {}


class UpstreamPool:
    """One name's upstream servers: least outstanding requests first, failing members out of rotation."""

    def __init__(self, name: str, specs: tuple[UpstreamSpec, ...]):
        self.name = name
        self.members = [Member(spec) for spec in specs]
        self._client: httpx.AsyncClient | None = None
        self._watcher: asyncio.Task[None] | None = None

    def watch(self) -> None:
        """Starts the periodic health check (from the event loop, on first use)."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            await asyncio.gather(*(self._probe(m) for m in self.members))

    def stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        return self._client

    def check_now(self) -> None:
        """Blocking probe of every member (at load time, from a worker thread)."""
        for member in self.members:
            try:
                ok = httpx.get(member.spec.url + "/models", headers=member.headers, timeout=PROBE_TIMEOUT_S).is_success
            except httpx.HTTPError as exc:
                ok, member.last_error = False, str(exc) or type(exc).__name__
            self._set_health(member, ok)

    async def _probe(self, member: Member) -> None:
        try:
            response = await self.client.get(member.spec.url + "/models", headers=member.headers,
                                              timeout=PROBE_TIMEOUT_S)
            ok = response.is_success
        except httpx.HTTPError as exc:
            ok, member.last_error = False, str(exc) or type(exc).__name__
        self._set_health(member, ok)

    def _set_health(self, member: Member, ok: bool) -> None:
        if ok and not member.healthy:
            log.info("upstream %s (%s) is back in rotation", member.spec.url, self.name)
        member.healthy = ok
        if not ok:
            member.down_since = time.monotonic()

    def mark_down(self, member: Member, reason: str) -> None:
        if member.healthy:
            log.warning("upstream %s (%s) taken out of rotation: %s", member.spec.url, self.name, reason)
        member.healthy, member.down_since, member.last_error = False, time.monotonic(), reason

    async def candidates(self) -> list[Member]:
        """Healthy members, fewest outstanding first; members down long enough are probed first."""
        self.watch()
        down = [m for m in self.members if not m.healthy]
        due = [m for m in down if time.monotonic() - m.down_since >= RETRY_DOWN_AFTER_S]
        if len(down) == len(self.members):
            due = down  # all out of rotation: look at every one again now rather than fail
        if due:
            await asyncio.gather(*(self._probe(m) for m in due))
        return sorted((m for m in self.members if m.healthy), key=lambda m: m.outstanding)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


class UpstreamEngine:
    """The Engine interface over an UpstreamPool: generation by forwarding, no tokenizer of its own."""

    def __init__(self, name: str, specs: tuple[UpstreamSpec, ...], *, connections_per_member: int,
                 fair_share: bool, max_in_flight_per_client: int, in_flight: InFlight | None = None):
        self.pool = UpstreamPool(name, specs)
        self.n_slots = connections_per_member * len(specs)
        self.slot_n_ctx = 0
        self.max_in_flight = max_in_flight_per_client
        self.shared_in_flight = in_flight  # the process-wide count per key (inflight.py)
        self._waiting: FairQueue[asyncio.Future[None]] = FairQueue(fair=fair_share)
        self._running = 0
        self._in_flight: dict[str, int] = {}
        self._loaded = False
        self._streams: dict[asyncio.Task[None], asyncio.Queue[Event | BaseException]] = {}  # open answers
        self._loop: asyncio.AbstractEventLoop | None = None  # the event loop the answers run on
        self.info = ModelInfo(path=Path(specs[0].url), architecture="upstream", description=f"upstream {name}",
                              n_vocab=0, n_ctx_train=0, n_embd=0, n_params=0, size=0, vocab_type=0, bos_token="",
                              eos_token="", bos_id=-1, add_bos=False, chat_template=None, metadata={})

    # lifecycle
    @property
    def ready(self) -> bool:
        return self._loaded

    def load(self) -> None:
        self.pool.check_now()
        self._loaded = True

    def close(self, error: KineticError | None = None) -> None:
        """Unloads (from any thread): every open answer fails with `error` and stops, every waiting
        request gets it too, and the pool's HTTP client is closed."""
        self._loaded = False
        loop = self._loop
        if loop is None or loop.is_closed():
            self.pool.stop_watching()
            return
        failure = error or UnavailableError(f"model '{self.pool.name}' was unloaded")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._fail_open(failure)
        else:
            asyncio.run_coroutine_threadsafe(self._close_on_loop(failure), loop).result(timeout=10)

    async def _close_on_loop(self, error: KineticError) -> None:
        self._fail_open(error)

    def _fail_open(self, error: KineticError) -> None:
        """On the event loop: what close() ends."""
        for task, queue in list(self._streams.items()):
            queue.put_nowait(error)
            task.cancel()
        for client, turn in list(self._waiting.in_order()):
            self._waiting.served(client, turn)
            if not turn.done():
                turn.set_exception(error)
        self.pool.stop_watching()
        asyncio.get_running_loop().create_task(self.pool.close())  # its httpx client: one per pool

    def require_ready(self) -> ModelInfo:
        if not self._loaded:
            raise UnavailableError("Loading model")
        return self.info

    # no tokenizer: the upstream tokenizes
    def _no_tokenizer(self) -> NotSupportedError:
        return NotSupportedError(f"model '{self.pool.name}' is served by an upstream server: kinetic has no "
                                 "tokenizer for it")

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        raise self._no_tokenizer()

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        if tokens:
            raise self._no_tokenizer()
        return ""  # a forwarded request's empty token prompt (the native /completion route echoes it)

    def token_piece(self, token: int, *, special: bool = False) -> bytes:
        raise self._no_tokenizer()

    def valid_token(self, token: int) -> bool:
        return False

    @property
    def can_generate(self) -> bool:
        return True

    @property
    def embedding_n_ctx(self) -> int:
        return 1 << 30  # the upstream checks its own limit

    embedding_pooling = ""  # the upstream's own

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        raise NotSupportedError("embeddings through an upstream go by UpstreamService.embed_texts")

    def embed_all(self, inputs: list[list[int]]) -> list[list[list[float]]]:
        raise NotSupportedError("embeddings through an upstream go by UpstreamService.embed_all")

    def _no_slot_files(self) -> NotSupportedError:
        return NotSupportedError(f"model '{self.pool.name}' is served by an upstream server: its slots are not "
                                 "kinetic's to save")

    def slot_save(self, id_slot: int, path: Path) -> SlotFileResult:
        raise self._no_slot_files()

    def slot_restore(self, id_slot: int, path: Path) -> SlotFileResult:
        raise self._no_slot_files()

    def slot_erase(self, id_slot: int) -> SlotFileResult:
        raise self._no_slot_files()

    def slot_states(self) -> list[SlotState]:
        return []

    def stats(self, *, scrape: bool = False) -> EngineStats:
        return EngineStats(counters={}, requests_processing=self._running, requests_deferred=len(self._waiting),
                           deferred_by_client=self._waiting.counts())

    # ------------------------------------------------------------ the fair waiting line

    def _count(self, client: str) -> None:
        if self.max_in_flight and self._in_flight.get(client, 0) >= self.max_in_flight:
            raise RateLimitError(f"too many requests in flight for this key (at most {self.max_in_flight}); "
                                 "retry when one has finished", retry_after=1)
        if self.shared_in_flight is not None:
            self.shared_in_flight.enter(client)
        self._in_flight[client] = self._in_flight.get(client, 0) + 1

    def _uncount(self, client: str) -> None:
        self._in_flight[client] -= 1
        if not self._in_flight[client]:
            del self._in_flight[client]
        if self.shared_in_flight is not None:
            self.shared_in_flight.leave(client)

    async def _take_turn(self, client: str) -> None:
        self._loop = asyncio.get_running_loop()
        if self._running < self.n_slots and not self._waiting:
            self._running += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.push(client, turn)
        try:
            await turn
        except asyncio.CancelledError:
            if not self._waiting.remove(turn):  # the turn was given just as we left: pass it on
                self._end_turn()
            raise

    def _end_turn(self) -> None:
        self._running -= 1
        for client, turn in self._waiting.in_order():
            self._waiting.served(client, turn)
            self._running += 1
            turn.set_result(None)
            return

    # ------------------------------------------------------------ forwarding

    async def submit(self, request: GenerationRequest) -> Generation:
        """Waits for a turn, then sends the request to a pool member; an upstream 4xx is raised here
        (before any byte goes to the client), a member that is down is skipped."""
        if not isinstance(request, ForwardRequest):
            raise NotSupportedError(f"model '{self.pool.name}' is served by an upstream server: it takes "
                                    "messages or text, not token prompts")
        client = request.client
        self._count(client)
        try:
            await self._take_turn(client)
        except BaseException:
            self._uncount(client)
            raise
        try:
            member, response = await self._open(request.route, request.payload)
        except BaseException:
            self._end_turn()
            self._uncount(client)
            raise
        queue: asyncio.Queue[Event | BaseException] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in read_events(response, is_chat=request.route == "/chat/completions"):
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
            loop.create_task(response.aclose())
            member.outstanding -= 1
            self._end_turn()
            self._uncount(client)

        loop = asyncio.get_running_loop()
        task = loop.create_task(pump())
        self._streams[task] = queue
        self._loop = loop
        task.add_done_callback(give_back)
        return Generation(queue, task.cancel)

    async def _open(self, route: str, payload: dict[str, Any], *,
                    native: bool = False) -> tuple[Member, httpx.Response]:
        """The first pool member that answers `route` (under its OpenAI base URL, or at the server's
        root when `native`), streaming; members that fail are marked down and the next one tried."""
        tried: list[str] = []
        for member in await self.pool.candidates():
            base = member.spec.url.removesuffix("/v1") if native else member.spec.url
            member.outstanding += 1
            try:
                http_request = self.pool.client.build_request("POST", base + route, json=payload,
                                                              headers=member.headers)
                response = await self.pool.client.send(http_request, stream=True)
            except httpx.HTTPError as exc:
                member.outstanding -= 1
                self.pool.mark_down(member, str(exc) or type(exc).__name__)
                tried.append(member.spec.url)
                continue
            if response.status_code < 400:
                return member, response
            body = await response.aread()
            await response.aclose()
            member.outstanding -= 1
            if native and response.status_code in (404, 405, 501):
                raise NotSupportedError(
                    f"model '{self.pool.name}' is served by an upstream server ({member.spec.url}) that has no "
                    f"{route} route (a kinetic or llama-server upstream has it; an OpenAI-only server does not), "
                    "and kinetic has no tokenizer or chat template of its own for the model")
            if response.status_code >= 500:
                self.pool.mark_down(member, f"HTTP {response.status_code}")
                tried.append(member.spec.url)
                continue
            raise upstream_error(response.status_code, body)
        detail = f" (tried {', '.join(tried)})" if tried else ""
        raise UnavailableError(f"no upstream server for model '{self.pool.name}' is reachable{detail}")

    async def _json(self, route: str, payload: dict[str, Any], *, native: bool = False) -> dict[str, Any]:
        member, response = await self._open(route, payload, native=native)
        try:
            return json.loads(await response.aread())
        finally:
            await response.aclose()
            member.outstanding -= 1

    async def forward_json(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A non-streamed call (embeddings), with the same turns, limits and failover."""
        client = CLIENT.get()
        self._count(client)
        try:
            await self._take_turn(client)
            try:
                return await self._json(route, payload)
            finally:
                self._end_turn()
        finally:
            self._uncount(client)

    async def forward_native(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A token-level route (/tokenize...) answered by a pool member's own native route: at the
        server's root, not under /v1. Cheap: no turn is taken and nothing is counted against the key.
        An OpenAI-only upstream (vLLM) has no such route: a 501 says what is missing."""
        return await self._json(route, payload, native=True)


def upstream_error(status: int, body: bytes) -> KineticError:
    """The upstream's 4xx as kinetic's own error kind, with its message."""
    try:
        parsed = json.loads(body)
        error = parsed.get("error", parsed) if isinstance(parsed, dict) else {}
        message = error.get("message") if isinstance(error, dict) else str(error)
    except (json.JSONDecodeError, UnicodeDecodeError):
        message = None
    message = f"upstream: {message or body[:200].decode('utf-8', 'replace') or f'HTTP {status}'}"
    kind = STATUS_ERRORS.get(status, InvalidRequestError)
    return kind(message) if kind is not RateLimitError else RateLimitError(message)


async def sse_data(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            continue
        if isinstance(chunk, dict) and "error" in chunk:
            error = chunk["error"]
            raise ServerError(f"upstream: {error.get('message') if isinstance(error, dict) else error}")
        yield chunk


async def read_events(response: httpx.Response, *, is_chat: bool) -> AsyncIterator[Event]:
    """An OpenAI SSE stream as kinetic's engine events. Reasoning the upstream sends apart
    (`reasoning_content`) is wrapped in <think> tags, which the chat layer's answer parser splits off
    again by the request's reasoning format; tool calls are gathered and written at the end as Hermes
    `<tool_call>` text, which the parser (in "auto" tool mode, see UpstreamService.prepare_chat) turns
    back into calls, so every protocol's encoder gives them in its own shape."""
    started = time.perf_counter()
    first_at: float | None = None
    pieces: list[str] = []
    thinking = False
    finish = "stop"
    usage: dict[str, Any] = {}
    timings: dict[str, Any] | None = None
    calls: dict[int, dict[str, str]] = {}
    async for chunk in sse_data(response):
        usage = chunk.get("usage") or usage
        timings = chunk.get("timings") or timings
        for choice in chunk.get("choices") or []:
            if is_chat:
                delta = choice.get("delta") or {}
                reasoning, content = delta.get("reasoning_content") or "", delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    gather_call(calls, call)
            else:
                reasoning, content = "", choice.get("text") or ""
            text = ""
            if reasoning:
                text += ("" if thinking else OPEN_TAG) + reasoning
                thinking = True
            if content:
                text += (CLOSE_TAG if thinking else "") + content
                thinking = False
            if text:
                first_at = first_at or time.perf_counter()
                pieces.append(text)
                yield TextDelta(text=text, token_id=-1)
            finish = choice.get("finish_reason") or finish
    if thinking:
        pieces.append(CLOSE_TAG)
        yield TextDelta(text=CLOSE_TAG, token_id=-1)
    if calls:
        text = "".join(tagged_call(calls[index]) for index in sorted(calls))
        first_at = first_at or time.perf_counter()
        pieces.append(text)
        yield TextDelta(text=text, token_id=-1)
    ended = time.perf_counter()
    prompt_n = int(usage.get("prompt_tokens") or 0)
    predicted_n = int(usage.get("completion_tokens") or len(pieces))
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    if timings:  # llama-server's (or kinetic's) own numbers, passed through
        measured = Timings(cache_n=int(timings.get("cache_n", cached)), prompt_n=int(timings.get("prompt_n", prompt_n)),
                           prompt_ms=float(timings.get("prompt_ms", 0.0)),
                           predicted_n=int(timings.get("predicted_n", predicted_n)),
                           predicted_ms=float(timings.get("predicted_ms", 0.0)))
    else:  # measured here: time to the first piece, then the rest
        first = first_at or ended
        measured = Timings(cache_n=cached, prompt_n=prompt_n, prompt_ms=(first - started) * 1000,
                           predicted_n=predicted_n, predicted_ms=(ended - first) * 1000)
    reason: FinishReason = "length" if finish == "length" else "stop"
    yield Finished(finish_reason=reason, stop_type="limit" if reason == "length" else "eos", stopping_word="",
                   text="".join(pieces), tokens=[], usage=Usage(prompt_n, predicted_n, cached), timings=measured,
                   id_slot=-1, tokens_cached=cached, truncated=False)


def gather_call(calls: dict[int, dict[str, str]], delta: dict[str, Any]) -> None:
    """Adds one streamed OpenAI tool-call delta (the first of a call carries its id and name, later
    ones pieces of its arguments) to the calls gathered so far, by index."""
    call = calls.setdefault(int(delta.get("index") or 0), {"id": "", "name": "", "arguments": ""})
    function = delta.get("function") or {}
    call["id"] = call["id"] or delta.get("id") or ""
    call["name"] += function.get("name") or ""
    call["arguments"] += function.get("arguments") or ""


def tagged_call(call: dict[str, str]) -> str:
    """One gathered call as the Hermes text kinetic's tool-call parser reads, the upstream's id kept."""
    try:
        arguments: Any = json.loads(call["arguments"] or "{}")
    except json.JSONDecodeError:
        arguments = call["arguments"]  # not JSON: passed on as the upstream wrote it
    data = {"name": call["name"], "arguments": arguments, **({"id": call["id"]} if call["id"] else {})}
    return f"<tool_call>{json.dumps(data, ensure_ascii=False)}</tool_call>"


# ---------------------------------------------------------------- neutral request -> OpenAI body

def openai_message(message: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role}
    if message.parts is not None:
        data["content"] = message.text
    if message.name is not None:
        data["name"] = message.name
    if message.tool_call_id is not None:
        data["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        data["tool_calls"] = [{"id": call.id or f"call_{i}", "type": "function",
                               "function": {"name": call.name, "arguments": call.arguments
                                            if isinstance(call.arguments, str) else json.dumps(call.arguments)}}
                              for i, call in enumerate(message.tool_calls)]
    return data


def output_fields(output: OutputConstraint) -> dict[str, Any]:
    if output.schema is not None:
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": output.schema}}}
    if output.any_json:
        return {"response_format": {"type": "json_object"}}
    if output.grammar:
        return {"grammar": output.grammar}  # llama-server's (and kinetic's) extension
    return {}


def option_fields(req: ChatRequest | PromptRequest, defaults: ServerSettings) -> dict[str, Any]:
    options, sampling = req.options, req.options.sampling
    body: dict[str, Any] = {}
    max_tokens = options.max_tokens if options.max_tokens is not None else defaults.n_predict
    if max_tokens is not None and max_tokens > 0:
        body["max_tokens"] = max_tokens
    if options.stop:
        body["stop"] = list(options.stop)
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "seed"):
        value = getattr(sampling, name)
        if value is not None:
            body[name] = value
    return body


def tool_fields(req: ChatRequest) -> dict[str, Any]:
    """`tools`, `tool_choice` and `parallel_tool_calls` as OpenAI writes them (validated here first,
    so a bad choice is kinetic's 400 naming the field, whatever the upstream would say)."""
    mode, only = tool_plan(req)
    if not req.tools:
        return {}
    choice: Any = {"auto": "auto", "none": "none", "forced": "required"}[mode]
    if only is not None:
        choice = {"type": "function", "function": {"name": only}}
    body: dict[str, Any] = {"tools": template_tools(req), "tool_choice": choice}
    if req.parallel_tool_calls:
        body["parallel_tool_calls"] = True
    return body


def chat_body(req: ChatRequest, model: str, defaults: ServerSettings) -> dict[str, Any]:
    body = {"model": model, "messages": [openai_message(m) for m in req.messages], "stream": True,
            "stream_options": {"include_usage": True}, **option_fields(req, defaults), **output_fields(req.output),
            **tool_fields(req)}
    if req.template_kwargs:
        body["chat_template_kwargs"] = req.template_kwargs
    if req.continue_final_message is not None:  # vLLM's and llama-server's spelling
        body["continue_final_message"] = {"auto": True, "content": "content",
                                          "reasoning": "reasoning_content"}[req.continue_final_message]
        body["add_generation_prompt"] = False
    return body


def prompt_body(req: PromptRequest, model: str, defaults: ServerSettings) -> dict[str, Any]:
    prompt: PromptInput = req.prompt
    return {"model": model, "prompt": prompt, "stream": True, "stream_options": {"include_usage": True},
            **option_fields(req, defaults), **output_fields(req.output)}


# ---------------------------------------------------------------- the Service of an upstream model

class UpstreamService(Service):
    """A router model served by an upstream: prepare_* build the OpenAI body instead of a token prompt."""

    upstream_model: str = ""
    _answers: dict[int, list[list[float]]]  # embedding_inputs() -> embed(), by the token lists' identity

    def on_model_loaded(self) -> None:
        pass  # no chat template: the upstream renders

    def upstream_status(self) -> list[dict[str, Any]]:
        """Each pool member's URL, whether it is in rotation, and its requests outstanding (/v1/models)."""
        assert isinstance(self.engine, UpstreamEngine)
        return [{"url": m.spec.url, "healthy": m.healthy, "outstanding": m.outstanding,
                 **({"error": m.last_error} if not m.healthy and m.last_error else {})}
                for m in self.engine.pool.members]

    @property
    def ready(self) -> bool:
        return self.engine.ready

    async def prepare_chat(self, req: ChatRequest) -> tuple[GenerationRequest, PreparedChat]:
        body = chat_body(req, self.upstream_model, self.settings)
        # The upstream's calls come back as <tool_call> text (read_events): "auto" parses them.
        calls = "tools" in body and body["tool_choice"] != "none"
        prepared = PreparedChat(prompt="", prompt_tokens=0, starts_in_reasoning=False,
                                reasoning_format=req.reasoning_format or self.settings.reasoning_format,
                                tool_mode="auto" if calls else "none",
                                tool_names=tuple(tool.name for tool in req.tools) if calls else ())
        return ForwardRequest(prompt_tokens=[], payload=body, client=CLIENT.get()), prepared

    async def prepare_prompt(self, req: PromptRequest) -> GenerationRequest:
        return ForwardRequest(prompt_tokens=[], route="/completions", client=CLIENT.get(),
                              payload=prompt_body(req, self.upstream_model, self.settings))

    async def forward_native(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        assert isinstance(self.engine, UpstreamEngine)
        return await self.engine.forward_native(route, {**body, "model": self.upstream_model})

    async def count_chat_tokens(self, req: ChatRequest) -> int:
        raise NotSupportedError(f"model '{self.model_name}' is served by an upstream server: kinetic cannot "
                                "count its tokens")

    async def render(self, *args: Any, **kwargs: Any) -> Any:
        raise NotSupportedError(f"model '{self.model_name}' is served by an upstream server, which renders "
                                "its own chat template")

    def require_embeddings(self) -> None:
        pass  # the upstream says whether it embeds

    async def embedding_inputs(self, inputs: list[PromptInput], params: list[str], *,
                               truncate: bool = False) -> list[list[int]]:
        """Forwards the inputs (the upstream tokenizes them) and keeps the vectors for embed(); the token
        lists returned only carry the upstream's token count, which is what the usage field reports."""
        assert isinstance(self.engine, UpstreamEngine)
        answer = await self.engine.forward_json("/embeddings", {"model": self.upstream_model, "input": list(inputs)})
        vectors = [item["embedding"] for item in sorted(answer.get("data", []), key=lambda d: d["index"])]
        total = int((answer.get("usage") or {}).get("prompt_tokens") or 0)
        token_lists = [[-1] * total] + [[] for _ in inputs[1:]]
        self._answers[id(token_lists)] = vectors
        return token_lists

    async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        return self._answers.pop(id(inputs))

    async def embed_all(self, inputs: list[list[int]]) -> list[list[list[float]]]:
        return [[vector] for vector in await self.embed(inputs)]  # the upstream pools


def upstream_service(spec: ModelSpec, settings: ServerSettings, *, max_in_flight: int,
                     in_flight: InFlight | None = None) -> UpstreamService:
    connections = DEFAULT_CONNECTIONS if settings.parallel < 0 else settings.parallel
    engine = UpstreamEngine(spec.name, spec.upstreams, connections_per_member=connections,
                            fair_share=settings.fair_share,
                            max_in_flight_per_client=max_in_flight, in_flight=in_flight)
    service = UpstreamService(settings=settings, engine=engine, model_name=spec.name,
                              aliases=spec.aliases or (spec.name,))
    service.upstream_model = spec.upstreams[0].model or spec.name
    service._answers = {}
    return service
