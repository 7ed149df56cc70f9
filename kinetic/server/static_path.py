"""--path DIR: static files served from a folder at the root (llama-server's set_base_dir), ahead of the
routes, so a folder with an index.html replaces the built-in chat page. A path that names no file in the
folder goes on to the app."""

from __future__ import annotations

from pathlib import Path

from starlette.responses import FileResponse
from starlette.types import ASGIApp, Receive, Scope, Send


class StaticPath:
    def __init__(self, app: ASGIApp, folder: str):
        self.app = app
        self.folder = Path(folder).expanduser().resolve()

    def file_for(self, path: str) -> Path | None:
        """The file a GET path names inside the folder (a directory: its index.html); never outside it."""
        candidate = (self.folder / path.lstrip("/")).resolve()
        if candidate.is_dir():
            candidate = candidate / "index.html"
        if candidate.is_file() and candidate.is_relative_to(self.folder):
            return candidate
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            found = self.file_for(scope["path"])
            if found is not None:
                await FileResponse(found)(scope, receive, send)
                return
        await self.app(scope, receive, send)
