"""Who is asking, carried from the request gate down to the scheduler's fair queue.

The gate resolves one `Caller` (classroom/caller.py) and puts it in the ASGI scope's state. The
layers below the routes (a backend naming its request for the fair queue) have no request object:
this middleware makes the same Caller current in a context variable, which follows the request into
its route and the worker threads it starts.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from kinetic.classroom.caller import NOBODY, Caller

CALLER: ContextVar[Caller] = ContextVar("kinetic_caller", default=NOBODY)
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


def caller_in(scope: Scope) -> Caller:
    """The Caller the gate put in `scope` (NOBODY before the gate, e.g. a CORS preflight)."""
    caller = scope.get("state", {}).get("caller")
    return caller if isinstance(caller, Caller) else NOBODY


def caller_of(request: Request) -> Caller:
    return caller_in(request.scope)


class ClientIdentity:
    """Pure ASGI middleware (inside the gate): makes the caller current for the request."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = CALLER.set(caller_in(scope))
        state_token = REQUEST_STATE.set(scope.setdefault("state", {}))
        try:
            await self.app(scope, receive, send)
        finally:
            REQUEST_STATE.reset(state_token)
            CALLER.reset(token)
