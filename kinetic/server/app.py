"""The ASGI application, assembled from named parts: the protocols' routes (kinetic.protocols.catalog),
the error funnel (error_funnel.py), the request gate (gate.py), the request ledger, and the model
registry, which loads every model, one or many, local or remote."""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

from fastapi import FastAPI

from kinetic.classroom.budgets import Budgets
from kinetic.classroom.chats import ChatStore
from kinetic.classroom.ledger import LedgerMiddleware, LedgerWriter, set_aside_torn_tail
from kinetic.classroom.stats import ClassStats
from kinetic.config.settings import ServerSettings
from kinetic.errors import ServerError, ShuttingDownError, UnavailableError
from kinetic.model_registry import idle_sleep
from kinetic.model_registry.deps import ServerState, server_state
from kinetic.model_registry.registry import ModelRegistry
from kinetic.protocols.batches.runner import BatchRunner
from kinetic.protocols.batches.store import BatchStore
from kinetic.protocols.catalog import PROTOCOLS, error_response, flat_routes
from kinetic.protocols.common.app_parts import install, installed
from kinetic.protocols.common.store_database import StoreDatabase
from kinetic.protocols.common.stream_buffers import StreamBuffers
from kinetic.protocols.common.streaming import StreamSettings
from kinetic.protocols.openai.control import RunningCompletions
from kinetic.protocols.responses.background import BackgroundRuns
from kinetic.protocols.responses.conversations import ConversationStore
from kinetic.protocols.responses.store import ResponseStore
from kinetic.server.error_funnel import install_error_funnel, validation_message
from kinetic.server.gate import RequestGate
from kinetic.server.in_process import post_json
from kinetic.server.vertex import VertexSettings, install_vertex
from kinetic.web.routes import router as web_router

RESTART_S = 5  # Retry-After past the drain: about how long a restart takes to serve again (a small model)

log = logging.getLogger(__name__)

__all__ = ["create_app", "error_response", "validation_message"]


async def start_models(registry: ModelRegistry, app: FastAPI, on_ready: Callable[[], None] | None,
                       on_load_failure: Callable[[BaseException], None] | None) -> None:
    """A router is ready at once (its models load on demand or at startup); a single model is loaded
    first, and a failure to load it is reported (the CLI prints it as one line and stops)."""
    if registry.router:
        if on_ready is not None:
            on_ready()
        await registry.load_on_startup()
        return
    try:
        backend = await registry.load(registry.only)
    except ServerError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        server_state(app).load_error = cause
        if on_load_failure is not None:
            on_load_failure(cause)
        return
    described = backend.describe()
    log.info("model loaded: %s (%s), %d slot(s) of %d tokens, chat template %s", backend.name,
             described.info.ftype if described.info else "-", described.n_slots, described.n_ctx,
             described.template.origin if described.template else "-")
    if on_ready is not None:
        on_ready()
    registry.announced = True


def add_gate(app: FastAPI, state: ServerState) -> None:
    settings = state.registry.settings
    app.add_middleware(RequestGate, registry=state.registry, keys=state.keys, budgets=state.budgets,
                       ledger=state.ledger,
                       cors_origins=settings.cors_policy, body_timeout=settings.body_timeout,
                       cors_methods=settings.cors_methods, cors_headers=settings.cors_headers,
                       cors_credentials=settings.cors_credentials)


def add_ledger(app: FastAPI, state: ServerState) -> None:
    """The request recorder, added last: outermost, so it also sees the gate's 401s. Its records feed
    the dashboard always, the keys' budgets, and the ledger file with --ledger."""
    app.add_middleware(LedgerMiddleware, writer=state.ledger, sinks=[state.class_stats, state.budgets],
                       keyed=bool(state.keys))


