"""The request ledger: `kinetic serve --ledger FILE` appends one JSON line per finished request.

Each line is one `LedgerRecord`: who asked (the key's name, never the key), on which route, with which
status, and what the client was told: the response id, the prompt, cached and completion tokens, the
`timings` object, the finish reason in its protocol's words, the id and name of each tool call the
server made (a client sends the id back as `tool_call_id`), and for a stream the number of chunks with
answer text and when the first one left. Rejected attempts (401) and other routes are lines too, with
their method, status and error. Prompt and answer text are written only with `--ledger-content`.

The numbers come from the code that told them to the client: each protocol's encoder fills an
`Outcome` (kinetic.classroom.outcome) as it writes the frames or the body, and the route's
request hands it over in the ASGI scope's state; the recorder never reads the response's bytes, so a
new protocol is recorded whole or a test fails (tests/unit/test_ledger_catalog.py). The middleware hands
each record to its sinks: the file writer (with `--ledger`), the dashboard's in-memory totals (always,
see stats.py). One writer per file: lines are written whole, under a lock, and flushed one by one, so
the file can be read (and graded, and read back at start for budgets) while the server runs. The
server's web pages and the dashboard's polling are not recorded.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, ValidationError

from kinetic.classroom.caller import Caller

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


class LedgerWriter:
    """Appends records to one file: one line each, written whole under a lock and flushed."""

    def __init__(self, path: str | Path, *, content: bool = False):
        self.path = Path(path)
        self.content = content
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8")

    def __call__(self, record: LedgerRecord) -> None:  # a LedgerMiddleware sink
        self.write(record)

    def write(self, record: LedgerRecord) -> None:
        line = record.to_line()
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_ledger(path: str | Path) -> list[LedgerRecord]:
    """Every complete line of a ledger; a line still being written (no newline yet) is left out."""
    records = []
    with Path(path).open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.endswith("\n"):
                break
            record = LedgerRecord.from_line(line)
            if record is not None:
                records.append(record)
    return records


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


def _error_record(error: ErrorTold | None) -> ErrorRecord | None:
    return None if error is None else ErrorRecord(type=error.type, message=error.message)


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
    """Builds one record per HTTP request (CORS preflights and the web pages excepted) once its
    answer is sent, and hands it to each sink: a LedgerWriter, the dashboard's ClassStats.

    The request gate inside puts the Caller in `scope["state"]["caller"]`, and the route its outcomes
    (kinetic.classroom.outcome); this reads both after the answer, so the state dict is created
    here, before the gate runs. `content` keeps the prompt and answer text in the record
    (`--ledger-content`); it defaults to the writer's setting.
    """

    def __init__(self, app: ASGIApp, *, keyed: bool, writer: LedgerWriter | None = None,
                 sinks: Sequence[Sink] = (), content: bool | None = None):
        self.app = app
        self.sinks: list[Sink] = [*([writer] if writer is not None else []), *sinks]
        self.content = (writer.content if writer is not None else False) if content is None else content
        self.keyed = keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or not recorded(scope["path"]):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        started = time.monotonic()
        status, stream = 500, False
        ended: float | None = None  # when the last byte left: what the client's clock can compare with
        request_body = bytearray()
        written = False

        def write_once() -> None:
            nonlocal written
            if not written:
                written = True
                self._write(scope, state, status, stream, started, (ended or time.monotonic()) - started,
                            request_body)

        async def receive_and_keep() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(request_body) < MAX_KEPT_BODY:
                request_body.extend(message.get("body", b""))
            return message

        async def send_and_note(message: Message) -> None:
            nonlocal status, stream, ended
            if message["type"] == "http.response.start":
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
            write_once()  # a response that never ended (an error before its start, a disconnect)

    def _write(self, scope: Scope, state: dict[str, Any], status: int, stream: bool, started: float,
               duration: float, request_body: bytearray) -> None:
        headers = _headers(scope)
        caller = state.get("caller")
        client = caller.name if isinstance(caller, Caller) else None
        outcomes: list[Outcome] = state.get("outcomes", [])
        error = state.get("error") or next((o.error for o in outcomes if o.error is not None), None)
        fields: dict[str, Any] = {
            "time": _now_iso(), "duration_s": round(duration, 4), "client": client,
            "auth": auth_outcome(status, headers, keyed=self.keyed, client=client),
            "addr": (scope.get("client") or ("", 0))[0], "method": scope["method"], "route": scope["path"],
            "status": status, "stream": stream, "error": _error_record(error),
            **told_fields(outcomes, started, content=self.content),
        }
        if "media" in state:  # the images and audio its prompt read (kinetic.classroom.identity.note_media)
            fields["media"] = MediaRecord(**state["media"])
        if self.content and request_body:
            try:
                fields["request"] = json.loads(bytes(request_body))
            except ValueError:
                fields["request"] = bytes(request_body).decode("utf-8", "replace")
        record = LedgerRecord(**fields)
        for sink in self.sinks:
            try:
                sink(record)
            except (OSError, ValueError):  # a full disk must not take the answer down with it
                pass
            except Exception:  # nor a bug in a sink: the answer has been sent already
                log.exception("request record sink %r failed", sink)
