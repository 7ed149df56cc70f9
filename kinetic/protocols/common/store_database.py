"""The one SQLite database of what the OpenAI surface keeps for its clients: the stored responses and the
conversations (protocols/responses), the files and the batches (protocols/batches); each store makes its own
tables. A file (`--store-dir`, else beside the ledger) that survives a restart, or one in memory.

Every stored object belongs to the key that made it (`may_read`), and OpenAI's lists page the same way (`page`).
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from kinetic.classroom.caller import Caller
from kinetic.classroom.roles import Role
from kinetic.errors import field_error

FILE_NAME = "responses.sqlite3"


class StoreDatabase:
    """The SQLite database the stores share, and the lock their users take."""

    def __init__(self, folder: Path | None = None):
        self.path = folder / FILE_NAME if folder is not None else None
        self.lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(self.path or ":memory:"), check_same_thread=False, isolation_level=None)
        if self.path is not None:
            # A commit is in the operating system's hands before the answer's last byte, so a kill -9 keeps it; as
            # the ledger's lines, it is not fsynced (only a power cut could cost it). A rollback journal, not WAL:
            # no shared-memory file, and the files stay small on a small disk beside the ledger.
            self.db.execute("PRAGMA page_size=1024")
            self.db.execute("PRAGMA journal_mode=DELETE")
            self.db.execute("PRAGMA synchronous=OFF")

    @property
    def where(self) -> str:
        return str(self.path) if self.path is not None else "memory (a restart empties it)"

    def sizes(self) -> dict[str, Any]:
        """What it holds, for the dashboard: where, its bytes, and the rows of each store's main table."""
        with self.lock:
            tables = [row[0] for row in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                                         "AND name IN ('responses', 'conversations', 'files', "
                                                         "'batches') ORDER BY name")]
            counts = {name: int(self.db.execute(f"SELECT count(*) FROM {name}").fetchone()[0]) for name in tables}
            pages = self.db.execute("PRAGMA page_count").fetchone()[0]
            page_size = self.db.execute("PRAGMA page_size").fetchone()[0]
        return {"where": self.where, "bytes": int(pages * page_size), **counts}

    def close(self) -> None:
        with self.lock:
            self.db.close()


def may_read(caller: Caller, owner: str | None) -> bool:
    """The owner reads what is theirs, and the admin reads everything."""
    return owner == caller.name or (caller.role is Role.ADMIN and caller.name is not None)


def page(items: list[dict[str, Any]], *, limit: int, order: str, after: str | None, owner_id: str
         ) -> dict[str, Any]:
    """OpenAI's list of items: newest first unless `order` is asc, `limit` of them after the item `after`."""
    if not 1 <= limit <= 100:
        raise field_error("limit", f"must be between 1 and 100, but got {limit}")
    ordered = items[::-1] if order == "desc" else list(items)
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise field_error("after", f"no item {after!r} in {owner_id!r}")
        ordered = ordered[ids.index(after) + 1:]
    return listing(ordered[:limit], has_more=len(ordered) > limit)


def listing(data: list[dict[str, Any]], *, has_more: bool = False) -> dict[str, Any]:
    """OpenAI's list object over items with ids."""
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}
