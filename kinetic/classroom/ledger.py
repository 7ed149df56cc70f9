"""The request ledger: `kinetic serve --ledger FILE` appends one JSON line per finished request.

Each line is one `LedgerRecord`: who asked (the key's name, never the key), on which route, with which
status, and what the client was told: the response id, the prompt, cached and completion tokens, the
`timings` object, the finish reason in its protocol's words, the id and name of each tool call the
server made (a client sends the id back as `tool_call_id`), and for a stream the number of chunks with
answer text and when the first one left. Rejected attempts (401) and other routes are lines too, with
their method, status and error. Prompt and answer text are written only with `--ledger-content`.

The numbers come from the code that told them to the client: each protocol's encoder fills an
`Outcome` (kinetic.classroom.outcome) as it writes the frames or the body, and the route hands it to
the request's one typed `RequestRecord` (kinetic.classroom.request_record), which this middleware opens
at the door; the recorder never reads the response's bytes, so a new protocol is recorded whole or a
test fails (tests/unit/test_ledger_catalog.py). The middleware hands each line to its sinks: the file
writer (with `--ledger`), the dashboard's in-memory totals (always, see stats.py). One writer per file:
lines are written whole, under a lock, and flushed one by one, so the file can be read (and graded, and
read back at start for budgets) while the server runs. The server's web pages and the dashboard's polling
are not recorded.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from kinetic.classroom.request_record import RequestRecord, open_record
from kinetic.scheduling.arrivals import arrived

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from kinetic.classroom.outcome import ErrorTold, Outcome

MAX_KEPT_BODY = 4 * 1024 * 1024  # with --ledger-content, a request body larger than this is not kept
log = logging.getLogger(__name__)
STREAM_TYPES = ("text/event-stream", "application/x-ndjson")
# The server's own web pages and the dashboard's polling are not requests a student made: recording
# them would bury the class's requests (the dashboard polls every two seconds).
UNRECORDED_PATHS = frozenset({"/", "/dashboard", "/dashboard/stats", "/favicon.ico", "/v1/me"})
UNRECORDED_PREFIXES = ("/ui/", "/chats")  # /chats: the chat page saving its conversations (web/chats.py)


class ToolCallRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    name: str


class ErrorRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    type: str | None = None
    message: str | None = None


class BatchRecord(BaseModel):
    """The batch a request ran for (POST /v1/batches), and its line's custom_id."""

    model_config = ConfigDict(frozen=True)

    id: str
    custom_id: str


class MediaRecord(BaseModel):
    """The images and audio a request's prompts read, and the prompt tokens they took."""

    model_config = ConfigDict(frozen=True)

    images: int = 0
    audio: int = 0
    tokens: int = 0


class LedgerRecord(BaseModel):
    """One ledger line. A field the answer did not tell (no usage on a 401, no chunks in a whole
    answer) is None and left out of the line; lines written before a field existed still read."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    time: str = ""
    duration_s: float = 0.0
    client: str | None = None
    auth: str = "open"  # open (no keys), ok (a known key), missing or wrong (see auth_outcome)
    addr: str = ""
    method: str = ""
    route: str = ""
    status: int = 0
    stream: bool = False
    id: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None  # cached ones included (OpenAI's prompt_tokens)
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    media: MediaRecord | None = None
    timings: dict[str, int | float] | None = None
    finish_reason: str | None = None
    tool_calls: list[ToolCallRecord] | None = None
    chunks: int | None = None
    ttft_s: float | None = None
    error: ErrorRecord | None = None
    answer: str | None = None
    request: Any = None
    batch: BatchRecord | None = None

    @classmethod
    def from_line(cls, line: str) -> LedgerRecord | None:
        """The record on one line; None for a line that is no record (cut short, or not JSON)."""
        try:
            return cls.model_validate_json(line)
        except ValidationError:
            return None

    def to_line(self) -> str:
        # `client` stays in every line (null for a call without a valid key), as it always has
        shown = {k: v for k, v in self.model_dump(mode="json").items() if v is not None or k == "client"}
        return json.dumps(shown, ensure_ascii=False, separators=(",", ":")) + "\n"

    def timing(self, key: str) -> float | None:
        """One of the `timings` numbers."""
        value = None if self.timings is None else self.timings.get(key)
        return None if value is None else float(value)


Sink = Callable[[LedgerRecord], None]


def recorded(path: str) -> bool:
    return path not in UNRECORDED_PATHS and not path.startswith(UNRECORDED_PREFIXES)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


PROBE_BYTES = 4096  # what a probe write takes: a line, as a full disk would have to hold it
MAX_LINE_BYTES = 16 * 1024 * 1024  # a longer "line" read back is skipped, so a start's memory stays bounded
TORN_SUFFIX = ".torn"


def _kind_of(mode: int) -> str | None:
    """What a path that is not a regular file is, in words (None for a regular file)."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return None if stat.S_ISREG(mode) else next((word for test, word in kinds if test(mode)), "not a regular file")


