"""HTTP/1.1 transport limits: what a class of students (or one careless script) cannot do to the server.

uvicorn's httptools protocol (llhttp, in C), extended (`LimitedHttpProtocol`) because uvicorn alone lacks
some limits and answers others in plain text:

- at most `max_connections` connections are served at once; a request on one more gets a 503
  with a JSON error body (uvicorn's own `limit_concurrency` answers "Service Unavailable" as text);
- a client must send its whole request head within `header_timeout` seconds of connecting (or
  of its first byte on a kept-alive connection): uvicorn has no such timer, so one stalled
  client held a connection slot forever;
- a request head larger than `max_header_bytes` gets a 431 (uvicorn has no limit);
- a body larger than `max_body_bytes` gets a 413, whether it declares a Content-Length or comes
  chunked; the body is counted as the app reads it and is never read past the limit;
- an HTTP/2 preface or bytes that are not HTTP get a 400 and the connection is closed.

After a refusal the connection closes gracefully: kinetic stops sending (FIN) and reads and drops
what the client still sends for up to `LINGER_S` seconds before closing. A plain close with
unread bytes pending resets the connection, and a client still uploading a large body would then
see "connection reset" instead of the 413 (the OpenAI SDK reported a bare "Connection error").

The stalled-body deadline (`--body-timeout`) stays in the app's request gate. Every refusal here
uses the app's error renderer, so its body has the same shape as any other error.

Why httptools and not uvicorn's pure-Python h11: a request on a new connection (accept, parse, answer)
cost the event loop 0.52 ms with h11 and 0.37 ms with httptools (uvloop: 0.39 and 0.23 ms; llama-server:
0.15 ms), measured with a bare app here, and the loop parses the requests of a class one after another.

This leans on HttpToolsProtocol's internals (`parser`, `cycle`, `connections`, `flow`,
`_unset_keepalive_if_required`, `on_response_complete`), checked against uvicorn 0.55;
tests/unit/test_transport.py runs the protocol without a model, so a uvicorn upgrade that changes them
fails there first.
"""

from __future__ import annotations

import asyncio
import http
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import httptools
import uvicorn
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from kinetic.errors import (
    HeadersTooLargeError,
    InvalidRequestError,
    KineticError,
    PayloadTooLargeError,
    RequestTimeoutError,
    UnavailableError,
)
from kinetic.scheduling.arrivals import DOOR, DOOR_SCOPE_KEY

log = logging.getLogger(__name__)

# A full context of text, with room to spare: 131072 tokens (the longest context of the usual
# local models: Llama 3.1, Qwen 2.5, Gemma 3) at about 4 bytes of text a token is 512 KiB;
# JSON-escaped non-Latin text (\uXXXX, 6 bytes a character, about one token each) and the chat's
# own structure (roles, tools, earlier turns) stay well under 8 bytes a token, i.e. 1 MiB. Four
# times that leaves room for tool schemas and base64 data while keeping the worst case cheap:
# tokenizing 4 MiB takes about 2 s of one core (measured: 4.5 s for 8 MB), off the event loop.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
HTTP1_VERSIONS = frozenset({"1.0", "1.1"})
LINGER_S = 5.0  # nginx's lingering_timeout; enough for a client on a LAN to finish and read the answer

# app.error_response: (path, error) -> the JSON response in that path's protocol envelope
ErrorResponder = Callable[[str, KineticError], Response]


@dataclass(frozen=True)
class TransportLimits:
    max_connections: int = 64
    header_timeout: float = 30.0
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


