"""OpenAI Responses routes: /v1/responses (background ones too), /v1/responses/input_tokens, the stored responses
(GET and DELETE /v1/responses/{id}, .../input_items, .../cancel) and the conversations (/v1/conversations...);
each also without /v1."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from kinetic.backends.base import Generating, Tokenizing
from kinetic.classroom.caller import Caller
from kinetic.classroom.ledger import run_record
from kinetic.classroom.outcome import ErrorTold, Outcome
from kinetic.classroom.request_record import RequestRecord, caller_of
from kinetic.errors import InvalidRequestError, KineticError, field_error
from kinetic.model_registry.deps import RecordDep, ServedDep, server_state
from kinetic.protocols.common.app_parts import installed
from kinetic.protocols.common.store_database import listing, page
from kinetic.protocols.common.streaming import respond
from kinetic.protocols.responses import items, translate
from kinetic.protocols.responses.background import BackgroundRuns
from kinetic.protocols.responses.conversations import ConversationStore
from kinetic.protocols.responses.store import ResponseStore, StoredResponse
from kinetic.protocols.responses.types import (
    ConversationRequest,
    ConversationUpdate,
    InputTokensRequest,
    ItemsRequest,
    ResponsesRequest,
)

router = APIRouter()
log = logging.getLogger(__name__)


def response_store(request: Request) -> ResponseStore:
    return installed(request.app, ResponseStore)


def conversation_store(request: Request) -> ConversationStore:
    return installed(request.app, ConversationStore)


def background_runs(request: Request) -> BackgroundRuns:
    return installed(request.app, BackgroundRuns)


@router.post("/v1/responses")
@router.post("/responses")
async def create_response(body: ResponsesRequest, request: Request, served: ServedDep,
                          record: RecordDep) -> Response:
    backend = served.role(Generating, request.url.path)
    store, caller = response_store(request), record.caller
    conversation = items.conversation_id(body)
    history: list[dict[str, Any]] = []
    if conversation is not None:
        history = conversation_store(request).items(conversation, caller, param="conversation")
    elif body.previous_response_id is not None:
        history = store.get(body.previous_response_id, caller, param="previous_response_id").history
    chat = translate.to_chat_request(body, items.history_items(history))
    generation_request, answer_format = await backend.prepare_chat(served.chat(chat), record)
    ctx = translate.response_context(body, answer_format, model=served.name)
    kept = Kept(store if body.store is not False else None, conversation_store(request) if conversation else None,
                caller, ctx.id, conversation, items.input_item_records(body), history)
    ctx.on_completed = kept.completed
    if body.background:
        return await _start_in_background(request, record, body, backend, generation_request, ctx, kept)
    generation = await backend.start(generation_request)
    return await respond(request, generation, stream=bool(body.stream), encoder=translate.EventEncoder(ctx),
                         to_body=partial(translate.to_response, ctx=ctx))


async def _start_in_background(request: Request, record: RequestRecord, body: ResponsesRequest,
                               backend: Generating[Any], generation_request: Any, ctx: translate.ResponseContext,
                               kept: Kept) -> Response:
    """Queued like any request, answered at once; the run keeps its response and its ledger line when it ends."""
    if kept.store is None:
        raise field_error("background", "needs 'store': a background response is read back by its id")
    if body.stream:
        raise field_error("background", "is not streamed here: poll GET /v1/responses/{id} for its end")
    generation = await backend.start(generation_request)
    queued = translate.pending_response(ctx, "queued")
    kept.keep(queued)
    state, route = server_state(request.app), request.url.path

    def ended(status: str, response: dict[str, Any] | None, error: ErrorTold | None, started: float) -> None:
        if response is None:  # cancelled or failed: completed ones were kept by to_response
            told = {"code": error.type, "message": error.message} if status == "failed" and error else None
            kept.keep(translate.pending_response(ctx, status, told))
        state.record(run_record(ctx.outcome, client=kept.caller.name, keyed=bool(state.keys), route=route,
                                started=started, duration=time.monotonic() - started,
                                content=state.registry.settings.ledger_content, error=error))

    background_runs(request).start(ctx.id, generation, partial(translate.to_response, ctx=ctx), ended)
    record.add_outcomes(Outcome(id=ctx.id, model=ctx.model))  # this line names it; the run's line counts it
    return JSONResponse(queued)


@dataclass
class Kept:
    """Where a completed response goes: the store (unless `store` is false), and its conversation's items (its
    input, then its output)."""

    store: ResponseStore | None
    conversations: ConversationStore | None
    caller: Caller
    response_id: str
    conversation: str | None
    inputs: list[dict[str, Any]]
    history: list[dict[str, Any]]

    def keep(self, response: dict[str, Any]) -> None:
        if self.store is not None:
            self.store.put(StoredResponse(id=self.response_id, owner=self.caller.name, created=time.time(),
                                          body=response, input_items=self.inputs,
                                          history=[*self.history, *self.inputs, *response["output"]]))

    def completed(self, response: dict[str, Any]) -> None:
        self.keep(response)
        if self.conversations is not None and self.conversation is not None:
            try:
                self.conversations.add(self.conversation, self.caller, [*self.inputs, *response["output"]], limit=0)
            except KineticError as exc:  # deleted or full meanwhile: the answer itself stands
                log.warning("response %s not added to %s: %s", self.response_id, self.conversation, exc.message)


@router.post("/v1/responses/input_tokens")
@router.post("/responses/input_tokens")
async def count_input_tokens(body: InputTokensRequest, request: Request, served: ServedDep,
                             record: RecordDep) -> dict[str, Any]:
    backend = served.role(Tokenizing, request.url.path)
    return translate.input_tokens_body(await backend.count_chat_tokens(served.chat(translate.to_chat_request(body)),
                                                                       record))


@router.get("/v1/responses/{response_id}")
@router.get("/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> dict[str, Any]:
    return response_store(request).get(response_id, caller_of(request)).body


@router.delete("/v1/responses/{response_id}")
@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    response_store(request).delete(response_id, caller_of(request))
    return {"id": response_id, "object": "response", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel")
@router.post("/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> dict[str, Any]:
    """Ends a background response within a second; one that has ended already is returned as it is."""
    store, caller = response_store(request), caller_of(request)
    if not store.get(response_id, caller).body.get("background"):
        raise InvalidRequestError("Only responses created with background can be cancelled.", param="response_id")
    await background_runs(request).cancel(response_id)
    return store.get(response_id, caller).body


@router.get("/v1/responses/{response_id}/input_items")
@router.get("/responses/{response_id}/input_items")
async def list_input_items(response_id: str, request: Request, limit: int = Query(20),
                           order: Literal["asc", "desc"] = Query("desc"), after: str | None = Query(None)
                           ) -> dict[str, Any]:
    """OpenAI's list: newest first unless `order=asc`, `limit` (1-100) items after the item `after`."""
    listed = response_store(request).get(response_id, caller_of(request)).input_items
    return page(listed, limit=limit, order=order, after=after, owner_id=response_id)