def server_parts(registry: ModelRegistry) -> ServerState:
    settings = registry.settings
    keys = settings.key_ring()
    budgets = Budgets()
    ledger = None
    if settings.ledger:
        set_aside_torn_tail(settings.ledger)  # a crash mid-append: the next line must start a line of its own
        ledger = LedgerWriter(settings.ledger, content=settings.ledger_content, best_effort=settings.ledger_best_effort)
        if keys:  # what the keys used before a restart still counts against their budgets
            budgets.load_ledger(settings.ledger)
    # The end of a shutdown's drain (cli.DrainingServer): what is still open fails in its protocol's way.
    end_streams = partial(registry.end_streams, UnavailableError("the server is shutting down"))
    # its start: what waits for a slot is told to come back once the drain is over and a new server is up
    refuse_waiting = partial(registry.refuse_waiting,
                             ShuttingDownError(retry_after=math.ceil(settings.drain_timeout) + RESTART_S))
    chat_store = ChatStore(settings.chat_history) if settings.chat_history else None
    return ServerState(registry=registry, keys=keys, budgets=budgets, class_stats=ClassStats(), end_streams=end_streams,
                       refuse_waiting=refuse_waiting,
                       chat_store=chat_store, ledger=ledger)


def stop_then(first: Callable[[], None], then: Callable[[], None]) -> None:
    first()
    then()


def store_database(settings: ServerSettings) -> StoreDatabase:
    """Where stored responses and conversations are kept: --store-dir, else the ledger's folder (the class's
    records together), else memory."""
    folder = settings.store_dir or (str(Path(settings.ledger).resolve().parent) if settings.ledger else None)
    try:
        return StoreDatabase(Path(folder) if folder else None)
    except (OSError, sqlite3.Error) as exc:
        raise SystemExit(f"error: cannot keep stored responses in {folder}: {exc}") from None


def create_app(registry: ModelRegistry, *, on_ready: Callable[[], None] | None = None,
               on_load_failure: Callable[[BaseException], None] | None = None,
               vertex: VertexSettings | None = None) -> FastAPI:
    """The app over `registry`. A single model loads in the background (every route answers 503
    until it is ready); a router is ready at once. `vertex`: Vertex AI's predict (and health) route
    over all the others (AIP_MODE=PREDICTION)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        startup = asyncio.create_task(start_models(registry, app, on_ready, on_load_failure))
        batches = asyncio.create_task(runner.run())  # /v1/batches: what a restart left runs on
        try:
            async with idle_sleep.watching(registry.sleeper):  # --sleep-idle-seconds
                yield
        finally:
            startup.cancel()
            batches.cancel()  # the line running is not kept: it runs again after a restart
            await installed(app, BackgroundRuns).cancel_all()  # each recorded as cancelled
            registry.close()
            database.close()

    app = FastAPI(title="kinetic", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    state = server_parts(registry)
    app.state.server = state
    install(app, RunningCompletions())  # for /v1/chat/completions/control
    install(app, StreamSettings(ping_interval_s=registry.settings.sse_ping_interval))
    install(app, StreamBuffers())  # X-Conversation-Id's kept streams (GET /v1/stream)
    database = store_database(registry.settings)  # stored responses, conversations, files and batches
    install(app, database)  # the dashboard shows its size
    install(app, ResponseStore(database))
    install(app, ConversationStore(database))
    install(app, BackgroundRuns())  # background responses still running
    batch_store = BatchStore(database)  # /v1/files and /v1/batches
    install(app, batch_store)
    runner = BatchRunner(batch_store, partial(post_json, app), registry.spare_slot)
    install(app, runner)
    state.refuse_waiting = partial(stop_then, runner.stop, state.refuse_waiting)  # a shutdown: no line is lost
    install_error_funnel(app)
    # The routes go in flat: FastAPI 0.165+ keeps an included router whole and matches a request through each
    # level (three times in all), about a tenth of a millisecond of every request's time on 2 cores.
    for router in (*(protocol.router for protocol in PROTOCOLS), web_router):  # the pages: default error envelope
        app.router.routes.extend(flat_routes(router.routes))
    if vertex is not None:
        install_vertex(app, vertex)
    add_gate(app, state)
    add_ledger(app, state)
    return app