def ledger_path_problem(path: str | Path) -> str | None:
    """Why `path` cannot be a ledger (one line), or None: it must be a regular file or not exist yet.
    A device (/dev/full, /dev/zero) or a FIFO would be read back without end at start."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot use {path} as the ledger: {exc.strerror}"
    kind = _kind_of(mode)
    return None if kind is None else f"cannot use {path} as the ledger: it is {kind}, not a regular file"


def set_aside_torn_tail(path: str | Path) -> int:
    """A last line without its newline (the server died while appending it) is moved to `<path>.torn`
    and cut from the ledger, so every line left parses and the next record starts a line of its own.
    Returns the bytes set aside (0 for a whole file). Reads backwards in blocks: memory stays bounded."""
    path = Path(path)
    try:
        handle = path.open("r+b")
    except FileNotFoundError:
        return 0
    with handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        end = size  # look for the last newline, one block at a time
        cut = 0
        while end > 0:
            start = max(0, end - 65536)
            handle.seek(start)
            block = handle.read(end - start)
            if (at := block.rfind(b"\n")) >= 0:
                cut = start + at + 1
                break
            end = start
        handle.seek(cut)
        with Path(str(path) + TORN_SUFFIX).open("ab") as torn:
            while chunk := handle.read(1024 * 1024):
                torn.write(chunk)
            torn.flush()
            os.fsync(torn.fileno())
        handle.truncate(cut)
        handle.flush()
        os.fsync(handle.fileno())
    log.warning("the ledger %s ended in a torn line (%d bytes, written when the server stopped mid-append): "
                "moved to %s%s", path, size - cut, path, TORN_SUFFIX)
    return size - cut


def ledger_lines(path: str | Path, max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The complete lines of a ledger, one at a time (a line still being written, with no newline yet,
    is left out; a line over `max_line` bytes is skipped, so reading stays bounded in memory)."""
    with Path(path).open("rb") as handle:
        while line := handle.readline(max_line):
            if not line.endswith(b"\n"):
                if len(line) < max_line:
                    return  # the end of the file, mid-line
                while (rest := handle.readline(max_line)) and not rest.endswith(b"\n"):
                    pass  # the rest of an over-long line
                continue
            yield line.decode("utf-8", errors="replace")


class LedgerWriter:
    """Appends records to one file: one line each, written whole with one write() under a lock, with no
    buffer in between, so a line is in the file (the OS's) before the answer's last byte leaves.

    Before a request that generates, the request gate asks `writable()`: a probe write, cut back at
    once; while it fails the request is refused (kinetic.errors.RecordUnwritableError), and the first
    probe that succeeds serves again. A write that fails all the same (ENOSPC, EIO, a read-only file)
    is undone (the file is cut back to where the line began, so no torn line stays in the middle) and
    leaves `problem` set for /health and the dashboard. Nothing is ever kept to be written later."""

    def __init__(self, path: str | Path, *, content: bool = False, best_effort: bool = False):
        self.path = Path(path)
        self.content = content
        self.best_effort = best_effort  # --ledger-best-effort: serve anyway (the gate asks this)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self.problem: str | None = None  # why the last write or probe failed; None while lines are written

    def __call__(self, record: LedgerRecord) -> None:  # a LedgerMiddleware sink
        self.write(record)

    def write(self, record: LedgerRecord) -> None:
        """Appends the record's line; raises OSError (after marking the ledger unwritable) when it cannot."""
        self._append(record.to_line().encode("utf-8"), keep=True)

    def writable(self) -> bool:
        """Whether a line can be written now, by a probe write of a line's size that is cut back at once
        (a few microseconds: asked before each request that generates, so a disk that filled since the
        last line refuses the request before its answer, and a disk with room again serves it)."""
        try:
            self._append(b" " * PROBE_BYTES, keep=False)
        except OSError:
            return False
        return True

    def _append(self, data: bytes, *, keep: bool) -> None:
        with self._lock:
            start = os.fstat(self._fd).st_size
            try:
                written = 0
                while written < len(data):
                    n = os.write(self._fd, data[written:])
                    if n == 0:
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    written += n
            except OSError as exc:
                self._cut_back(start)
                self._failed(exc)
                raise
            if not keep:
                self._cut_back(start)
            if self.problem is not None:
                self.problem = None
                log.warning("the ledger %s is written again", self.path)

    def _cut_back(self, size: int) -> None:
        try:
            os.ftruncate(self._fd, size)
        except OSError as exc:  # a device cannot be cut; a file whose disk fails may not be either
            log.warning("cannot cut the ledger %s back to %d bytes: %s", self.path, size, exc.strerror)

    def _failed(self, exc: OSError) -> None:
        problem = f"cannot write the class record (the ledger {self.path}): {exc.strerror or exc}"
        if self.problem is None:
            then = ("requests are served unrecorded (--ledger-best-effort)" if self.best_effort
                    else "requests are refused until it can be written")
            log.error("%s; %s", problem, then)
        self.problem = problem

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)


