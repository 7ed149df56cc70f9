"""A request made inside the server, through the whole app as a client's would go (the ledger, the gate, the
route): a batch's line. Its scope carries the batch's origin, which the request's record takes at the door: the
gate reads it there for the owner's Caller, the ledger for the line's `batch` field. No client can send one,
since only this builds such a scope."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Message

from kinetic.classroom.caller import BatchOrigin
from kinetic.classroom.request_record import BATCH_SCOPE


async def post_json(app: ASGIApp, path: str, body: dict[str, Any], origin: BatchOrigin) -> tuple[int, dict[str, Any]]:
    """POST `body` to `path`: the status and the JSON answer (a body that is not JSON, as an error's message)."""
    raw = json.dumps(body).encode()
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
        "client": ("batch", 0), "server": ("kinetic", 0), BATCH_SCOPE: origin}
    answered = asyncio.Event()
    read = False
    status = 500
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal read
        if not read:
            read = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await answered.wait()  # the route's disconnect watch: this caller never goes away before the answer
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                answered.set()

    try:
        await app(scope, receive, send)
    finally:
        answered.set()
    text = b"".join(chunks)
    try:
        answer = json.loads(text)
    except ValueError:
        answer = {"error": {"message": text.decode("utf-8", "replace"), "type": "server_error"}}
    return status, answer if isinstance(answer, dict) else {"data": answer}
