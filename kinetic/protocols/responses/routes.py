"""OpenAI Responses routes: /v1/responses, /v1/responses/input_tokens, and the stored responses
(GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items); each also without /v1."""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from kinetic.backends.base import require
from kinetic.classroom.caller import Caller
from kinetic.classroom.identity import caller_of
from kinetic.errors import field_error
from kinetic.model_registry.deps import BackendDep
from kinetic.protocols.common.app_parts import installed
from kinetic.protocols.common.streaming import respond
from kinetic.protocols.responses import items, translate
from kinetic.protocols.responses.store import ResponseStore, StoredResponse
from kinetic.protocols.responses.types import InputTokensRequest, ResponsesRequest

router = APIRouter()


def response_store(request: Request) -> ResponseStore:
    return installed(request.app, ResponseStore)


@router.post("/v1/responses")
@router.post("/responses")
async def create_response(body: ResponsesRequest, request: Request, backend: BackendDep) -> Response:
    store, caller = response_store(request), caller_of(request)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        history = store.get(body.previous_response_id, caller, param="previous_response_id").history
    chat = translate.to_chat_request(body, items.history_items(history))
    generation_request, answer_format = await backend.prepare_chat(chat)
    ctx = translate.response_context(body, answer_format, model=backend.name)
    if body.store is not False:
        inputs = items.input_item_records(body)
        ctx.on_completed = partial(_store, store, caller, ctx.id, inputs, history)
    generation = await backend.start(generation_request)
    return await respond(request, generation, stream=bool(body.stream), encoder=translate.EventEncoder(ctx),
                         to_body=partial(translate.to_response, ctx=ctx))


def _store(store: ResponseStore, caller: Caller, response_id: str, inputs: list[dict[str, Any]],
           history: list[dict[str, Any]], response: dict[str, Any]) -> None:
    store.put(StoredResponse(id=response_id, owner=caller.name, created=time.time(), body=response,
                             input_items=inputs, history=[*history, *inputs, *response["output"]]))


@router.post("/v1/responses/input_tokens")
@router.post("/responses/input_tokens")
async def count_input_tokens(body: InputTokensRequest, request: Request, backend: BackendDep) -> dict[str, Any]:
    require(backend.capabilities.tokenizer, backend, request.url.path, "its tokenizer and template are the "
            "server's behind it")
    return translate.input_tokens_body(await backend.count_chat_tokens(translate.to_chat_request(body)))


@router.get("/v1/responses/{response_id}")
@router.get("/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> dict[str, Any]:
    return response_store(request).get(response_id, caller_of(request)).body


@router.delete("/v1/responses/{response_id}")
@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    response_store(request).delete(response_id, caller_of(request))
    return {"id": response_id, "object": "response", "deleted": True}


@router.get("/v1/responses/{response_id}/input_items")
@router.get("/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request, limit: int = Query(20),
                           order: Literal["asc", "desc"] = Query("desc"), after: str | None = Query(None)
                           ) -> dict[str, Any]:
    """OpenAI's list: newest first unless `order=asc`, `limit` (1-100) items after the item `after`."""
    if not 1 <= limit <= 100:
        raise field_error("limit", f"must be between 1 and 100, but got {limit}")
    items = response_store(request).get(response_id, caller_of(request)).input_items
    items = items[::-1] if order == "desc" else list(items)
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise field_error("after", f"no input item {after!r} in response {response_id!r}")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
