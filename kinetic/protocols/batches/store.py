"""OpenAI's files (purpose `batch`) and batches, kept in the stored responses' SQLite database (responses/store.py):
on disk beside the ledger or under --store-dir, so that a batch goes on after a restart; in memory otherwise.

As every stored object, a file and a batch belong to the key that made them: another student's key gets the 404
of a missing one and never sees them listed; the admin's key reads them all. Bounded: a key keeps at most
`max_files` files and `max_bytes` bytes of them (the oldest dropped first, unless a batch still reads it), and a
batch's input holds at most MAX_LINES requests.

A batch's progress is one row per finished line (`batch_results`), written as the line ends: a restart loses at
most the line that was running, which runs again. Its output and error files are assembled from those rows when
it ends.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kinetic.classroom.caller import Caller
from kinetic.classroom.roles import Role
from kinetic.errors import InvalidRequestError, NotFoundError, PayloadTooLargeError, field_error
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.store_database import StoreDatabase, may_read

MAX_FILE_BYTES = 100 * 1024 * 1024
MAX_FILES = 100  # per key
MAX_BYTES = 256 * 1024 * 1024  # per key, every file together
MAX_LINES = 50_000  # requests in one batch, as OpenAI
WINDOW_S = 24 * 3600  # completion_window "24h", the only one OpenAI takes
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
FILE_PURPOSES = ("batch", "batch_output")
# OpenAI's statuses: validating -> in_progress -> finalizing -> completed; failed (its input), cancelling ->
# cancelled, expired (its window over first)
RUNNABLE = ("validating", "in_progress", "finalizing", "cancelling")

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, owner TEXT, created REAL NOT NULL, purpose TEXT NOT NULL,
                                  filename TEXT NOT NULL, content BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS files_by_owner ON files (owner, created);
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, owner TEXT, admin INTEGER NOT NULL, created REAL NOT NULL,
                                    record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, created);
CREATE TABLE IF NOT EXISTS batch_results (batch TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL,
                                          result TEXT NOT NULL, PRIMARY KEY (batch, line));
"""


@dataclass(frozen=True)
class BatchLine:
    """One request of a batch's input file."""

    number: int  # from 1, as the error list counts lines
    custom_id: str
    body: dict[str, Any]


@dataclass
class Batch:
    """A batch's row: its OpenAI object (`body`), whose key made it, and with which role."""

    body: dict[str, Any]
    owner: str | None
    admin: bool = False

    @property
    def id(self) -> str:
        return str(self.body["id"])

    @property
    def status(self) -> str:
        return str(self.body["status"])


def file_object(row: tuple[Any, ...]) -> dict[str, Any]:
    file_id, created, purpose, filename, size = row
    return {"id": file_id, "object": "file", "bytes": size, "created_at": int(created), "filename": filename,
            "purpose": purpose, "status": "processed", "expires_at": None, "status_details": None}


