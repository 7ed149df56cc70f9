"""CORS headers go out spelled as llama-server spells them: header names are case-insensitive, but
llama.cpp's own tests (and scripts like them) read them into a plain dict."""

from __future__ import annotations

import socket

import pytest

from tests.server import KineticServer

pytestmark = pytest.mark.e2e


def raw_head(url: str, request: bytes) -> list[bytes]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]


def test_cors_header_names_keep_llama_servers_spelling(live_server: KineticServer) -> None:
    preflight = raw_head(live_server.url, b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Origin: http://web.example\r\nAccess-Control-Request-Method: POST\r\n"
                         b"Access-Control-Request-Headers: Authorization\r\nConnection: close\r\n\r\n")
    names = {line.split(b":", 1)[0] for line in preflight}
    assert {b"Access-Control-Allow-Origin", b"Access-Control-Allow-Methods", b"Access-Control-Allow-Headers",
            b"Access-Control-Allow-Credentials"} <= names, preflight
    answer = raw_head(live_server.url, b"GET /health HTTP/1.1\r\nHost: x\r\nOrigin: http://web.example\r\n"
                      b"Connection: close\r\n\r\n")
    assert b"Access-Control-Allow-Origin: http://web.example" in answer, answer
