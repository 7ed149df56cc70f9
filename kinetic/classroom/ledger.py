"""The request ledger: `kinetic serve --ledger FILE` appends one JSON line per finished request.

Each line says who asked (the key's name, never the key), on which route, with which status, and
what the client received: the response id, usage, the `timings` object, the finish reason, the
id and name of each tool call the server made (a client sends the id back as `tool_call_id`), and
for a stream the number of content chunks and when the first one left. Rejected attempts (401)
are lines too. Prompt and answer text are written only with `--ledger-content`.

The numbers are read from the response as it goes out (JSON body or SSE/NDJSON frames), not from
inside the engine: the ledger then holds exactly what the client saw, and the recorder needs no
hook in any protocol. The middleware hands each record to its sinks: the file writer (with
`--ledger`) and the dashboard's in-memory totals (always, see stats.py). One writer per file:
lines are written whole, under a lock, and flushed one by one, so the file can be read (and
graded) while the server runs. The server's web pages and the dashboard's polling are not recorded.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Routes whose answers carry usage/timings; other routes get method, status and error only.
GENERATION_ROUTES = frozenset({
    "/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/completion",
    "/v1/messages", "/api/chat", "/api/generate", "/infill",
})
MAX_PARSED_BODY = 4 * 1024 * 1024  # a JSON answer larger than this is recorded without its numbers
PARSE_BACKLOG = 256 * 1024  # stream bytes kept before they are read (ResponseReader)
log = logging.getLogger(__name__)
STREAM_TYPES = ("text/event-stream", "application/x-ndjson")
# The server's own web pages and the dashboard's polling are not requests a student made: recording
# them would bury the class's requests (the dashboard polls every two seconds).
UNRECORDED_PATHS = frozenset({"/", "/dashboard", "/dashboard/stats", "/favicon.ico"})
UNRECORDED_PREFIXES = ("/ui/", "/chats")  # /chats: the chat page saving its conversations (web/chats.py)

Sink = Callable[[dict[str, Any]], None]


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

    def __call__(self, record: dict[str, Any]) -> None:  # a LedgerMiddleware sink
        self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a ledger; a line still being written (no newline yet) is left out."""
    records = []
    with Path(path).open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.endswith("\n"):
                break
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


# ---------------------------------------------------------------------------------------------
# What a response says, read from its JSON (pure functions: unit-tested without a server).

def _first_choice(obj: dict[str, Any]) -> dict[str, Any]:
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def content_of(obj: dict[str, Any]) -> str:
    """The generated text one JSON object (a body or a stream frame) carries, in any protocol."""
    choice = _first_choice(obj)
    if choice:
        delta = choice.get("delta") or choice.get("message") or {}
        text = delta.get("content") if isinstance(delta, dict) else None
        if text is None:
            text = choice.get("text")
        return text if isinstance(text, str) else ""
    if obj.get("type") == "content_block_delta":  # Anthropic stream
        delta = obj.get("delta") or {}
        return delta.get("text", "") if delta.get("type") == "text_delta" else ""
    if obj.get("type") == "message":  # Anthropic body
        return "".join(b.get("text", "") for b in obj.get("content") or [] if isinstance(b, dict))
    message = obj.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):  # Ollama chat
        return message["content"]
    for key in ("content", "response"):  # llama-server /completion, Ollama generate
        if isinstance(obj.get(key), str):
            return obj[key]
    return ""


def tool_calls_of(obj: dict[str, Any]) -> list[dict[str, str]]:
    """The id and name of each OpenAI tool call a body or stream frame starts (a stream's later
    pieces of a call carry no id): what a client must send back as `tool_call_id`."""
    choice = _first_choice(obj)
    message = choice.get("delta") or choice.get("message") or {}
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    found = []
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, dict) and isinstance(call.get("id"), str) and call["id"]:
            function = raw if isinstance(raw := call.get("function"), dict) else {}
            found.append({"id": call["id"], "name": str(function.get("name") or "")})
    return found


def absorb(record: dict[str, Any], obj: Any) -> None:
    """Copies what the client can see of usage, timings, id, model and finish into `record`."""
    if not isinstance(obj, dict):
        return
    message = found if isinstance(found := obj.get("message"), dict) else {}
    for source in (obj, message):
        if isinstance(source.get("id"), str) and "id" not in record:
            record["id"] = source["id"]
        if isinstance(source.get("model"), str) and "model" not in record:
            record["model"] = source["model"]
        usage = source.get("usage")
        if isinstance(usage, dict):
            for ours, names in (("prompt_tokens", ("prompt_tokens", "input_tokens")),
                                ("completion_tokens", ("completion_tokens", "output_tokens"))):
                for name in names:
                    if isinstance(usage.get(name), int):
                        record[ours] = usage[name]
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                record["cached_tokens"] = details["cached_tokens"]
    if isinstance(obj.get("timings"), dict):
        record["timings"] = obj["timings"]
    calls = tool_calls_of(obj)
    if calls:
        record.setdefault("tool_calls", []).extend(calls)
    finish = _first_choice(obj).get("finish_reason")
    delta = found_delta if isinstance(found_delta := obj.get("delta"), dict) else {}
    for candidate in (finish, obj.get("stop_reason"), delta.get("stop_reason"), obj.get("done_reason"),
                      obj.get("stop_type") if obj.get("stop") is True else None):
        if isinstance(candidate, str) and candidate:
            record["finish_reason"] = candidate
            break
    error = obj.get("error")
    if isinstance(error, dict):
        record["error"] = {"type": error.get("type"), "message": error.get("message")}
    elif isinstance(error, str):
        record["error"] = {"type": None, "message": error}


