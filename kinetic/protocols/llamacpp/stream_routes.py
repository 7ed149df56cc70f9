"""llama-server's resumable-stream routes, over the streams kept for `X-Conversation-Id`
(protocols/common/stream_buffers.py): GET /v1/stream?conv_id=ID&from=N replays one from byte N and then
follows it live, DELETE /v1/stream?conv_id=ID stops it, POST /v1/streams/lookup tells which of the
asked-for ids have one.

The id travels in the query string, as in llama-server, because a router's ids embed model names with
slashes. On a keyed server the ids are the caller's own: an id the caller has no stream on is a 404 on
all three routes, whether another key has one or nobody does, so a 404 tells nothing about other keys.
On an open server DELETE answers 204 for any id and lookup an empty list, as llama-server does.
In a router, an id whose request still waits for its model (model_registry/waiting_streams.py) is a 503 to
GET (retry: the stream appears once the model is loaded), and DELETE cancels that request.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from kinetic.classroom.request_record import caller_of
from kinetic.errors import InvalidRequestError, NotFoundError, UnavailableError
from kinetic.model_registry.deps import server_state
from kinetic.protocols.common.app_parts import installed
from kinetic.protocols.common.stream_buffers import StreamBuffer, StreamBuffers
from kinetic.protocols.common.streaming import replay_stream

router = APIRouter()

NOT_FOUND = "Stream not found or expired"


def _buffers(request: Request) -> StreamBuffers:
    return installed(request.app, StreamBuffers)


def _keyed(request: Request) -> bool:
    return bool(server_state(request.app).keys)


def _conversation_id(conv_id: str) -> str:
    if not conv_id:
        raise InvalidRequestError("Missing conversation id: conv_id is required", param="conv_id")
    return conv_id


def _offset(raw: str, buffer: StreamBuffer) -> int:
    """`from`: a byte offset into the stream (llama-server counts bytes, not events); 0 when absent."""
    if not raw:
        return 0
    if not raw.isdigit():
        raise InvalidRequestError("Invalid 'from' offset: from must be a non-negative integer", param="from")
    offset = int(raw)
    if offset < buffer.dropped_bytes:
        raise InvalidRequestError("Stream offset lost, please restart: from is before the bytes still kept",
                                  param="from")
    return offset


@router.get("/v1/stream")
async def get_stream(request: Request, conv_id: str = "") -> StreamingResponse:
    buffer = _buffers(request).get(caller_of(request).name, _conversation_id(conv_id))
    if buffer is None:
        if server_state(request.app).registry.waiting_streams.waiting(caller_of(request).name, conv_id):
            raise UnavailableError("Stream owner model is loading, retry later")  # a router's load: retry
        raise NotFoundError(NOT_FOUND)
    offset = _offset(request.query_params.get("from", ""), buffer)
    return replay_stream(buffer, offset)


@router.delete("/v1/stream")
async def delete_stream(request: Request, conv_id: str = "") -> Response:
    owner = caller_of(request).name
    waiting = server_state(request.app).registry.waiting_streams.stop(owner, _conversation_id(conv_id))
    stopped = _buffers(request).stop(owner, conv_id) or waiting
    if not stopped and _keyed(request):
        raise NotFoundError(NOT_FOUND)
    return Response(status_code=204)


def _asked_ids(body: bytes) -> list[str]:
    """`conversation_ids` from the body; like llama-server, anything that is not a non-empty string is skipped."""
    try:
        parsed = json.loads(body or b"{}")
    except ValueError as err:
        raise InvalidRequestError(f"invalid body: {err}") from err
    ids = parsed.get("conversation_ids") if isinstance(parsed, dict) else None
    if not isinstance(ids, list):
        return []
    return [value for value in ids if isinstance(value, str) and value]


def _described(buffer: StreamBuffer) -> dict[str, Any]:
    return {"conversation_id": buffer.conversation_id, "is_done": buffer.done, "total_bytes": buffer.total_bytes,
            "started_at": int(buffer.started_at),
            "completed_at": int(buffer.completed_at) if buffer.completed_at is not None else 0}


@router.post("/v1/streams/lookup")
async def lookup_streams(request: Request) -> list[dict[str, Any]]:
    asked = _asked_ids(await request.body())
    found = _buffers(request).lookup(caller_of(request).name, asked)
    if asked and not found and _keyed(request):
        raise NotFoundError(NOT_FOUND)
    return [_described(buffer) for buffer in found]
