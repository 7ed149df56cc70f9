"""Who is asking, carried from the request gate down to the scheduler's fair queue.

The gate puts the caller's key name (never the key) in the ASGI scope's state as `client_name`.
A server without keys has no names: there the caller's address stands in, so one client looping
requests still cannot starve the others. The name reaches the engine through a context variable,
which follows the request into its route and the worker threads it starts.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

CLIENT: ContextVar[str] = ContextVar("kinetic_client", default="")
# the request's scope state, which the ledger reads once the answer is out: what the layers below the routes
# learn about the request (its media) is noted there
REQUEST_STATE: ContextVar[dict[str, Any] | None] = ContextVar("kinetic_request_state", default=None)


def note_media(images: int, audio: int, tokens: int) -> None:
    """The files a request's prompts read and the prompt tokens they took, for its ledger line (added up over
    the prompts of one request)."""
    state = REQUEST_STATE.get()
    if state is None:
        return
    noted = state.setdefault("media", {"images": 0, "audio": 0, "tokens": 0})
    noted["images"] += images
    noted["audio"] += audio
    noted["tokens"] += tokens


def client_of(scope: Scope) -> str:
    name = scope.get("state", {}).get("client_name")
    if name:
        return str(name)
    client = scope.get("client")
    return f"addr:{client[0]}" if client else "anonymous"


class ClientIdentity:
    """Pure ASGI middleware (inside the gate): makes the caller's identity current for the request."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = CLIENT.set(client_of(scope))
        state_token = REQUEST_STATE.set(scope.setdefault("state", {}))
        try:
            await self.app(scope, receive, send)
        finally:
            REQUEST_STATE.reset(state_token)
            CLIENT.reset(token)