# ------------------------------------------------------------------------------ conversations


@router.post("/v1/conversations")
@router.post("/conversations")
async def create_conversation(body: ConversationRequest, request: Request) -> dict[str, Any]:
    return conversation_store(request).create(caller_of(request), body.metadata or {},
                                              items.item_records(list(body.items or ())))


@router.get("/v1/conversations/{conversation_id}")
@router.get("/conversations/{conversation_id}")
async def retrieve_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    return conversation_store(request).get(conversation_id, caller_of(request))


@router.post("/v1/conversations/{conversation_id}")
@router.post("/conversations/{conversation_id}")
async def update_conversation(conversation_id: str, body: ConversationUpdate, request: Request) -> dict[str, Any]:
    return conversation_store(request).update(conversation_id, caller_of(request), body.metadata)


@router.delete("/v1/conversations/{conversation_id}")
@router.delete("/conversations/{conversation_id}")
async def delete_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    conversation_store(request).delete(conversation_id, caller_of(request))
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


@router.get("/v1/conversations/{conversation_id}/items")
@router.get("/conversations/{conversation_id}/items")
async def list_items(conversation_id: str, request: Request, limit: int = Query(20),
                     order: Literal["asc", "desc"] = Query("desc"), after: str | None = Query(None)) -> dict[str, Any]:
    listed = conversation_store(request).items(conversation_id, caller_of(request))
    return page(listed, limit=limit, order=order, after=after, owner_id=conversation_id)


@router.post("/v1/conversations/{conversation_id}/items")
@router.post("/conversations/{conversation_id}/items")
async def add_items(conversation_id: str, body: ItemsRequest, request: Request) -> dict[str, Any]:
    return listing(conversation_store(request).add(conversation_id, caller_of(request),
                                                   items.item_records(body.items)))


@router.get("/v1/conversations/{conversation_id}/items/{item_id}")
@router.get("/conversations/{conversation_id}/items/{item_id}")
async def retrieve_item(conversation_id: str, item_id: str, request: Request) -> dict[str, Any]:
    return conversation_store(request).item(conversation_id, item_id, caller_of(request))


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}")
@router.delete("/conversations/{conversation_id}/items/{item_id}")
async def delete_item(conversation_id: str, item_id: str, request: Request) -> dict[str, Any]:
    return conversation_store(request).remove_item(conversation_id, item_id, caller_of(request))
