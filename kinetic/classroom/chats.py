"""Conversations of the chat page kept on the server (`--chat-history DIR`), one folder per key name.

A student who moves to another lab PC signs in with the same key and finds their chats again
(llama.cpp#16131 asks this of llama-server's web UI, which keeps them in the browser only). Each
chat is one JSON file, `DIR/<key name>/<chat id>.json`, written whole (a temporary file, then a
rename) so that a crash mid-write leaves the previous version, never half a file. A key name sees
and writes only its own folder: the name comes from the gate, never from the request. On a server
without keys every caller is the one owner `OPEN_OWNER`, as every caller is the admin there.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinetic.classroom.durable import write_whole
from kinetic.classroom.keys import NAME_RE
from kinetic.errors import InsufficientStorageError, InvalidRequestError, NotFoundError, PayloadTooLargeError

CHAT_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPEN_OWNER = "_open"  # no key name may start with "_" here (_owner_folder_name), so it is nobody's folder
MAX_CHAT_BYTES = 8 * 1024 * 1024  # a chat with a few attached photos, as data: URLs, fits
MAX_CHATS_PER_OWNER = 500
MAX_TITLE_CHARS = 200


@dataclass(frozen=True)
class ChatSummary:
    id: str
    title: str
    updated: float  # seconds since the epoch
    n_messages: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "updated": self.updated, "n_messages": self.n_messages}


def check_chat_id(chat_id: str) -> str:
    if not CHAT_ID_RE.match(chat_id):
        raise InvalidRequestError("id: a chat id is 1 to 64 letters, digits, '-' or '_'", param="id")
    return chat_id


def _owner_folder_name(owner: str | None) -> str:
    if owner is None:
        return OPEN_OWNER
    # NAME_RE admits "." and "..": a folder name must never climb out of the root
    if not NAME_RE.match(owner) or owner.startswith(("_", ".")):
        raise InvalidRequestError(f"this key's name cannot name a chat folder (it starts with '.' or '_'): "
                                  f"{owner!r}")
    return owner


class ChatStore:
    """The chats of every key name under one folder. Methods block on the disk: call them from a thread."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # one writer at a time: the count cap and the rename stay true

    def _folder(self, owner: str | None) -> Path:
        return self.root / _owner_folder_name(owner)

    def _path(self, owner: str | None, chat_id: str) -> Path:
        return self._folder(owner) / f"{check_chat_id(chat_id)}.json"

    def summaries(self, owner: str | None) -> list[ChatSummary]:
        """The owner's chats, the most recently saved first."""
        folder = self._folder(owner)
        summaries = []
        for path in folder.glob("*.json") if folder.is_dir() else ():
            chat = _read(path)
            if chat is not None:
                summaries.append(_summary(chat))
        return sorted(summaries, key=lambda summary: summary.updated, reverse=True)

    def get(self, owner: str | None, chat_id: str) -> dict[str, Any]:
        chat = _read(self._path(owner, chat_id))
        if chat is None:
            raise NotFoundError(f"no chat {chat_id!r} is saved under this key", param="id")
        return chat

    def save(self, owner: str | None, chat_id: str, title: str, messages: list[dict[str, Any]]) -> ChatSummary:
        path = self._path(owner, chat_id)
        chat = {"id": chat_id, "title": title[:MAX_TITLE_CHARS], "updated": round(time.time(), 3),
                "messages": messages}
        data = json.dumps(chat, ensure_ascii=False).encode("utf-8")
        if len(data) > MAX_CHAT_BYTES:
            raise PayloadTooLargeError(f"messages: this chat takes {len(data)} bytes, more than the "
                                       f"{MAX_CHAT_BYTES} one saved chat may hold", param="messages")
        with self._lock:
            if not path.exists() and sum(1 for _ in path.parent.glob("*.json")) >= MAX_CHATS_PER_OWNER:
                raise InsufficientStorageError(f"this key already has {MAX_CHATS_PER_OWNER} saved chats: "
                                               "delete some to save new ones")
            write_whole(path, data, what=f"the chat {chat_id!r}")
        return _summary(chat)

    def delete(self, owner: str | None, chat_id: str) -> None:
        path = self._path(owner, chat_id)
        with self._lock:
            try:
                path.unlink()
            except FileNotFoundError:
                raise NotFoundError(f"no chat {chat_id!r} is saved under this key", param="id") from None


def _summary(chat: dict[str, Any]) -> ChatSummary:
    return ChatSummary(id=chat["id"], title=chat["title"], updated=chat["updated"], n_messages=len(chat["messages"]))


def _read(path: Path) -> dict[str, Any] | None:
    try:
        chat = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # a file someone edited by hand into something else: not a chat this page can show
    fields: dict[str, type | tuple[type, ...]] = {"id": str, "title": str, "updated": (int, float), "messages": list}
    if not isinstance(chat, dict) or not all(isinstance(chat.get(k), t) for k, t in fields.items()):
        return None
    return chat
