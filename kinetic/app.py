"""The ASGI application, assembled from named parts: the protocols' routes (kinetic.protocols.catalog),
the error funnel (error_funnel.py), the request gate (gate.py), the request ledger, and the model
registry, which loads every model, one or many, local or remote."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI

from kinetic.classroom.chats import ChatStore
from kinetic.classroom.identity import ClientIdentity
from kinetic.classroom.ledger import LedgerMiddleware, LedgerWriter
from kinetic.classroom.stats import ClassStats
from kinetic.error_funnel import install_error_funnel, validation_message
from kinetic.errors import ServerError, UnavailableError
from kinetic.gate import RequestGate
from kinetic.model_registry import idle_sleep
from kinetic.model_registry.registry import ModelRegistry
from kinetic.protocols.catalog import PROTOCOLS, error_response

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
        app.state.load_error = cause
        if on_load_failure is not None:
            on_load_failure(cause)
        return
    described = backend.describe()
    log.info("model loaded: %s (%s), %d slot(s) of %d tokens, chat template %s", backend.name,
             described.info.ftype if described.info else "-", described.n_slots, described.n_ctx,
             described.template.origin if described.template else "-")
    if on_ready is not None:
        on_ready()


def add_gate(app: FastAPI, registry: ModelRegistry) -> None:
    settings = registry.settings
    app.add_middleware(ClientIdentity)  # inside the gate, which names the caller
    keys = settings.key_ring()
    app.state.keys = keys
    app.add_middleware(RequestGate, registry=registry, keys=keys,
                       cors_origins=settings.cors_policy, body_timeout=settings.body_timeout,
                       cors_methods=settings.cors_methods, cors_headers=settings.cors_headers,
                       cors_credentials=settings.cors_credentials)


def add_ledger(app: FastAPI, registry: ModelRegistry) -> None:
    """The request recorder, added last: outermost, so it also sees the gate's 401s. Its records feed
    the dashboard always, and the ledger file with --ledger."""
    settings = registry.settings
    app.state.class_stats = ClassStats()
    writer = LedgerWriter(settings.ledger, content=settings.ledger_content) if settings.ledger else None
    app.add_middleware(LedgerMiddleware, writer=writer, sinks=[app.state.class_stats], keyed=bool(app.state.keys))


def create_app(registry: ModelRegistry, *, on_ready: Callable[[], None] | None = None,
               on_load_failure: Callable[[BaseException], None] | None = None) -> FastAPI:
    """The app over `registry`. A single model loads in the background (every route answers 503
    until it is ready); a router is ready at once."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        startup = asyncio.create_task(start_models(registry, app, on_ready, on_load_failure))
        try:
            async with idle_sleep.watching(registry.sleeper):  # --sleep-idle-seconds
                yield
        finally:
            startup.cancel()
            registry.close()

    app = FastAPI(title="kinetic", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.registry = registry
    # The end of a shutdown's drain (cli.DrainingServer): what is still open fails in its protocol's way.
    app.state.end_streams = partial(registry.end_streams, UnavailableError("the server is shutting down"))
    app.state.load_error = None
    settings = registry.settings
    app.state.chat_store = ChatStore(settings.chat_history) if settings.chat_history else None  # --chat-history
    app.state.sse_ping_interval = registry.settings.sse_ping_interval  # read by kinetic.streaming
    install_error_funnel(app)
    for protocol in PROTOCOLS:
        app.include_router(protocol.router)
    add_gate(app, registry)
    add_ledger(app, registry)
    return app
