"""The ASGI application: routers, the request gate (CORS, loading, API key) and the error funnel."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kinetic.classroom.identity import ClientIdentity
from kinetic.classroom.keys import KeyRing, key_from_headers
from kinetic.classroom.ledger import LedgerMiddleware, LedgerWriter
from kinetic.classroom.roles import needs_admin, require_admin, role_of
from kinetic.classroom.stats import ClassStats
from kinetic.errors import (
    InvalidRequestError,
    KineticError,
    NotFoundError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServerError,
    UnauthorizedError,
    UnavailableError,
)
from kinetic.protocols.anthropic import translate as anthropic_translate
from kinetic.protocols.anthropic.routes import router as anthropic_router
from kinetic.protocols.llamacpp.routes import router as llamacpp_router
from kinetic.protocols.ollama import translate as ollama_translate
from kinetic.protocols.ollama.routes import router as ollama_router
from kinetic.protocols.openai import translate as openai_translate
from kinetic.protocols.openai.routes import router as openai_router
from kinetic.protocols.responses.routes import router as responses_router
from kinetic.router import idle_sleep
from kinetic.router.registry import ModelRegistry, ModelState
from kinetic.service import Service
from kinetic.streaming import ClientDisconnected
from kinetic.web.routes import is_public_page
from kinetic.web.routes import router as web_router

log = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
CORS_METHODS = "GET, POST, DELETE, OPTIONS"
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")

ErrorRenderer = Callable[[KineticError], Any]
# Each protocol family answers errors in its own envelope (path prefix -> renderer; the rest get
# OpenAI's, which is also llama-server's).
ERROR_RENDERERS: tuple[tuple[str, ErrorRenderer], ...] = (
    ("/v1/messages", anthropic_translate.error_body),
    ("/api/", ollama_translate.error_body),
)


def error_response(path: str, err: KineticError) -> JSONResponse:
    for prefix, renderer in ERROR_RENDERERS:
        if path.startswith(prefix):
            return JSONResponse(renderer(err), status_code=err.status, headers=err.headers)
    return JSONResponse(openai_translate.error_body(err), status_code=err.status, headers=err.headers)


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One readable sentence naming the field pydantic rejected."""
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return f"Invalid JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    # drop pydantic's union-branch names (e.g. 'str', 'list[...]') from the path
    location = [part for part in location
                if not any(c in part for c in "[]") and part not in {"str", "int", "float", "bool"}]
    field = ".".join(location)
    if not field:
        return f"Invalid request body: {first.get('msg')}", None
    return f"Field '{field}': {first.get('msg')}", field