def read_ledger(path: str | Path) -> list[LedgerRecord]:
    """Every complete line of a ledger; a line still being written (no newline yet) is left out."""
    return [record for line in ledger_lines(path) if (record := LedgerRecord.from_line(line)) is not None]


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def told_fields(outcomes: Sequence[Outcome], started: float, *, content: bool) -> dict[str, Any]:
    """What a request's outcomes told its client, as record fields (a list of prompts adds up)."""
    if not outcomes:
        return {}
    first = outcomes[0]
    prompt, completion = _sum(o.prompt_tokens for o in outcomes), _sum(o.completion_tokens for o in outcomes)
    firsts = [o.first_chunk_at for o in outcomes if o.first_chunk_at is not None]
    fields: dict[str, Any] = {
        "id": first.id, "model": first.model, "prompt_tokens": prompt, "completion_tokens": completion,
        "cached_tokens": _sum(o.cached_tokens for o in outcomes),
        "total_tokens": None if prompt is None and completion is None else (prompt or 0) + (completion or 0),
        "timings": first.timings, "finish_reason": first.finish_reason,
        "tool_calls": [ToolCallRecord(id=c.id, name=c.name) for o in outcomes for c in o.tool_calls] or None,
        "chunks": _sum(o.chunks or None for o in outcomes),
        "ttft_s": round(min(firsts) - started, 4) if firsts else None,
    }
    if content:
        fields["answer"] = "".join(t for o in outcomes for t in o.text)
    return fields


def run_record(outcome: Outcome, *, client: str | None, keyed: bool, route: str, started: float, duration: float,
               content: bool, error: ErrorTold | None = None) -> LedgerRecord:
    """The line of a generation that ran after its request was answered (a background response): the counts
    its client reads back, under the key that asked."""
    return LedgerRecord(time=_now_iso(), duration_s=round(duration, 4), client=client,
                        auth=("ok" if client else "open") if keyed else "open", method="POST", route=route,
                        status=200, stream=False, error=_error_record(error or outcome.error),
                        **told_fields([outcome], started, content=content))


def _error_record(error: ErrorTold | None) -> ErrorRecord | None:
    return None if error is None else ErrorRecord(type=error.type, message=error.message)


def request_fields(record: RequestRecord, started: float, *, content: bool) -> dict[str, Any]:
    """What a request's record says, as line fields: the error told, the counts its client saw, the batch it ran
    for, the media its prompts read (the HTTP facts, status and route, are the middleware's)."""
    fields: dict[str, Any] = {"error": _error_record(record.error_told),
                              **told_fields(record.outcomes, started, content=content)}
    if record.batch is not None:
        fields["batch"] = BatchRecord(id=record.batch.batch_id, custom_id=record.batch.custom_id)
    if record.media is not None:
        fields["media"] = MediaRecord(images=record.media.images, audio=record.media.audio,
                                      tokens=record.media.tokens)
    return fields


# ---------------------------------------------------------------------------------------------
# The ASGI recorder: outermost, so that it also sees the gate's 401s and 503s.