@dataclass
class ResponseReader:
    """Follows one response's bytes: one JSON body, or SSE `data:` / NDJSON frames.

    A stream's chunks are only kept (with the time each left) while they flow, and read in
    batches: after PARSE_BACKLOG bytes, and at the end. Parsing each frame as it passed cost the
    event loop about a third of its work per streamed token, time taken from llama.cpp's threads."""

    record: dict[str, Any]
    stream: bool
    keep_text: bool
    started: float
    _buffer: bytearray = field(default_factory=bytearray)
    _text: list[str] = field(default_factory=list)
    _overflow: bool = False
    _sent: list[tuple[bytes, float]] = field(default_factory=list)  # stream chunks not read yet, with when they left
    _sent_bytes: int = 0

    def feed(self, chunk: bytes) -> None:
        if self.stream:
            self._sent.append((chunk, time.monotonic()))
            self._sent_bytes += len(chunk)
            if self._sent_bytes > PARSE_BACKLOG:
                self._read_sent()
        elif not self._overflow:
            self._buffer += chunk
            if len(self._buffer) > MAX_PARSED_BODY:
                self._overflow = True
                self._buffer.clear()

    def _read_sent(self) -> None:
        for chunk, when in self._sent:
            self._buffer += chunk
            *lines, rest = self._buffer.split(b"\n")
            self._buffer = bytearray(rest)
            for line in lines:
                self._frame(line.strip(), when)
        self._sent.clear()
        self._sent_bytes = 0

    def _frame(self, line: bytes | bytearray, when: float) -> None:
        if line.startswith(b"data:"):
            line = line[5:].strip()
        elif not line.startswith(b"{"):  # SSE `event:` lines, comments, blank separators
            return
        if not line or line == b"[DONE]":
            return
        try:
            obj = json.loads(line)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        absorb(self.record, obj)
        text = content_of(obj)
        if text:
            self.record["chunks"] = self.record.get("chunks", 0) + 1
            self.record.setdefault("ttft_s", round(when - self.started, 4))
            if self.keep_text:
                self._text.append(text)

    def finish(self) -> None:
        if self.stream:
            self._read_sent()
            if self._buffer.strip():
                self._frame(bytes(self._buffer).strip(), time.monotonic())
        elif self._buffer and not self._overflow:
            try:
                obj = json.loads(bytes(self._buffer))
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                absorb(self.record, obj)
                if self.keep_text:
                    self._text.append(content_of(obj))
        if self.keep_text:
            self.record["answer"] = "".join(self._text)


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

    The request gate inside puts the caller's name in `scope["state"]["client_name"]`; this reads it
    after the answer, so the state dict is created here, before the gate runs. `content` keeps the
    prompt and answer text in the record (`--ledger-content`); it defaults to the writer's setting.
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
        path = scope["path"]
        record: dict[str, Any] = {}
        reader: ResponseReader | None = None
        status = 500
        ended: float | None = None  # when the last byte left: what the client's clock can compare with
        request_body = bytearray()
        written = False

        def write_once() -> None:
            nonlocal written
            if not written:
                written = True
                if reader is not None:
                    reader.finish()
                self._write(scope, state, status, (ended or time.monotonic()) - started, record, request_body)

        async def receive_and_keep() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(request_body) < MAX_PARSED_BODY:
                request_body.extend(message.get("body", b""))
            return message

        async def send_and_read(message: Message) -> None:
            nonlocal reader, status, ended
            if message["type"] == "http.response.start":
                status = message["status"]
                content_type = dict((k.decode("latin-1").lower(), v.decode("latin-1"))
                                    for k, v in message.get("headers", [])).get("content-type", "")
                stream = content_type.startswith(STREAM_TYPES)
                if stream or path in GENERATION_ROUTES or status >= 400:
                    reader = ResponseReader(record, stream, self.content, started)
                record["stream"] = stream
            elif message["type"] == "http.response.body":
                if reader is not None:
                    reader.feed(message.get("body", b""))
                if not message.get("more_body", False):
                    ended = time.monotonic()
                    # recorded before the end goes out: whoever has read the whole answer (a grader right
                    # after a student's script, a test) finds its record
                    write_once()
            await send(message)

        try:
            await self.app(scope, receive_and_keep if self.content else receive, send_and_read)
        finally:
            write_once()  # a response that never ended (an error before its start, a disconnect)

    def _write(self, scope: Scope, state: dict[str, Any], status: int, duration: float,
               record: dict[str, Any], request_body: bytearray) -> None:
        headers = _headers(scope)
        client = state.get("client_name")
        line: dict[str, Any] = {
            "time": _now_iso(),
            "duration_s": round(duration, 4),
            "client": client,
            "auth": auth_outcome(status, headers, keyed=self.keyed, client=client),
            "addr": (scope.get("client") or ("", 0))[0],
            "method": scope["method"],
            "route": scope["path"],
            "status": status,
            **record,
        }
        if "media" in state:  # the images and audio its prompt read (kinetic.classroom.identity.note_media)
            line["media"] = dict(state["media"])
        if self.content and request_body:
            try:
                line["request"] = json.loads(bytes(request_body))
            except ValueError:
                line["request"] = bytes(request_body).decode("utf-8", "replace")
        for sink in self.sinks:
            try:
                sink(line)
            except (OSError, ValueError):  # a full disk must not take the answer down with it
                pass
            except Exception:  # nor a bug in a sink: the answer has been sent already
                log.exception("request record sink %r failed", sink)
