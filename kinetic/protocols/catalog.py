"""Every wire protocol the server speaks, registered once: its routes and its error envelope.

An error is rendered in the envelope of the protocol whose route the request's path matches; a path
no route matches (a 404, or a refusal at the gate) goes by the namespaces a protocol claims here
(Ollama's `/api/...`), else OpenAI's envelope, which is also llama-server's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.routing import BaseRoute, Match, Route

from kinetic.errors import KineticError
from kinetic.protocols.anthropic import translate as anthropic_translate
from kinetic.protocols.anthropic.routes import router as anthropic_router
from kinetic.protocols.batches.routes import router as batches_router
from kinetic.protocols.llamacpp.routes import router as llamacpp_router
from kinetic.protocols.ollama import translate as ollama_translate
from kinetic.protocols.ollama.routes import router as ollama_router
from kinetic.protocols.openai import translate as openai_translate
from kinetic.protocols.openai.routes import router as openai_router
from kinetic.protocols.responses.routes import router as responses_router

ErrorBody = Callable[[KineticError], Any]


@dataclass(frozen=True)
class WireProtocol:
    name: str
    router: APIRouter
    error_body: ErrorBody
    namespaces: tuple[str, ...] = ()  # path prefixes it owns where no route matches (its own 404s)


PROTOCOLS: tuple[WireProtocol, ...] = (
    WireProtocol("openai", openai_router, openai_translate.error_body),
    # llama-server answers HTTP errors in OpenAI's envelope (its stream errors are its own)
    WireProtocol("llamacpp", llamacpp_router, openai_translate.error_body),
    WireProtocol("anthropic", anthropic_router, anthropic_translate.error_body, ("/v1/messages",)),
    WireProtocol("responses", responses_router, openai_translate.error_body),
    WireProtocol("batches", batches_router, openai_translate.error_body),  # OpenAI's files and batches
    WireProtocol("ollama", ollama_router, ollama_translate.error_body, ("/api/",)),
)
DEFAULT = PROTOCOLS[0]


def flat_routes(routes: list[BaseRoute]) -> list[Route]:
    """`routes` in the order they were added, looking through the routers FastAPI wraps on include
    (kinetic includes them without a prefix)."""
    found: list[Route] = []
    for route in routes:
        if isinstance(route, Route):
            found.append(route)
        elif (included := getattr(route, "original_router", None)) is not None:  # FastAPI 0.165+'s _IncludedRouter
            found += flat_routes(included.routes)
    return found


def protocol_for(path: str, method: str = "POST") -> WireProtocol:
    scope = {"type": "http", "path": path, "method": method, "root_path": ""}
    for protocol in PROTOCOLS:
        if any(route.matches(scope)[0] is not Match.NONE for route in protocol.router.routes):
            return protocol
    for protocol in PROTOCOLS:
        if path.startswith(protocol.namespaces):
            return protocol
    return DEFAULT


def error_response(path: str, err: KineticError, method: str = "POST") -> JSONResponse:
    """`err` in the envelope of the protocol `path` belongs to."""
    body = protocol_for(path, method).error_body(err)
    return JSONResponse(body, status_code=err.status, headers=err.headers)
