"""Vertex AI's custom-container contract, as llama-server has it (server-http.cpp `gcp_params`,
`register_gcp_compat`), switched on by the environment Vertex AI sets: `AIP_MODE=PREDICTION`.

- `AIP_HTTP_PORT` (default 8080) replaces --port.
- `AIP_HEALTH_ROUTE`, when set, answers GET as /health does (behind the API key like any other route:
  llama-server keeps only /health and /v1/health public).
- `AIP_PREDICT_ROUTE` (default /predict) takes `{"instances": [...]}` (at most 128), each instance one
  request to another route: `@requestFormat` names it by its path (`/v1/chat/completions`) or by the path in
  camelCase (`chatCompletions`, `applyTemplate`), and the rest of the instance is its JSON body, never
  streamed. The instances run at once; the answer is `{"predictions": [...]}` in their order, each the
  route's JSON body (an error body for an instance that failed, in a 200 all the same).

Each instance runs through the app's routes and error funnel, inside the one request the gate let in: the
caller, its fair-queue place and its budget are the /predict request's, and the ledger writes one line for it
that adds up every instance's counts. The gate's admin rule is applied to each instance's route here, since
the gate only saw the predict route.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Scope

from kinetic.classroom.request_record import caller_of
from kinetic.classroom.roles import Role, admin_refusal, needs_admin
from kinetic.errors import ForbiddenError, InvalidRequestError, KineticError, ServerError
from kinetic.model_registry.deps import server_state
from kinetic.protocols.catalog import flat_routes
from kinetic.protocols.common.streaming import until_disconnect
from kinetic.protocols.openai.translate import error_body

log = logging.getLogger(__name__)

MAX_INSTANCES = 128  # llama-server's bound on one predict request
DEFAULT_PORT = 8080
DEFAULT_PREDICT_ROUTE = "/predict"
STREAMED = ("text/event-stream", "application/x-ndjson")


class VertexSetupError(ValueError):
    """The AIP_* environment cannot be served (a bad port, a predict route that is already a route)."""


@dataclass(frozen=True)
class VertexSettings:
    port: int
    predict_route: str
    health_route: str | None  # None: /health alone


def _route(value: str) -> str:
    return value if value.startswith("/") else "/" + value


def vertex_settings(environ: Mapping[str, str]) -> VertexSettings | None:
    """The AIP_* variables, or None when AIP_MODE is not PREDICTION (an empty variable counts as unset)."""
    if environ.get("AIP_MODE") != "PREDICTION":
        return None
    port = environ.get("AIP_HTTP_PORT") or str(DEFAULT_PORT)
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise VertexSetupError(f"AIP_HTTP_PORT={port} is not a port number")
    health = environ.get("AIP_HEALTH_ROUTE")
    return VertexSettings(port=int(port), predict_route=_route(environ.get("AIP_PREDICT_ROUTE") or
                                                                DEFAULT_PREDICT_ROUTE),
                          health_route=_route(health) if health else None)


def request_format(path: str) -> str:
    """A route's camelCase name: /v1/chat/completions -> chatCompletions, /apply-template -> applyTemplate;
    a path parameter ends it (/slots/{id_slot} -> slots)."""
    name = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    words = name.split("{", 1)[0].replace("-", "/").replace("_", "/").split("/")
    words = [word for word in words if word]
    return "".join([words[0], *(word[:1].upper() + word[1:] for word in words[1:])]) if words else ""


@dataclass(frozen=True)
class Target:
    path: str
    method: str  # POST where the route takes it, else its first method (a GET route gets the body all the same)


def targets(routes: list[Route]) -> tuple[dict[str, Target], dict[str, Target]]:
    """Every route by its camelCase name (the first route to have a name keeps it) and by its path."""
    by_name: dict[str, Target] = {}
    by_path: dict[str, Target] = {}
    for route in routes:
        if not route.methods:
            continue
        target = Target(route.path, "POST" if "POST" in route.methods else sorted(route.methods)[0])
        by_path.setdefault(route.path, target)
        by_name.setdefault(request_format(route.path), target)
    return by_name, by_path


def _claimed(routes: list[Route], path: str) -> bool:
    scope = {"type": "http", "path": path, "root_path": ""}
    return any(route.matches({**scope, "method": method})[0] is not Match.NONE
               for route in routes for method in ("GET", "POST", "DELETE"))


def _internal_error(message: str, err: type[KineticError] = InvalidRequestError) -> dict[str, Any]:
    return error_body(err(message))


class Predictor:
    """The predict route: each instance sent through the app's routes (and error funnel, not its middleware)."""

    def __init__(self, app: FastAPI):
        self.app = app
        handlers = {key: handler for key, handler in app.exception_handlers.items() if key not in (500, Exception)}
        self.routes: ASGIApp = ExceptionMiddleware(app.router, handlers=handlers)
        self.by_name, self.by_path = targets(flat_routes(app.router.routes))

    async def predict(self, request: Request) -> JSONResponse:
        try:
            data = json.loads(await request.body())
        except ValueError as exc:
            raise InvalidRequestError(f"Invalid JSON body: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidRequestError("request body must be a JSON object")
        instances = data.get("instances")
        if not isinstance(instances, list):
            raise InvalidRequestError("request body must include an array field named instances", param="instances")
        if len(instances) > MAX_INSTANCES:
            raise InvalidRequestError(f"instances array exceeds maximum size of {MAX_INSTANCES}", param="instances")
        predictions = await until_disconnect(request, asyncio.gather(
            *(self.instance(request, instance) for instance in instances)))
        return JSONResponse({"predictions": list(predictions)})

    async def instance(self, request: Request, instance: Any) -> Any:
        if not isinstance(instance, dict):
            return _internal_error("each instance must be a JSON object")
        name = instance.get("@requestFormat")
        if not isinstance(name, str):
            return _internal_error("each instance must include a string @requestFormat")
        target = self.by_name.get(name) or self.by_path.get(name)
        if target is None:
            return _internal_error(f"no handler registered for @requestFormat: {name}")
        if needs_admin(target.method, target.path) and caller_of(request).role is not Role.ADMIN:
            return error_body(ForbiddenError(admin_refusal(server_state(self.app).keys)))
        # never streamed: an Ollama route streams unless told not to, the others only when asked
        body = {key: value for key, value in instance.items() if key != "@requestFormat"} | {"stream": False}
        try:
            return await self.call(request, target, json.dumps(body).encode())
        except Exception:  # a bug in one instance's route: that prediction says so, the others stand
            log.exception("predict instance for %s failed", target.path)
            return _internal_error("internal error", ServerError)

    async def call(self, request: Request, target: Target, body: bytes) -> Any:
        """`target`'s answer to `body`, as the route would give it to a client of its own: its JSON, else its
        text, None for no body. The caller (and the state the ledger reads) is the predict request's."""
        headers = [(k, v) for k, v in request.scope["headers"] if k not in (b"content-type", b"content-length")]
        scope: Scope = {**request.scope, "method": target.method, "path": target.path,
                        "raw_path": target.path.encode(), "query_string": b"",
                        "headers": [*headers, (b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]}
        sent = False
        never = asyncio.Event()  # the predict request's own disconnect watch cancels this one

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await never.wait()
            return {"type": "http.disconnect"}

        start: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.routes(scope, receive, send)
        content_type = dict(start.get("headers", [])).get(b"content-type", b"").decode("latin-1")
        if content_type.startswith(STREAMED):
            return _internal_error("predict route does not support streaming responses")
        data = b"".join(chunks)
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data.decode("utf-8", "replace")


def install_vertex(app: FastAPI, settings: VertexSettings) -> None:
    """The predict route (and the health route, when named) over the routes the app has now."""
    routes = flat_routes(app.router.routes)
    if _claimed(routes, settings.predict_route):
        raise VertexSetupError(f"AIP_PREDICT_ROUTE={settings.predict_route} conflicts with an existing route")
    if settings.health_route is not None:
        health = next(route for route in routes if route.path == "/health")
        app.add_api_route(settings.health_route, health.endpoint, methods=["GET"], include_in_schema=False)
    predictor = Predictor(app)
    app.add_api_route(settings.predict_route, predictor.predict, methods=["POST"], include_in_schema=False)