class RequestGate:
    """Pure ASGI middleware in llama-server's order: CORS, OPTIONS, loading (503), API key (401)."""

    def __init__(self, app: ASGIApp, *, registry: ModelRegistry, keys: KeyRing, cors_origins: str,
                 body_timeout: float, cors_methods: str = CORS_METHODS, cors_headers: str | None = None,
                 cors_credentials: bool = True):
        self.app = app
        self.registry = registry
        self.keys = keys
        self.cors_origins = cors_origins
        self.body_timeout = body_timeout
        self.cors_methods = cors_methods  # --cors-methods
        self.cors_headers = cors_headers  # --cors-headers; None: the headers the preflight asks for
        self.cors_credentials = cors_credentials  # --no-cors-credentials: "false", and * stays * (llama-server)

    def _allow_origin(self, origin: str) -> str | None:
        if self.cors_origins == "*":
            return (origin or "*") if self.cors_credentials else "*"
        if self.cors_origins == "localhost":
            host = origin.split("://", 1)[-1].rsplit(":", 1)[0] if origin else ""
            if origin.split("://", 1)[-1].startswith("[::1]"):
                host = "[::1]"
            return origin if host in LOCAL_HOSTS else None
        allowed = [o.strip() for o in self.cors_origins.split(",")]
        return origin if origin in allowed else (allowed[0] if len(allowed) == 1 else None)

    def _client_name(self, sent: str) -> str | None:
        """The name of the key sent (from --api-key-file), or None for no key or a wrong one."""
        return self.keys.name_for(sent) if self.keys else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        allow_origin = self._allow_origin(headers.get("origin", ""))
        cors = [(b"access-control-allow-credentials", b"true" if self.cors_credentials else b"false")]
        if allow_origin:
            cors.insert(0, (b"access-control-allow-origin", allow_origin.encode("latin-1")))

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [(_wire_name(k), v) for k, v in [*message.get("headers", []), *cors]] + [
                    (b"server", b"kinetic")]
            await send(message)

        path = scope["path"]
        # Who is asking, by name and never by key: for the ledger, the fair queue, the dashboard; and
        # in which role (classroom/roles.py), for what the routes show them.
        sent = key_from_headers(headers)
        client_name = self._client_name(sent)
        state = scope.setdefault("state", {})
        if client_name is not None:
            state["client_name"] = client_name
        state["role"] = role_of(self.keys, sent)
        if scope["method"] == "OPTIONS":
            response: Response = Response(status_code=200, headers={
                "Access-Control-Allow-Methods": self.cors_methods,
                "Access-Control-Allow-Headers": self.cors_headers or headers.get("access-control-request-headers", "*")
                or "*"})
        elif is_public_page(scope["method"], path):  # no key, and served while loading (the page says so)
            await self._call_app(scope, receive, send_with_cors)
            return
        elif not self.registry.ready:
            response = error_response(path, UnavailableError("Loading model"))
        elif self.keys and path not in PUBLIC_PATHS and client_name is None:
            response = error_response(path, UnauthorizedError("Invalid API Key"))
        elif needs_admin(scope["method"], path) and (refusal := self._admin_refusal(sent)) is not None:
            response = error_response(path, refusal)
        else:
            await self._call_app(_as_json(scope, headers), receive, send_with_cors)
            return
        await response(scope, receive, send_with_cors)

    def _admin_refusal(self, sent: str) -> KineticError | None:
        """A management route: None for the admin, else the 403 (a student) or 401 (no key) to answer."""
        try:
            require_admin(self.keys, sent)
        except KineticError as err:
            return err
        return None

    async def _call_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Runs the app with a deadline on each body read: a client that sends its headers and then
        stalls gets a 408 and its connection closed. Once the body is complete, reads (the
        disconnect watch of a long stream) have no deadline."""
        body_complete = False
        timed_out = False

        async def receive_with_deadline() -> Message:
            nonlocal body_complete, timed_out
            if body_complete:
                return await receive()
            try:
                with anyio.fail_after(self.body_timeout):
                    message = await receive()
            except TimeoutError:
                timed_out = True
                raise
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_complete = True
            return message

        async def send_unless_timed_out(message: Message) -> None:
            if not timed_out:
                await send(message)
            elif message["type"] == "http.response.start":  # replace the app's answer with a 408
                err = RequestTimeoutError(f"request body not received within {self.body_timeout:g} s")
                response = error_response(scope["path"], err)
                response.headers["connection"] = "close"
                await response(scope, receive, send)

        await self.app(scope, receive_with_deadline, send_unless_timed_out)


def _wire_name(name: bytes) -> bytes:
    """CORS headers spelled as llama-server sends them (Access-Control-Allow-Origin): header names
    are case-insensitive, but scripts that read them into a plain dict look them up that way."""
    if name.lower().startswith(b"access-control-"):
        return b"-".join(part.capitalize() for part in name.lower().split(b"-"))
    return name


def _as_json(scope: Scope, headers: dict[str, str]) -> Scope:
    """Bodies are JSON whatever Content-Type says (curl -d sends form encoding), as in llama-server."""
    content_type = headers.get("content-type", "")
    if scope["method"] != "POST" or "json" in content_type or content_type.startswith("multipart/"):
        return scope
    raw = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
    return {**scope, "headers": raw + [(b"content-type", b"application/json")]}


def create_app(
    models: Service | ModelRegistry,
    *,
    on_ready: Callable[[], None] | None = None,
    on_load_failure: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The app for one Service (loaded in the background; until then every route is 503), or for a
    router's registry (ready at once; its models load on demand)."""
    registry = models if isinstance(models, ModelRegistry) else ModelRegistry.single(models)
    settings = registry.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with idle_sleep.watching(registry.sleeper), models_lifespan(app):
            yield

    @asynccontextmanager
    async def models_lifespan(app: FastAPI) -> AsyncIterator[None]:
        if registry.router:
            if on_ready is not None:
                on_ready()
            startup = asyncio.create_task(registry.load_on_startup())
            try:
                yield
            finally:
                startup.cancel()
                registry.close()
            return
        service = registry.only.service
        assert service is not None

        async def load() -> None:
            try:
                await asyncio.to_thread(service.engine.load)
                service.on_model_loaded()
                registry.only.state = ModelState.LOADED
                log.info("model loaded: %s (%s), %d slot(s) of %d tokens, chat template %s",
                         service.model_name, service.info.ftype, service.engine.n_slots,
                         service.engine.slot_n_ctx, service.template.origin if service.template else "-")
                if on_ready is not None:
                    on_ready()
            except Exception as exc:  # reported by the CLI as one line, then the server stops
                app.state.load_error = exc
                if on_load_failure is not None:
                    on_load_failure(exc)

        loader = asyncio.create_task(load())
        try:
            yield
        finally:
            loader.cancel()
            service.engine.close()

    app = FastAPI(title="kinetic", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.registry = registry
    # The end of a shutdown's drain (cli.DrainingServer): what is still open fails in its protocol's way.
    app.state.end_streams = partial(registry.end_streams, UnavailableError("the server is shutting down"))
    app.state.load_error = None
    app.state.sse_ping_interval = settings.sse_ping_interval  # read by kinetic.streaming

    @app.exception_handler(KineticError)
    async def kinetic_error(request: Request, exc: KineticError) -> JSONResponse:
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = validation_message(exc)
        return error_response(request.url.path, InvalidRequestError(message, param=field))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code in (404, 405):
            return error_response(request.url.path, NotFoundError("File Not Found"))
        if exc.status_code == 400:  # e.g. a body that is not valid UTF-8
            return error_response(request.url.path, InvalidRequestError(f"Invalid request body: {exc.detail}"))
        if exc.status_code == 413:
            return error_response(request.url.path, PayloadTooLargeError(str(exc.detail)))
        log.warning("unexpected HTTP %d on %s: %s", exc.status_code, request.url.path, exc.detail)
        return error_response(request.url.path, ServerError(str(exc.detail)))

    @app.exception_handler(ClientDisconnected)
    async def client_gone(request: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return error_response(request.url.path, ServerError(f"internal error: {type(exc).__name__}"))

    app.include_router(openai_router)
    app.include_router(llamacpp_router)
    app.include_router(anthropic_router)
    app.include_router(responses_router)
    app.include_router(ollama_router)
    app.include_router(web_router)
    app.add_middleware(ClientIdentity)  # inside the gate, which names the caller
    keys = settings.key_ring()
    app.state.keys = keys
    app.add_middleware(RequestGate, registry=registry, keys=keys,
                       cors_origins=settings.cors_policy, body_timeout=settings.body_timeout,
                       cors_methods=settings.cors_methods, cors_headers=settings.cors_headers,
                       cors_credentials=settings.cors_credentials)
    # The request recorder, added last: outermost, so it also sees the gate's 401s. Its records feed
    # the dashboard always, and the ledger file with --ledger.
    app.state.class_stats = ClassStats()
    writer = LedgerWriter(settings.ledger, content=settings.ledger_content) if settings.ledger else None
    app.add_middleware(LedgerMiddleware, writer=writer, sinks=[app.state.class_stats], keyed=bool(keys))
    return app
