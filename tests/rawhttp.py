"""Raw HTTP/1.1 over a socket, for tests of what well-behaved clients never send."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server closed the connection after answering

    def json(self) -> Any:
        return json.loads(self.body)


def parse(data: bytes, *, closed: bool) -> RawResponse:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1]) if lines[0].startswith("HTTP/") else 0
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = body[:int(headers["content-length"])]
    return RawResponse(status, headers, body, closed)


def read_response(sock: socket.socket, *, check_close: bool = True) -> RawResponse:
    """One response (Content-Length framed); `closed` says whether the server then closed (looked
    for only with `check_close`: on a kept-alive connection that costs a 2 s wait)."""
    data = b""
    closed = False
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep and (length := _content_length(head)) is not None and len(body) >= length:
            break
    if data and not closed and check_close:  # after a full answer: did the server also close?
        sock.settimeout(2)
        try:
            closed = sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        except TimeoutError:
            closed = False
    return parse(data, closed=closed)


def exchange(address: tuple[str, int], payload: bytes, *, timeout: float = 30,
             check_close: bool = True) -> RawResponse:
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(payload)
        return read_response(sock, check_close=check_close)


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return None
