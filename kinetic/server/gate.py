"""The request gate, in front of every route: CORS, the preflight, "loading" (503), the API key (401)
and the admin role (403), the key's limits (403 outside its dates or hours, 429 over its budget, with
`x-ratelimit-*` headers), the class record (503 while the ledger cannot be written), and a deadline
on reading the body (408). It resolves the request's one Caller (classroom/caller.py) and names it on
the request's record (classroom/request_record.py), where everything after it reads it."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from fastapi.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kinetic.classroom.budgets import Budgets
from kinetic.classroom.caller import BATCH_PRIORITY, BatchOrigin, Caller
from kinetic.classroom.keys import KeyRing, key_from_headers
from kinetic.classroom.ledger import LedgerWriter, recorded
from kinetic.classroom.limits import Limits
from kinetic.classroom.request_record import request_record
from kinetic.classroom.roles import Role, needs_admin, require_admin, role_of
from kinetic.errors import KineticError, RecordUnwritableError, RequestTimeoutError, UnauthorizedError, UnavailableError
from kinetic.model_registry.registry import ModelRegistry
from kinetic.protocols.catalog import error_response
from kinetic.web.routes import is_public_page

PUBLIC_PATHS = frozenset({"/health", "/v1/health"})
READ_METHODS = frozenset({"GET", "HEAD"})
CORS_METHODS = "GET, POST, DELETE, OPTIONS"
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")


class RequestGate:
    """Pure ASGI middleware in llama-server's order: CORS, OPTIONS, loading (503), API key (401)."""

    def __init__(self, app: ASGIApp, *, registry: ModelRegistry, keys: KeyRing, budgets: Budgets, cors_origins: str,
                 body_timeout: float, cors_methods: str = CORS_METHODS, cors_headers: str | None = None,
                 cors_credentials: bool = True, ledger: LedgerWriter | None = None):
        self.app = app
        self.ledger = ledger  # --ledger: a request it cannot record is refused before it is answered
        self.registry = registry
        self.keys = keys
        self.budgets = budgets
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

    def caller(self, scope: Scope, sent: str, batch: BatchOrigin | None) -> Caller:
        """Who sent `sent`: its key's name and limits (None and none for no key or a wrong one), its role. A
        batch's line is its owner's, under the limits the owner's key has now (none once that key is gone)."""
        if batch is not None:
            owner = self.keys.entry_named(batch.owner) if self.keys and batch.owner else None
            if self.keys and owner is None:
                return Caller(None, Role.STUDENT, addr="batch")
            limits = replace(owner.limits if owner else Limits(), priority=BATCH_PRIORITY)
            return Caller(batch.owner, Role.ADMIN if batch.admin else Role.STUDENT, limits, "batch")
        entry = self.keys.entry_for(sent) if self.keys else None
        addr = (scope.get("client") or ("", 0))[0]
        return Caller(entry.name if entry else None, role_of(self.keys, sent),
                      entry.limits if entry else Limits(), addr)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        allow_origin = self._allow_origin(headers.get("origin", ""))
        cors = [(b"access-control-allow-credentials", b"true" if self.cors_credentials else b"false")]
        if allow_origin:
            cors.insert(0, (b"access-control-allow-origin", allow_origin.encode("latin-1")))
        path = scope["path"]
        # Who is asking, by name and never by key: for the ledger, the fair queue, the budgets, the
        # dashboard; in which role (classroom/roles.py), for what the routes show them.
        sent = key_from_headers(headers)
        record = request_record(scope)
        caller = self.caller(scope, sent, record.batch)
        record.identify(caller)
        cors += self.budgets.headers(caller)  # what the key's budget has left, on every answer

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [(_wire_name(k), v) for k, v in [*message.get("headers", []), *cors]] + [
                    (b"server", b"kinetic")]
            await send(message)

        if scope["method"] == "OPTIONS":
            response: Response = Response(status_code=200, headers={
                "Access-Control-Allow-Methods": self.cors_methods,
                "Access-Control-Allow-Headers": self.cors_headers or headers.get("access-control-request-headers", "*")
                or "*"})
        elif is_public_page(scope["method"], path):  # no key, and served while loading (the page says so)
            await self._call_app(scope, receive, send_with_cors)
            return
        elif not self.registry.ready:
            response = refuse(scope, UnavailableError("Loading model"))
        elif self.keys and path not in PUBLIC_PATHS and caller.name is None:
            response = refuse(scope, UnauthorizedError("Invalid API Key"))
        elif needs_admin(scope["method"], path) and (refusal := self._admin_refusal(sent)) is not None:
            response = refuse(scope, refusal)
        elif path not in PUBLIC_PATHS and (limit := self.budgets.refusal(caller, scope["method"], path)) is not None:
            response = refuse(scope, limit)
        elif (unrecordable := self._record_refusal(scope["method"], path)) is not None:
            response = refuse(scope, unrecordable)
        else:
            await self._call_app(_as_json(scope, headers), receive, send_with_cors)
            return
        await response(scope, receive, send_with_cors)

    def _record_refusal(self, method: str, path: str) -> KineticError | None:
        """The 503 for a recorded request that would change or generate something while the ledger
        cannot be written (unless --ledger-best-effort). Reads (GET: /slots, /metrics, /health) still
        answer, so the instructor can look at what is wrong."""
        ledger = self.ledger
        if (ledger is None or ledger.best_effort or method in READ_METHODS or not recorded(path)
                or ledger.writable()):
            return None
        return RecordUnwritableError(ledger.problem or "cannot write the class record")

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
                async with asyncio.timeout(self.body_timeout):  # asyncio's: anyio's cancel scope cost ~30 us a request
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
                response = refuse(scope, err)
                response.headers["connection"] = "close"
                await response(scope, receive, send)

        await self.app(scope, receive_with_deadline, send_unless_timed_out)


def refuse(scope: Scope, err: KineticError) -> Response:
    """The gate's own answer `err`, in the request's protocol, noted for its ledger line."""
    request_record(scope).note_error(err)
    return error_response(scope["path"], err, scope["method"])


class _AsSpelled(bytes):
    """A header name that goes on the wire as spelled: uvicorn's httptools protocol writes every name
    lowercased (`name.lower()`), and this one's lower() is itself."""

    def lower(self) -> bytes:
        return self


_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})  # uvicorn reads these, lowercased


def _wire_name(name: bytes) -> bytes:
    """CORS headers spelled as llama-server sends them (Access-Control-Allow-Origin), and any other name the
    app spelled with capitals (Process-Start-Time-Unix) as it spelled it: header names are case-insensitive,
    but scripts that read them into a plain dict (llama.cpp's own tests) look them up that way."""
    lowered = name.lower()
    if lowered.startswith(b"access-control-"):
        return _AsSpelled(b"-".join(part.capitalize() for part in lowered.split(b"-")))
    if name != lowered and lowered not in _FRAMING:
        return _AsSpelled(name)
    return name


def _as_json(scope: Scope, headers: dict[str, str]) -> Scope:
    """Bodies are JSON whatever Content-Type says (curl -d sends form encoding), as in llama-server."""
    content_type = headers.get("content-type", "")
    if scope["method"] != "POST" or "json" in content_type or content_type.startswith("multipart/"):
        return scope
    raw = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
    return {**scope, "headers": raw + [(b"content-type", b"application/json")]}