def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def auth_outcome(status: int, headers: dict[str, str], *, keyed: bool, client: str | None) -> str:
    """open (no keys on the server), ok (a known key), missing or wrong (a rejected or public call)."""
    if not keyed:
        return "open"
    if client is not None:
        return "ok"
    sent = headers.get("authorization", "") or headers.get("x-api-key", "")
    return "missing" if not sent.strip() or sent.strip() == "Bearer" else "wrong"


class LedgerMiddleware:
    """Builds one line (a LedgerRecord) per HTTP request (CORS preflights and the web pages excepted)
    once its answer is sent, and hands it to each sink: a LedgerWriter, the dashboard's ClassStats.

    It opens the request's RequestRecord at the door, before the gate runs, for every HTTP request (the
    routes it does not record read their caller there too); the gate names the caller on it, the route
    adds its outcomes, and this reads it after the answer. `content` keeps the prompt and answer text in
    the line (`--ledger-content`); it defaults to the writer's setting.
    """

    def __init__(self, app: ASGIApp, *, keyed: bool, writer: LedgerWriter | None = None,
                 sinks: Sequence[Sink] = (), content: bool | None = None):
        self.app = app
        self.sinks: list[Sink] = [*([writer] if writer is not None else []), *sinks]
        self.content = (writer.content if writer is not None else False) if content is None else content
        self.keyed = keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = open_record(scope)
        try:
            if scope["method"] == "OPTIONS" or not recorded(scope["path"]):
                await self.app(scope, receive, send)
            else:
                await self._recorded(scope, receive, send, record)
        finally:
            record.end()

    async def _recorded(self, scope: Scope, receive: Receive, send: Send, record: RequestRecord) -> None:
        # a POST may be a generation: counted at the door until it is prepared, answered or over (arrivals.py);
        # once prepared, out at the loop's next turn: the route queues it before it lets the loop go
        leave_door = arrived(scope) if scope["method"] == "POST" else (lambda: None)
        record.when_prepared(partial(asyncio.get_running_loop().call_soon, leave_door))
        started = time.monotonic()
        status, stream = 500, False
        ended: float | None = None  # when the last byte left: what the client's clock can compare with
        request_body = bytearray()
        written = False

        def write_once() -> None:
            nonlocal written
            if not written:
                written = True
                self._write(scope, record, status, stream, started, (ended or time.monotonic()) - started,
                            request_body)

        async def receive_and_keep() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(request_body) < MAX_KEPT_BODY:
                request_body.extend(message.get("body", b""))
            return message

        async def send_and_note(message: Message) -> None:
            nonlocal status, stream, ended
            if message["type"] == "http.response.start":
                leave_door()
                status = message["status"]
                content_type = dict((k.decode("latin-1").lower(), v.decode("latin-1"))
                                    for k, v in message.get("headers", [])).get("content-type", "")
                stream = content_type.startswith(STREAM_TYPES)
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = time.monotonic()
                # recorded before the end goes out: whoever has read the whole answer (a grader right
                # after a student's script, a test) finds its record
                write_once()
            await send(message)

        try:
            await self.app(scope, receive_and_keep if self.content else receive, send_and_note)
        finally:
            leave_door()
            write_once()  # a response that never ended (an error before its start, a disconnect)

    def _write(self, scope: Scope, record: RequestRecord, status: int, stream: bool, started: float,
               duration: float, request_body: bytearray) -> None:
        client = record.caller.name
        fields = request_fields(record, started, content=self.content)
        fields.update({
            "time": _now_iso(), "duration_s": round(duration, 4), "client": client,
            "auth": auth_outcome(status, _headers(scope), keyed=self.keyed, client=client),
            "addr": (scope.get("client") or ("", 0))[0], "method": scope["method"], "route": scope["path"],
            "status": status, "stream": stream,
        })
        if self.content and request_body:
            try:
                fields["request"] = json.loads(bytes(request_body))
            except ValueError:
                fields["request"] = bytes(request_body).decode("utf-8", "replace")
        line = LedgerRecord(**fields)
        for sink in self.sinks:
            try:
                sink(line)
            except (OSError, ValueError):  # the writer has said so and marked the ledger (the gate refuses next)
                pass
            except Exception:  # nor a bug in a sink: the answer has been sent already
                log.exception("request record sink %r failed", sink)