class TransportConfig(uvicorn.Config):
    """uvicorn's Config for `LimitedHttpProtocol`: carries the limits and the error renderer."""

    def __init__(self, app: ASGIApp, *, limits: TransportLimits, error_response: ErrorResponder, **kwargs: Any):
        super().__init__(app, http=LimitedHttpProtocol, limit_concurrency=None, **kwargs)
        self.limits = limits
        self.error_response = error_response


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: once the protocol asks to linger, `close()`
    becomes a half close (FIN after the answer) and input is drained until the client closes or
    LINGER_S passes. Everything else goes to the real transport.

    A response's head is held until the end of the event loop's turn, and goes out with the body written after it
    in that turn (a JSON answer, a stream's first frame): uvicorn writes the two apart, and with TCP_NODELAY that was
    two packets and two wake-ups of the client on the way to its first token."""

    def __init__(self, transport: asyncio.Transport, protocol: LimitedHttpProtocol):
        self._transport = transport
        self._protocol = protocol
        self._head: bytes | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        if self._head is not None:
            data, self._head = self._head + data, None
        elif data.startswith(b"HTTP/1.1 "):  # uvicorn's status line, which always names 1.1
            self._head = data
            self._protocol.loop.call_soon(self._flush)
            return
        self._transport.write(data)

    def _flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        protocol = self._protocol
        if not protocol.linger_on_close or protocol.lingering or self._transport.is_closing() \
                or not self._transport.can_write_eof():
            self._transport.close()
            return
        protocol.start_lingering(self._transport)

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


def raw_response(response: Response) -> bytes:
    """A whole HTTP/1.1 response in bytes, for answers sent before any request was parsed."""
    status = response.status_code
    phrase = http.HTTPStatus(status).phrase
    body = bytes(response.body)
    head = [f"HTTP/1.1 {status} {phrase}", f"content-type: {response.media_type}",
            f"content-length: {len(body)}", "connection: close", "server: kinetic"]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def no_delay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on a client's connection. asyncio sets it only on sockets made with proto IPPROTO_TCP, and
    uvicorn's listening socket has proto 0: without it, the part of an answer written after its headers (a whole
    JSON body, a stream's next chunk) waited for the client's delayed ACK, about 40 ms on Linux (measured: a
    one-token chat took 68 ms end to end, 26 ms of it in the server). llama-server sets it on every connection."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the client already went
            pass


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above (one instance per connection)."""

    def __init__(self, config: uvicorn.Config, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        assert isinstance(config, TransportConfig), "LimitedHttpProtocol needs a TransportConfig"
        self.limits = config.limits
        self.error_response = config.error_response
        self._inner_app = self.app
        self.app = self._limited_app
        self._header_timer: asyncio.TimerHandle | None = None
        # A request head is awaited from the connection's start, and again once an answer is complete; the
        # bytes received towards it are counted, as llhttp keeps no limit of its own.
        self.awaiting_head = True
        self._head_bytes = 0
        self.linger_on_close = False  # set by a refusal: the client may still be sending
        self.lingering = False
        self._linger_timer: asyncio.TimerHandle | None = None
        self._leave_door: Callable[[], None] = lambda: None  # the request being answered, counted at the door

    # ------------------------------------------------------------ the request head

    # uvicorn types the argument as BaseTransport but is always handed a Transport, and the wrapper
    # stands in for one (it forwards what it does not change)
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # see above
        no_delay(transport)
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]  # see above
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # after a refusal: read and dropped
        self._unset_keepalive_if_required()
        if self.awaiting_head:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # as uvicorn's own protocol answers one
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError as exc:
            self._refuse(InvalidRequestError(self._parse_failure(exc)))
            return
        if self.transport.is_closing():
            return
        if not self.awaiting_head:
            self._cancel_header_timer()
        elif self._head_bytes > self.limits.max_header_bytes:  # a head still incomplete, already too large
            self._refuse(_headers_too_large(self.limits.max_header_bytes))
        else:
            # Still waiting for (the rest of) a request head: the deadline runs from the connection's
            # start or from the first byte of this request, and more bytes never extend it.
            self._arm_header_timer()

    def _parse_failure(self, exc: httptools.HttpParserError) -> str:
        version = self.parser.get_http_version()
        if version not in HTTP1_VERSIONS and self.parser.get_method() == b"PRI":  # an HTTP/2 preface
            return _unsupported_version(version)
        reason = str(exc).split(":", 1)[0].strip().rstrip(".")  # llhttp's reason, without the bytes it may quote
        return f"Invalid HTTP request{': ' + reason if reason else ''} (this server speaks HTTP/1.1)"

    def on_headers_complete(self) -> None:
        self.awaiting_head = False
        self._head_bytes = 0
        if self.parser.get_method() == b"POST" and (self.cycle is None or self.cycle.response_complete):
            # Counted at the door now (arrivals.py): requests sent together are read in one turn of the loop, then
            # each spends a while in the app before it is queued, and an idle scheduler that counted only those
            # that had reached the app could start the first one's prompt alone.
            self._leave_door = cast(dict[str, Any], self.scope)[DOOR_SCOPE_KEY] = DOOR.arrive()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave_door()
        self._cancel_header_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def start_lingering(self, transport: asyncio.Transport) -> None:
        """Half-closes after the answer, then drops input until the client closes or time runs out."""
        self.lingering = True
        self._cancel_header_timer()
        transport.write_eof()
        transport.resume_reading()  # uvicorn may have paused reading while the app held the body
        self._linger_timer = self.loop.call_later(LINGER_S, transport.close)

    def on_response_complete(self) -> None:
        self._leave_door()  # answered: out at the latest now, whatever became of it in the app
        # Between requests uvicorn's keep-alive timer applies; ours starts with the next byte.
        self._cancel_header_timer()
        if not self.pipeline:  # a pipelined request's head is already in
            self.awaiting_head = True
        super().on_response_complete()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.limits.header_timeout, self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self.awaiting_head:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered (pipelining): not a stalled head
        self._refuse(RequestTimeoutError(
            f"request headers not received within {self.limits.header_timeout:g} s"))

    def _refuse(self, err: KineticError) -> None:
        """Answers before (or instead of) a request the app would see, then closes."""
        self._cancel_header_timer()
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(raw_response(self.error_response("/", err)))
            self.linger_on_close = True
        self.transport.close()

    # ---------------------------------------------------------- the request itself

    async def _limited_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._inner_app(scope, receive, send)
            return
        limits = self.limits
        if scope["http_version"] not in HTTP1_VERSIONS:  # e.g. an HTTP/2 preface: "PRI * HTTP/2.0"
            await self._answer(scope, receive, send, InvalidRequestError(_unsupported_version(scope["http_version"])))
            return
        if _head_size(scope) > limits.max_header_bytes:  # completed by the read that took it past the limit
            await self._answer(scope, receive, send, _headers_too_large(limits.max_header_bytes))
            return
        if len(self.connections) > limits.max_connections:
            log.warning("more than %d connections: answering 503", limits.max_connections)
            await self._answer(scope, receive, send, UnavailableError(
                f"server busy: more than {limits.max_connections} connections at once, try again later"))
            return
        declared = _content_length(scope)
        if declared is not None and declared > limits.max_body_bytes:
            await self._answer(scope, receive, send, _too_large(limits.max_body_bytes))
            return
        await self._with_body_limit(scope, receive, send)

    async def _with_body_limit(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Counts the body as the app reads it; past the limit the app is told the client left,
        its answer is dropped, and a 413 goes out instead. Nothing past the limit is read."""
        limit = self.limits.max_body_bytes
        received = 0
        too_large = False
        started = False

        async def counting_receive() -> Message:
            nonlocal received, too_large
            if too_large:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    too_large = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if too_large and not started:
                return  # the app's answer to a "disconnect": ours replaces it below
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self._inner_app(scope, counting_receive, guarded_send)
        except Exception:
            if not too_large:
                raise
        if too_large and not started:
            await self._answer(scope, receive, send, _too_large(limit))

    async def _answer(self, scope: Scope, receive: Receive, send: Send, err: KineticError) -> None:
        response = self.error_response(scope["path"], err)
        response.headers["connection"] = "close"
        self.linger_on_close = True
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # llhttp has already refused a malformed one
    return None


def _head_size(scope: Scope) -> int:
    """Bytes of the request line and headers, as the client sent them (give or take whitespace)."""
    line = len(scope["method"]) + len(scope.get("raw_path") or b"") + len(scope["query_string"]) + 12
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"])


def _unsupported_version(version: str) -> str:
    """llhttp refuses an HTTP/2 preface while parsing and hands other versions (2.0, 0.9) to the app: one answer."""
    return f"HTTP/{version} is not supported: this server speaks HTTP/1.1"


def _headers_too_large(limit: int) -> HeadersTooLargeError:
    return HeadersTooLargeError(f"request headers larger than {limit} bytes (the server's --max-header-size)")


def _too_large(limit: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"request body larger than {limit} bytes (the server's --max-body-size)")
