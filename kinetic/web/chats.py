"""The chat page's saved conversations (`--chat-history DIR`): `/chats` lists the caller's, `/chats/{id}`
reads, saves (PUT, the whole chat) and deletes one. A key sees only its own: the owner is the key's
name as the gate resolved it, never a field of the request (kinetic.classroom.chats).

Any key may call them (docs/reference/routes.md). They are the page's own plumbing, so the ledger
does not record them (classroom/ledger.py), as it does not record the pages.
"""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from kinetic.classroom.chats import MAX_TITLE_CHARS, ChatStore
from kinetic.classroom.request_record import caller_of
from kinetic.errors import NotFoundError
from kinetic.model_registry.deps import server_state

router = APIRouter()

CHAT_HISTORY_OFF = "this server keeps no chats: start kinetic with --chat-history DIR to keep them"


class SavedChat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    title: str = Field(max_length=MAX_TITLE_CHARS)
    messages: list[dict[str, Any]]


def _store(request: Request) -> ChatStore:
    store = server_state(request.app).chat_store
    if store is None:
        raise NotFoundError(CHAT_HISTORY_OFF)
    return store


def _owner(request: Request) -> str | None:
    """The caller's key name (None on a server without keys: one shared history, as one user has)."""
    return caller_of(request).name


@router.get("/chats")
async def list_chats(request: Request) -> dict[str, Any]:
    store, owner = _store(request), _owner(request)
    summaries = await anyio.to_thread.run_sync(store.summaries, owner)
    return {"object": "list", "data": [summary.to_json() for summary in summaries]}


@router.get("/chats/{chat_id}")
async def read_chat(chat_id: str, request: Request) -> dict[str, Any]:
    store, owner = _store(request), _owner(request)
    return await anyio.to_thread.run_sync(store.get, owner, chat_id)


@router.put("/chats/{chat_id}")
async def save_chat(chat_id: str, chat: SavedChat, request: Request) -> dict[str, Any]:
    store, owner = _store(request), _owner(request)
    summary = await anyio.to_thread.run_sync(store.save, owner, chat_id, chat.title, chat.messages)
    return summary.to_json()


@router.delete("/chats/{chat_id}")
async def delete_chat(chat_id: str, request: Request) -> dict[str, Any]:
    store, owner = _store(request), _owner(request)
    await anyio.to_thread.run_sync(store.delete, owner, chat_id)
    return {"id": chat_id, "deleted": True}
