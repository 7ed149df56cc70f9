"""The error funnel: every exception a route raises, and every error Starlette answers itself (404,
405, an undecodable body, a body too large), becomes one KineticError rendered in the envelope of the
protocol the request was for (kinetic.protocols.catalog)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from kinetic.classroom.request_record import request_record
from kinetic.errors import (
    ClientDisconnected,
    InvalidRequestError,
    KineticError,
    NotFoundError,
    PayloadTooLargeError,
    ServerError,
)
from kinetic.protocols.catalog import error_response

log = logging.getLogger(__name__)


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


def _answer(request: Request, err: KineticError) -> JSONResponse:
    request_record(request).note_error(err)
    return error_response(request.url.path, err, request.method)


def http_error(exc: StarletteHTTPException) -> KineticError:
    """Starlette's own refusals as kinetic's kinds."""
    if exc.status_code in (404, 405):
        return NotFoundError("File Not Found")
    if exc.status_code == 400:  # e.g. a body that is not valid UTF-8
        return InvalidRequestError(f"Invalid request body: {exc.detail}")
    if exc.status_code == 413:
        return PayloadTooLargeError(str(exc.detail))
    log.warning("unexpected HTTP %d: %s", exc.status_code, exc.detail)
    return ServerError(str(exc.detail))


def install_error_funnel(app: FastAPI) -> None:
    @app.exception_handler(KineticError)
    async def kinetic_error(request: Request, exc: KineticError) -> JSONResponse:
        return _answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = validation_message(exc)
        return _answer(request, InvalidRequestError(message, param=field))

    @app.exception_handler(StarletteHTTPException)
    async def starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _answer(request, http_error(exc))

    @app.exception_handler(ClientDisconnected)
    async def client_gone(request: Request, exc: ClientDisconnected) -> Response:
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return _answer(request, ServerError(f"internal error: {type(exc).__name__}"))
