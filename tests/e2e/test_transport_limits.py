"""Transport limits (kinetic/server/transport.py) on a live server started with small limits through the flags."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import openai
import pytest

from tests.rawhttp import RawResponse, exchange, read_response
from tests.server import KineticServer

MAX_CONNECTIONS = 6
HEADER_TIMEOUT_S = 1.5
MAX_HEADER_BYTES = 8 * 1024
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # no flag: the default is what is tested
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def server(model_lock: None, live_server: KineticServer) -> Iterator[KineticServer]:
    with KineticServer("-c", "1024", "-np", "1", "--max-connections", str(MAX_CONNECTIONS),
                       "--header-timeout", str(HEADER_TIMEOUT_S), "--max-header-size", "8K") as server:
        yield server


def address(server: KineticServer) -> tuple[str, int]:
    parsed = urlparse(server.url)
    return parsed.hostname or "127.0.0.1", parsed.port or 80


def assert_json_error(response: RawResponse, status: int, words: str) -> None:
    assert response.status == status, response
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["code"] == status and words in error["message"], error
    assert response.closed, "the server should close the connection after refusing"


def test_connection_beyond_the_cap_gets_a_json_503(server: KineticServer) -> None:
    held: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS):  # each served once, then kept alive: open, no header timer running
            sock = socket.create_connection(address(server), timeout=30)
            held.append(sock)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock, check_close=False).status == 200
        over = exchange(address(server), b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert_json_error(over, 503, f"more than {MAX_CONNECTIONS} connections")
    finally:
        for sock in held:
            sock.close()
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


def test_partial_headers_then_silence_is_closed_after_the_header_timeout(server: KineticServer) -> None:
    response = exchange(address(server), b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty",
                        timeout=HEADER_TIMEOUT_S + 30)
    assert_json_error(response, 408, "request headers not received")


def test_a_connection_that_never_sends_anything_is_closed_too(server: KineticServer) -> None:
    with socket.create_connection(address(server), timeout=HEADER_TIMEOUT_S + 30) as sock:
        assert_json_error(read_response(sock), 408, "request headers not received")


@pytest.mark.parametrize("complete", [True, False], ids=["whole-head", "head-still-coming"])
def test_oversized_headers_get_431(server: KineticServer, complete: bool) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * MAX_HEADER_BYTES) + b"\r\n"
    response = exchange(address(server), head + (b"\r\n" if complete else b""))
    assert_json_error(response, 431, f"larger than {MAX_HEADER_BYTES} bytes")


def test_declared_body_over_the_limit_gets_413_before_it_is_sent(server: KineticServer) -> None:
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {DEFAULT_MAX_BODY_BYTES + 1}\r\n\r\n").encode()
    assert_json_error(exchange(address(server), head + b"{"), 413, f"larger than {DEFAULT_MAX_BODY_BYTES} bytes")


def test_413_uses_the_routes_own_error_envelope(server: KineticServer) -> None:
    head = b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"
    response = exchange(address(server), head)
    assert response.status == 413 and response.json()["error"]["type"] == "request_too_large"


def test_chunked_body_over_the_limit_gets_413_without_being_read_whole(server: KineticServer) -> None:
    """The client would send 4x the limit; the 413 arrives while most of it is still unsent."""
    chunk = b"x" * 65536
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    planned = 4 * DEFAULT_MAX_BODY_BYTES // len(chunk)
    sent = 0
    with socket.create_connection(address(server), timeout=30) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        try:
            while sent < planned and not select.select([sock], [], [], 0)[0]:
                sock.sendall(frame)
                sent += 1
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us: the answer is already in our receive buffer
        response = read_response(sock)
    assert_json_error(response, 413, f"larger than {DEFAULT_MAX_BODY_BYTES} bytes")
    assert sent < planned


def test_a_large_body_under_the_limit_does_not_hold_up_other_clients(server: KineticServer) -> None:
    """A body just under the limit is seconds of tokenizing; requests sent after it are answered first.
    (Should a too-long prompt ever be refused before it is tokenized, send this body to /tokenize.)"""
    words = "hello world " * ((DEFAULT_MAX_BODY_BYTES - 1024) // 12)
    body = json.dumps({"messages": [{"role": "user", "content": words}], "max_tokens": 1}).encode()
    assert len(body) < DEFAULT_MAX_BODY_BYTES
    order: list[str] = []
    answers: list[RawResponse] = []
    with socket.create_connection(address(server), timeout=120) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:-1])
        time.sleep(1)  # let the server take in the body; the last byte then starts the work at once

        def read_big() -> None:
            answers.append(read_response(sock, check_close=False))
            order.append("big")

        reader = threading.Thread(target=read_big)
        reader.start()
        sock.sendall(body[-1:])
        for _ in range(10):
            assert httpx.get(server.url + "/v1/models", timeout=120).status_code == 200
            order.append("small")
        reader.join()
    assert answers[0].status == 400 and "exceeds the available context" in answers[0].json()["error"]["message"]
    assert order == ["small"] * 10 + ["big"], order


def test_http2_preface_gets_a_json_400_and_a_close(server: KineticServer) -> None:
    response = exchange(address(server), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x12\x04" + b"\x00" * 32)
    assert_json_error(response, 400, "HTTP/2.0 is not supported")


def test_bytes_that_are_not_http_get_a_json_400_and_a_close(server: KineticServer) -> None:
    # what a TLS client sends first to a plain-HTTP port, then junk
    response = exchange(address(server), b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\xab" * 64 + b"\r\n\r\n")
    assert_json_error(response, 400, "Invalid HTTP request")


def test_server_still_serves_after_all_of_the_above(server: KineticServer) -> None:
    r = httpx.post(server.url + CHAT, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                   timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 2


def test_the_openai_sdk_sees_the_413_even_while_still_uploading(server: KineticServer) -> None:
    """Ten times the limit: the server answers early, then drains instead of resetting the upload."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    text = "hello " * (10 * DEFAULT_MAX_BODY_BYTES // 6)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], max_tokens=1)
    assert info.value.status_code == 413 and "larger than" in info.value.message


def test_after_a_413_the_rest_of_the_upload_is_drained_not_reset(server: KineticServer) -> None:
    """A plain close with the client's bytes unread resets the connection: the client's next send
    fails, and many clients then report a connection error instead of the 413."""
    with socket.create_connection(address(server), timeout=30) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: {10 * DEFAULT_MAX_BODY_BYTES}\r\n\r\n"
                     .encode() + b"x" * 1_000_000)
        assert select.select([sock], [], [], 30)[0], "no answer"
        time.sleep(0.5)  # time for a reset, had the server sent one
        sock.sendall(b"x" * 1_000_000)  # raises ConnectionResetError after a reset
        response = read_response(sock)
    assert_json_error(response, 413, "larger than")
