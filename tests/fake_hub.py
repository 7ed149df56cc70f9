"""A local stand-in for the Hugging Face hub (tests may not reach the real one): the three requests
huggingface_hub makes to resolve and download a repo file, served from files on disk.

Routes: GET /api/models/ORG/REPO[/revision/REV] (model info with the file list), HEAD and GET
/ORG/REPO/resolve/REV/FILE (metadata headers, then the bytes). Anything else is a 404 the way the hub
words it (X-Error-Code: RepoNotFound).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REVISION = "fedcba9876543210fedcba9876543210fedcba98"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, Path]], slow: dict[str, float] | None = None):
        """repos: "org/name" -> {file name in the repo: file on disk}; slow: "org/name" -> seconds to wait
        after each MiB of its files (a download that lasts long enough to be watched and cancelled)."""
        self.repos = repos
        self.slow = slow or {}
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_HEAD(self) -> None:
                hub.requests.append(f"HEAD {self.path}")
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.requests.append(f"GET {self.path}")
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = handler.path.split("?", 1)[0]
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path):
            files = self.repos.get(match.group(1))
            if files is not None:
                info = {"id": match.group(1), "sha": REVISION, "private": False,
                        "siblings": [{"rfilename": name} for name in files]}
                return self.send(handler, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, body)
        if match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/[^/]+/(.+)", path):
            source = self.repos.get(match.group(1), {}).get(match.group(2))
            if source is not None:
                etag = hashlib.sha256(str(source).encode()).hexdigest()
                headers = {"X-Repo-Commit": REVISION, "ETag": f'"{etag}"',
                           "Content-Length": str(source.stat().st_size),
                           "Content-Type": "application/octet-stream"}
                return self.send(handler, 200, source, headers, body, self.slow.get(match.group(1), 0.0))
        self.send(handler, 404, b'{"error": "Repository not found"}',
                  {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"}, body)

    @staticmethod
    def send(handler: BaseHTTPRequestHandler, status: int, content: bytes | Path, headers: dict[str, str],
             body: bool, pause: float = 0.0) -> None:
        handler.send_response(status)
        size = content.stat().st_size if isinstance(content, Path) else len(content)
        headers.setdefault("Content-Length", str(size))
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        if not body:
            return
        if isinstance(content, Path):
            with content.open("rb") as source:
                try:
                    while chunk := source.read(1 << 20):
                        handler.wfile.write(chunk)
                        time.sleep(pause)
                except (BrokenPipeError, ConnectionResetError):
                    pass
        else:
            handler.wfile.write(content)


def lay_out_cache(hub: Path, repos: dict[str, dict[str, Path]], revision: str = REVISION) -> Path:
    """A Hugging Face hub cache on disk, as huggingface_hub leaves it after a download: for each "org/name",
    `models--org--name/refs/main` naming `revision`, and in `snapshots/REVISION/` each file of the repo (a path
    that may hold folders) as a link to its blob under `blobs/`. The blobs are hard links to the given files
    (copies across file systems), so that a DELETE /models that deletes a blob leaves the original alone."""
    import os
    import shutil

    for repo, files in repos.items():
        folder = hub / ("models--" + repo.replace("/", "--"))
        (folder / "refs").mkdir(parents=True, exist_ok=True)
        (folder / "refs" / "main").write_text(revision)
        (folder / "blobs").mkdir(exist_ok=True)
        for name, source in files.items():
            blob = folder / "blobs" / hashlib.sha256(f"{repo}/{name}".encode()).hexdigest()
            if not blob.exists():
                try:
                    os.link(source.resolve(), blob)
                except OSError:
                    shutil.copyfile(source, blob)
            link = folder / "snapshots" / revision / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    return hub
