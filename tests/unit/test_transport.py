"""kinetic/server/transport.py without a model: uvicorn with LimitedHttpProtocol in a thread, around a tiny app."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kinetic.config.args import parse_serve_args
from kinetic.config.values import byte_size
from kinetic.errors import PayloadTooLargeError
from kinetic.scheduling.arrivals import DOOR, DOOR_SCOPE_KEY
from kinetic.server.app import error_response
from kinetic.server.transport import TransportConfig, TransportLimits, _LingeringTransport, raw_response
from tests.rawhttp import exchange, read_response
from tests.server import free_port, wait_until

LIMITS = TransportLimits(max_connections=3, header_timeout=0.5, max_header_bytes=4096, max_body_bytes=10_000)


async def echo_length(request: Request) -> JSONResponse:
    return JSONResponse({"received": len(await request.body())})


async def door_count(request: Request) -> JSONResponse:
    """Before it reads its body: how many requests the door counts, and whether this one is among them."""
    return JSONResponse({"count": DOOR.count, "counted": DOOR_SCOPE_KEY in request.scope})


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    app = Starlette(routes=[Route("/echo", echo_length, methods=["POST"]), Route("/echo", echo_length),
                            Route("/door", door_count, methods=["GET", "POST"])])
    port = free_port()
    config = TransportConfig(app, limits=LIMITS, error_response=error_response, host="127.0.0.1", port=port,
                             log_level="error", timeout_keep_alive=30)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield "127.0.0.1", port
    server.should_exit = True
    thread.join(timeout=10)


def post(length: int, *, chunked: bool = False) -> bytes:
    body = b"x" * length
    if chunked:
        frames = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 1000]), body[i:i + 1000]) for i in range(0, length, 1000))
        return b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + frames + b"0\r\n\r\n"
    return b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length + body


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_up_to_the_limit_passes_and_one_byte_more_is_413(address: tuple[str, int], chunked: bool) -> None:
    accepted = exchange(address, post(LIMITS.max_body_bytes, chunked=chunked), check_close=False)
    assert accepted.json() == {"received": 10_000}
    refused = exchange(address, post(LIMITS.max_body_bytes + 1, chunked=chunked))
    assert refused.status == 413 and refused.closed
    assert refused.json()["error"] == {"message": "request body larger than 10000 bytes (the server's "
                                                  "--max-body-size)", "type": "invalid_request_error", "code": 413}


def test_a_refused_upload_is_drained_not_reset(address: tuple[str, int]) -> None:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n" + b"x" * 500_000)
        assert select.select([sock], [], [], 10)[0], "no answer"
        time.sleep(0.3)  # time for a reset, had the server sent one
        sock.sendall(b"x" * 500_000)  # raises ConnectionResetError after a reset
        response = read_response(sock)
    assert response.status == 413 and response.closed


def test_head_over_the_limit_is_431(address: tuple[str, int]) -> None:
    big = b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 5000 + b"\r\n\r\n"
    assert exchange(address, big).status == 431
    assert exchange(address, big[:-2]).status == 431  # still incomplete: counted as it comes


def test_stalled_head_is_408_and_closed(address: tuple[str, int]) -> None:
    response = exchange(address, b"GET /echo HTTP/1.1\r\nHo")
    assert response.status == 408 and response.closed and response.json()["error"]["type"] == "timeout_error"


def test_http2_preface_and_garbage_are_400(address: tuple[str, int]) -> None:
    for payload in (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\x16\x03\x01\x00\x05hello\r\n\r\n"):
        response = exchange(address, payload)
        assert response.status == 400 and response.closed and response.json()["error"]["code"] == 400


def test_one_connection_over_the_cap_is_503(address: tuple[str, int]) -> None:
    held = []
    try:
        for _ in range(LIMITS.max_connections):
            sock = socket.create_connection(address, timeout=10)
            held.append(sock)
            sock.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock, check_close=False).status == 200
        over = exchange(address, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        assert over.status == 503 and over.closed and over.json()["error"]["type"] == "unavailable_error"
    finally:
        for sock in held:
            sock.close()


def test_raw_response_is_a_whole_http_response() -> None:
    data = raw_response(error_response("/", PayloadTooLargeError("too big")))
    assert data.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"connection: close" in head and f"content-length: {len(body)}".encode() in head


def test_sizes_and_flag_defaults() -> None:
    assert [byte_size(s) for s in ("4M", "512K", "64KiB", "65536", "1.5m", "2 GB")] == [
        4 * 2**20, 512 * 1024, 65536, 65536, 3 * 2**19, 2 * 2**30]
    with pytest.raises(ValueError):
        byte_size("lots")
    defaults = parse_serve_args([], environ={})
    assert (defaults.max_connections, defaults.header_timeout, defaults.max_header_size,
            defaults.max_body_size) == (64, 30.0, 65536, 4 * 2**20)
    given = parse_serve_args(["--max-body-size", "1M", "--max-connections", "8"],
                             environ={"KINETIC_HEADER_TIMEOUT": "5"})
    assert (given.max_body_size, given.max_connections, given.header_timeout) == (2**20, 8, 5.0)


class RecordingTransport:
    """What the wrapper hands the socket: each write, and whether it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def test_a_head_goes_out_with_the_body_written_after_it_in_the_same_turn() -> None:
    async def run() -> None:
        raw = RecordingTransport()
        protocol = SimpleNamespace(loop=asyncio.get_running_loop(), linger_on_close=False, lingering=False)
        wrapper = _LingeringTransport(cast(Any, raw), cast(Any, protocol))
        wrapper.write(b"HTTP/1.1 200 OK\r\n\r\n")
        wrapper.write(b"data: {}\n\n")
        assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\ndata: {}\n\n"]  # one write, one packet
        wrapper.write(b"HTTP/1.1 200 OK\r\n\r\n")  # a head with nothing after it in this turn
        assert len(raw.writes) == 1
        await asyncio.sleep(0)
        assert raw.writes[-1] == b"HTTP/1.1 200 OK\r\n\r\n"  # goes out at the end of the turn
        wrapper.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        wrapper.close()  # a close before the turn ends sends it first
        assert raw.writes[-1].startswith(b"HTTP/1.1 204") and raw.closed

    asyncio.run(run())


def test_a_post_is_counted_at_the_door_from_its_head_until_it_is_answered_or_its_client_goes(
        address: tuple[str, int]) -> None:
    # an idle scheduler waits for what the door counts (arrivals.py): requests read in one turn of the loop count
    # before the first of them reaches the app
    head = b"POST /door HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"
    assert exchange(address, head + b"{}", check_close=False).json() == {"count": 1, "counted": True}
    until_the_door_counts(0)  # answered (the server's thread counts it out just after the last bytes go)
    assert exchange(address, b"GET /door HTTP/1.1\r\nHost: x\r\n\r\n", check_close=False).json() == {
        "count": 0, "counted": False}
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        until_the_door_counts(1)  # its body still on its way
    until_the_door_counts(0)  # the client went before its body was whole


def until_the_door_counts(n: int) -> None:
    wait_until(lambda: DOOR.count == n, f"the door counts {n}", timeout=10)
