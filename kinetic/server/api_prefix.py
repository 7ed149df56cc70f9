"""--api-prefix: every route served under a path prefix (llama-server's `api_prefix`), as an ASGI wrapper
around the app, so the routers stay where a reader finds them. A path outside the prefix is a 404."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from kinetic.errors import KineticError, NotFoundError


class ApiPrefix:
    def __init__(self, app: ASGIApp, prefix: str, error_response: Callable[[str, KineticError], ASGIApp]):
        self.app = app
        self.prefix = "/" + prefix.strip("/")
        self.error_response = error_response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == self.prefix or path.startswith(self.prefix + "/"):
            inner = path[len(self.prefix):] or "/"
            # the routes and the request gate (public /health, error shapes by path) see the path inside
            await self.app({**scope, "path": inner, "raw_path": inner.encode("latin-1")}, receive, send)
            return
        response = self.error_response(path, NotFoundError(f"File Not Found: the server's routes are under "
                                                           f"{self.prefix} (--api-prefix)"))
        await response(scope, receive, send)
