"""FastAPI dependencies: the model a request is for (its backend, and the derived model it is served as:
served.py), resolved through the model registry on the app's typed state (ServerState), and the request's record
(its Caller on it).

In router mode the model comes from the JSON body's `model` field (POST) or `?model=` (GET, as
llama-server's native routes take it); with one model it is ignored, unless it names a derived model
(model_registry/derived.py). The dependency holds a lease on
the model until the request is done, so that an LRU unload never takes it away mid-request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.applications import Starlette

from kinetic.classroom.budgets import Budgets
from kinetic.classroom.caller import Caller
from kinetic.classroom.chats import ChatStore
from kinetic.classroom.keys import KeyRing
from kinetic.classroom.ledger import LedgerRecord, LedgerWriter
from kinetic.classroom.request_record import RequestRecord, caller_of, request_record
from kinetic.classroom.stats import ClassStats
from kinetic.errors import ClientDisconnected, InvalidRequestError, NotFoundError
from kinetic.model_registry.registry import ModelEntry, ModelMissingError, ModelNotFoundError, ModelRegistry
from kinetic.model_registry.served import Served


@dataclass
class ServerState:
    """What the app keeps for its routes and the CLI (create_app builds it; `server_state()` reads it)."""

    registry: ModelRegistry
    keys: KeyRing
    budgets: Budgets  # each key's usage against its limits (the gate's 429s and 403s, GET /v1/me)
    class_stats: ClassStats  # the dashboard's totals
    end_streams: Callable[[], Coroutine[Any, Any, None]]  # the end of a shutdown's drain
    refuse_waiting: Callable[[], None]  # the start of a shutdown: the requests waiting for a slot get a 503
    load_error: BaseException | None = None  # why the one model failed to load (the CLI prints it)
    chat_store: ChatStore | None = None  # --chat-history: the chat page's saved conversations
    ledger: LedgerWriter | None = None  # --ledger: the class record's file, and whether it can be written

    def record(self, record: LedgerRecord) -> None:
        """A line made after its request was answered (a background response's run): to the ledger, the
        dashboard and the budgets, as the request recorder hands its own."""
        sinks: list[Callable[[LedgerRecord], None]] = [self.class_stats, self.budgets]
        for sink in ([self.ledger] if self.ledger is not None else []) + sinks:
            try:
                sink(record)
            except (OSError, ValueError):  # the writer has said so and marked the ledger (the gate refuses next)
                pass


def server_state(app: Starlette) -> ServerState:
    state = app.state.server
    assert isinstance(state, ServerState), "an app made by kinetic.server.app.create_app"
    return state


def get_registry(request: Request) -> ModelRegistry:
    return server_state(request.app).registry


async def requested_model(request: Request) -> str | None:
    """The model a request names: `?model=`, else the body's `model`, JSON or a multipart form's field (the
    body is read once and kept by Starlette, so the route's own body parsing reads the same bytes)."""
    if name := request.query_params.get("model"):
        return name
    if request.method != "POST":
        return None
    if request.headers.get("content-type", "").startswith("multipart/form-data"):  # an upload (transcriptions)
        field = (await request.form()).get("model")
        return field if isinstance(field, str) else None
    try:
        body = json.loads(await request.body() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # the route's validation answers the bad body
    name = body.get("model") if isinstance(body, dict) else None
    return name if isinstance(name, str) else None


def autoload_override(request: Request) -> bool | None:
    """llama-server's `?autoload=true|false`, which overrides --models-autoload for one request."""
    value = request.query_params.get("autoload")
    return None if value is None else value.lower() in ("1", "true", "on", "yes")


RESUMABLE_HEADER = "x-conversation-id"  # llama-server's resumable streams (server-stream.cpp)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_gone(request: Request, acquiring: Awaitable[tuple[ModelEntry, Served]],
                     release: Callable[[ModelEntry], None]) -> tuple[ModelEntry, Served]:
    """A router's wait for its model (a load, a turn behind a busy model), given up when the client leaves,
    as llama-server's router gives up a queued request: a load not yet started for it is not started, and
    the room it would have taken stays with the model that has it. A model leased just as the client left
    is released at once."""
    await request.body()  # the body is read and kept first, so that what the watch reads next is the end
    task = asyncio.ensure_future(acquiring)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            task.add_done_callback(partial(_release_late, release))
    if task.done() and not task.cancelled():
        return task.result()
    raise ClientDisconnected()


def _release_late(release: Callable[[ModelEntry], None], task: asyncio.Future[tuple[ModelEntry, Served]]) -> None:
    """A wait given up that got its model anyway gives it back."""
    if not task.cancelled() and task.exception() is None:
        release(task.result()[0])


async def lease_model(request: Request, *, missing: str | None = None, unknown: str | None = None,
                      wake: bool = True) -> tuple[ModelEntry, Served]:
    """The model `request` names and its backend, leased until `registry.release(entry)`. `missing` and `unknown`
    (with `{name}`) reword the router's 400 and 404 in a protocol's own words; `wake` False leaves a
    sleeping model asleep (--sleep-idle-seconds: /props and /metrics answer without loading it)."""
    registry = get_registry(request)
    # one model answers whatever a request names, unless it names a derived model (/api/create's)
    name = await requested_model(request) if registry.router or registry.derived else None
    limits = caller_of(request).limits
    try:
        # a model the key may not use is, to that key, a model that does not exist (OpenAI's 404 too)
        if limits.models is not None and not limits.allows_model((entry := registry.resolve(name)).spec.names):
            raise ModelNotFoundError(name or entry.name)
        acquiring = registry.acquire(name, autoload=autoload_override(request), wake=wake)
        conversation_id = request.headers.get(RESUMABLE_HEADER, "") if registry.router else ""
        if conversation_id:  # a resumable stream outlives its client, as llama-server's "detached" request does
            return await registry.waiting_streams.wait(caller_of(request).name, conversation_id, acquiring)
        if registry.router:
            return await until_gone(request, acquiring, registry.release)
        return await acquiring
    except ModelMissingError:
        if missing is None:
            raise
        raise InvalidRequestError(missing, param="model") from None
    except ModelNotFoundError as exc:
        if unknown is None:
            raise
        raise NotFoundError(unknown.format(name=exc.name), param="model") from None


@asynccontextmanager
async def model_backend(request: Request, *, missing: str | None = None, unknown: str | None = None,
                        wake: bool = True) -> AsyncIterator[Served]:
    """lease_model's backend, leased for the block."""
    entry, served = await lease_model(request, missing=missing, unknown=unknown, wake=wake)
    try:
        yield served
    finally:
        get_registry(request).release(entry, used=wake)


async def _served_until_the_end(request: Request, *, missing: str | None = None,
                                unknown: str | None = None) -> Served:
    """lease_model's backend, leased until the request is over (its stream included): the request's record gives it
    back (RequestRecord.at_end). A coroutine, not a dependency with yield: FastAPI's machinery for those cost
    ~0.1 ms of the event loop before every generation was queued."""
    entry, served = await lease_model(request, missing=missing, unknown=unknown)
    request_record(request).at_end(partial(get_registry(request).release, entry))
    return served


async def get_served(request: Request) -> Served:
    return await _served_until_the_end(request)


def served_dependency(*, missing: str, unknown: str) -> Callable[[Request], Awaitable[Served]]:
    """get_served with a protocol's own wording for a missing and an unknown model."""

    async def dependency(request: Request) -> Served:
        return await _served_until_the_end(request, missing=missing, unknown=unknown)

    return dependency


# The dependencies below are coroutines although nothing in them waits: FastAPI runs a plain function's
# dependency on a worker thread, a hop there and back for every request (~0.1-0.3 ms of a TTFT on 2 cores).


async def registry_dependency(request: Request) -> ModelRegistry:
    return get_registry(request)


ServedDep = Annotated[Served, Depends(get_served)]
RegistryDep = Annotated[ModelRegistry, Depends(registry_dependency)]


async def get_record(request: Request) -> RequestRecord:
    return request_record(request)


async def get_caller(request: Request) -> Caller:  # FastAPI reads this signature: request_record.py names none
    return caller_of(request)


CallerDep = Annotated[Caller, Depends(get_caller)]


# The request's record, for a route to hand down to its backend (which reads the Caller there and notes media)
RecordDep = Annotated[RequestRecord, Depends(get_record)]