class BatchStore:
    """The files and the batches, in the shared database."""

    def __init__(self, database: StoreDatabase, *, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES,
                 clock: Callable[[], float] = time.time):
        self.database = database
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.clock = clock
        self._lock, self._db = database.lock, database.db
        with self._lock:
            self._db.executescript(SCHEMA)

    # ------------------------------------------------------------------------------------------ files

    def add_file(self, owner: str | None, purpose: str, filename: str, content: bytes) -> dict[str, Any]:
        if purpose not in FILE_PURPOSES:
            raise field_error("purpose", f"kinetic keeps files for batches only: 'batch', not {purpose!r}")
        if len(content) > MAX_FILE_BYTES:
            raise PayloadTooLargeError(f"a batch file holds at most {MAX_FILE_BYTES // 2**20} MiB")
        file_id = common.random_id("file-", 24)
        now = self.clock()
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)",
                             (file_id, owner, now, purpose, filename, content))
            self._trim_files(owner, keep=file_id)
        return file_object((file_id, now, purpose, filename, len(content)))

    def _trim_files(self, owner: str | None, keep: str) -> None:
        """Within a transaction: the owner's oldest files past the caps, except those a batch still reads."""
        bodies = [json.loads(row[0]) for row in self._db.execute("SELECT record FROM batches WHERE owner IS ?",
                                                                 (owner,))]
        reading = {body["input_file_id"] for body in bodies if body["status"] in RUNNABLE}
        mine = self._db.execute("SELECT id, length(content) FROM files WHERE owner IS ? ORDER BY created, rowid",
                                (owner,)).fetchall()
        total = sum(size for _, size in mine)
        for file_id, size in mine:
            if len(mine) <= self.max_files and total <= self.max_bytes:
                break
            if file_id in reading or file_id == keep:
                continue
            self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
            mine = [row for row in mine if row[0] != file_id]
            total -= size

    def file(self, file_id: str, caller: Caller, *, param: str | None = None) -> dict[str, Any]:
        with self._lock:
            row = self._db.execute("SELECT owner, id, created, purpose, filename, length(content) FROM files "
                                   "WHERE id = ?", (file_id,)).fetchone()
        if row is None or not may_read(caller, row[0]):
            raise NotFoundError(f"No such File object: {file_id}", param=param)
        return file_object(row[1:])

    def content(self, file_id: str, caller: Caller) -> bytes:
        with self._lock:
            row = self._db.execute("SELECT owner, content FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None or not may_read(caller, row[0]):
            raise NotFoundError(f"No such File object: {file_id}")
        return bytes(row[1])

    def files(self, caller: Caller, purpose: str | None = None) -> list[dict[str, Any]]:
        """The caller's files (the admin's: everyone's), oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT owner, id, created, purpose, filename, length(content) FROM files "
                                    "ORDER BY created, rowid").fetchall()
        return [file_object(row[1:]) for row in rows
                if may_read(caller, row[0]) and (purpose is None or row[3] == purpose)]

    def delete_file(self, file_id: str, caller: Caller) -> None:
        self.file(file_id, caller)
        with self._lock:
            self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))

    # ---------------------------------------------------------------------------------------- batches

    def create(self, caller: Caller, *, input_file_id: str, endpoint: str, completion_window: str,
               metadata: dict[str, str] | None) -> dict[str, Any]:
        if endpoint not in ENDPOINTS:
            raise field_error("endpoint", f"must be one of {', '.join(ENDPOINTS)}, not {endpoint!r}")
        if completion_window != "24h":
            raise field_error("completion_window", f"must be '24h', not {completion_window!r}")
        if self.file(input_file_id, caller, param="input_file_id")["purpose"] != "batch":
            raise field_error("input_file_id", f"{input_file_id} was not uploaded with purpose 'batch'")
        now = int(self.clock())
        body = {"id": common.random_id("batch_", 24), "object": "batch", "endpoint": endpoint, "errors": None,
                "input_file_id": input_file_id, "completion_window": completion_window, "status": "validating",
                "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
                "expires_at": now + WINDOW_S, "finalizing_at": None, "completed_at": None, "failed_at": None,
                "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata}
        with self._lock:
            self._db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?)",
                             (body["id"], caller.name, int(caller.role is Role.ADMIN), now, json.dumps(body)))
        return body

    def get(self, batch_id: str, caller: Caller) -> dict[str, Any]:
        batch = self._row(batch_id)
        if batch is None or not may_read(caller, batch.owner):
            raise NotFoundError(f"No batch found with id '{batch_id}'.", param="batch_id")
        return batch.body

    def get_body(self, batch_id: str) -> dict[str, Any] | None:
        """The batch's object as it is now, whoever owns it (the runner's look)."""
        batch = self._row(batch_id)
        return None if batch is None else batch.body

    def _row(self, batch_id: str) -> Batch | None:
        with self._lock:
            row = self._db.execute("SELECT record, owner, admin FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return None if row is None else Batch(json.loads(row[0]), row[1], bool(row[2]))

    def listed(self, caller: Caller) -> list[dict[str, Any]]:
        """The caller's batches (the admin's: everyone's), oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT record, owner FROM batches ORDER BY created, rowid").fetchall()
        return [json.loads(record) for record, owner in rows if may_read(caller, owner)]

    def cancel(self, batch_id: str, caller: Caller) -> dict[str, Any]:
        body = self.get(batch_id, caller)
        if body["status"] in ("validating", "in_progress"):
            return self.update(batch_id, status="cancelling", cancelling_at=int(self.clock()))
        if body["status"] in ("finalizing", "cancelling"):
            return body
        raise InvalidRequestError(f"Cannot cancel a batch with status '{body['status']}'.", param="batch_id")

    def update(self, batch_id: str, **changes: Any) -> dict[str, Any]:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            row = self._db.execute("SELECT record FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"No batch found with id '{batch_id}'.", param="batch_id")
            body = {**json.loads(row[0]), **changes}
            self._db.execute("UPDATE batches SET record = ? WHERE id = ?", (json.dumps(body), batch_id))
        return body

    def runnable(self) -> Batch | None:
        """The oldest batch that has work left (a restart finds those it left), its lines read."""
        with self._lock:
            rows = self._db.execute("SELECT record, owner, admin FROM batches ORDER BY created, rowid").fetchall()
        batches = (Batch(json.loads(record), owner, bool(admin)) for record, owner, admin in rows)
        return next((batch for batch in batches if batch.status in RUNNABLE), None)

    def input_bytes(self, batch: Batch) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT content FROM files WHERE id = ?", (batch.body["input_file_id"],)).fetchone()
        return None if row is None else bytes(row[0])

    def finished_lines(self, batch_id: str) -> set[int]:
        with self._lock:
            return {row[0] for row in self._db.execute("SELECT line FROM batch_results WHERE batch = ?", (batch_id,))}

    def add_result(self, batch_id: str, line: int, ok: bool, result: dict[str, Any]) -> dict[str, Any]:
        """One line's result, and the batch's counts with it, in one transaction."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO batch_results VALUES (?, ?, ?, ?)",
                             (batch_id, line, int(ok), json.dumps(result)))
            body = json.loads(self._db.execute("SELECT record FROM batches WHERE id = ?", (batch_id,)).fetchone()[0])
            completed, failed = self._db.execute(
                "SELECT sum(ok), count(*) - sum(ok) FROM batch_results WHERE batch = ?", (batch_id,)).fetchone()
            body["request_counts"] = {**body["request_counts"], "completed": completed, "failed": failed}
            self._db.execute("UPDATE batches SET record = ? WHERE id = ?", (json.dumps(body), batch_id))
        return body

    def write_results(self, batch: Batch) -> dict[str, Any]:
        """The output file (lines answered 2xx) and the error file (the others), in input order; the batch's
        ids of them. A file for none is not made, as in OpenAI."""
        with self._lock:
            rows = self._db.execute("SELECT ok, result FROM batch_results WHERE batch = ? ORDER BY line",
                                    (batch.id,)).fetchall()
        ids: dict[str, Any] = {"output_file_id": None, "error_file_id": None}
        for key, wanted, suffix in (("output_file_id", 1, "output"), ("error_file_id", 0, "error")):
            chosen = [result for ok, result in rows if ok == wanted]
            if chosen:
                content = "".join(line + "\n" for line in chosen).encode()
                ids[key] = self.add_file(batch.owner, "batch_output", f"{batch.id}_{suffix}.jsonl", content)["id"]
        return ids

    def size(self) -> dict[str, int]:
        """What the store holds: the dashboard's line."""
        with self._lock:
            files, size = self._db.execute("SELECT count(*), coalesce(sum(length(content)), 0) FROM files").fetchone()
            batches = self._db.execute("SELECT count(*) FROM batches").fetchone()[0]
        return {"files": files, "file_bytes": size, "batches": batches}


def read_lines(content: bytes, endpoint: str) -> tuple[list[BatchLine], list[dict[str, Any]]]:
    """A batch input's requests, or OpenAI's `errors` list (code, message, line) for the lines it cannot run."""
    lines: list[BatchLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()

    def error(code: str, message: str, number: int | None, param: str | None = None) -> None:
        errors.append({"code": code, "message": message, "param": param, "line": number})

    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        error("invalid_json_line", "the file is not UTF-8 text", None)
        return [], errors
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            request = json.loads(raw)
        except ValueError:
            error("invalid_json_line", f"line {number} is not a JSON object", number)
            continue
        if not isinstance(request, dict):
            error("invalid_json_line", f"line {number} is not a JSON object", number)
            continue
        custom_id, url, body = request.get("custom_id"), request.get("url"), request.get("body")
        if not isinstance(custom_id, str) or not custom_id:
            error("missing_required_parameter", "each line needs a 'custom_id' string", number, "custom_id")
        elif custom_id in seen:
            error("duplicate_custom_id", f"the custom_id {custom_id!r} is used more than once", number, "custom_id")
        elif request.get("method", "POST") != "POST":
            error("invalid_method", "a batch's requests are POST", number, "method")
        elif url != endpoint:
            error("mismatched_endpoint", f"the line's url {url!r} is not the batch's endpoint {endpoint}", number,
                  "url")
        elif not isinstance(body, dict):
            error("missing_required_parameter", "each line needs a 'body' object", number, "body")
        elif body.get("stream"):
            error("invalid_request", "a batch's requests are not streamed", number, "body.stream")
        else:
            seen.add(custom_id)
            lines.append(BatchLine(number, custom_id, body))
    if not lines and not errors:
        error("empty_file", "the input file holds no request", None)
    if len(lines) > MAX_LINES:
        error("too_many_requests", f"a batch holds at most {MAX_LINES} requests, this one {len(lines)}", None)
    return lines, errors
