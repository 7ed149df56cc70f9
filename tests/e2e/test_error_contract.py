"""One error contract, protocol by protocol: every kind of error has its status and the protocol's
own envelope, and a stream that fails midway still ends the way its protocol ends.

All of it runs the real `kinetic serve` on the bundled model. Two kinds a real model cannot produce on
demand (staying in "loading" while a client knocks, failing in the middle of a stream) are unit tests
over the scripted engine: tests/unit/test_stream_faults_in_clients.py.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.error_envelopes import ROUTES, check_envelope
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

KEY = "contract-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = "hello " * 3000  # far beyond the 2048-token context below
@pytest.fixture(scope="module")
def keyed_server(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer("-c", "2048", "-np", "1", "--api-key", KEY, "--body-timeout", "1", "-a", "m") as server:
        yield server


def raw_exchange(url: str, request: bytes, timeout: float = 10) -> tuple[int, dict[str, Any]]:
    """Sends bytes as they are (a stalled body, a lying Content-Length) and reads the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), None)
                if length is not None and len(rest) >= length:
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


@pytest.mark.parametrize("protocol", ROUTES)
def test_field_error_is_400_naming_the_field(keyed_server: KineticServer, protocol: str) -> None:
    path, good = ROUTES[protocol]
    bad = ({**good, "max_tokens": 0} if protocol == "anthropic" else {**good, "options": {"temperature": 5}}
           if protocol == "ollama" else {**good, "temperature": 5})
    r = httpx.post(keyed_server.url + path, json=bad, headers=AUTH)
    assert r.status_code == 400
    check_envelope(protocol, 400, r.json())
    message = r.json()["error"] if protocol == "ollama" else r.json()["error"]["message"]
    assert ("max_tokens" if protocol == "anthropic" else "temperature") in message


@pytest.mark.parametrize("protocol", ROUTES)
def test_missing_key_is_401(keyed_server: KineticServer, protocol: str) -> None:
    path, good = ROUTES[protocol]
    r = httpx.post(keyed_server.url + path, json=good)
    assert r.status_code == 401
    check_envelope(protocol, 401, r.json())
    if protocol == "openai":
        assert r.json() == {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}


@pytest.mark.parametrize("protocol, path", [("openai", "/v1/nope"), ("llamacpp", "/nope"),
                                            ("anthropic", "/v1/messages/nope"), ("responses", "/v1/responses/nope"),
                                            ("ollama", "/api/nope")])
def test_unknown_route_is_404(keyed_server: KineticServer, protocol: str, path: str) -> None:
    r = httpx.post(keyed_server.url + path, json={}, headers=AUTH)
    assert r.status_code == 404
    check_envelope(protocol, 404, r.json())


@pytest.mark.parametrize("protocol", ROUTES)
def test_stalled_body_is_408(keyed_server: KineticServer, protocol: str) -> None:
    path, _ = ROUTES[protocol]
    request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
               "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messa").encode()
    status, body = raw_exchange(keyed_server.url, request)
    assert status == 408
    check_envelope(protocol, 408, body)


@pytest.mark.parametrize("protocol", ROUTES)
def test_oversized_body_is_413_without_reading_it(keyed_server: KineticServer, protocol: str) -> None:
    """The client declares 10 GB and sends the first 256 KiB, then waits. A server that read the body
    to count it would wait for the rest and answer 408 after --body-timeout (1 s here): the 413 shows
    the declared length was refused before any of the body was read."""
    path, _ = ROUTES[protocol]
    request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {10 ** 10}\r\n\r\n").encode()
    status, body = raw_exchange(keyed_server.url, request + b'{"messages": "' + b"x" * 256 * 1024)
    assert status == 413
    check_envelope(protocol, 413, body)


@pytest.mark.parametrize("protocol, path", [("openai", "/v1/embeddings"), ("llamacpp", "/metrics"),
                                            ("ollama", "/api/embed")])
def test_disabled_feature_is_501(keyed_server: KineticServer, protocol: str, path: str) -> None:
    if path == "/metrics":
        r = httpx.get(keyed_server.url + path, headers=AUTH)
    else:
        r = httpx.post(keyed_server.url + path, json={"input": "hi"}, headers=AUTH)
    assert r.status_code == 501
    check_envelope(protocol, 501, r.json())


@pytest.mark.parametrize("protocol", ROUTES)
def test_context_overflow_is_400_with_the_sizes(keyed_server: KineticServer, protocol: str) -> None:
    path, good = ROUTES[protocol]
    if protocol == "llamacpp":
        body = {**good, "prompt": LONG}
    elif protocol == "responses":
        body = {**good, "input": LONG}
    else:
        body = {**good, "messages": [{"role": "user", "content": LONG}]}
    r = httpx.post(keyed_server.url + path, json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400
    if protocol == "anthropic":
        check_envelope(protocol, 400, r.json())
    elif protocol == "ollama":
        check_envelope(protocol, 400, r.json())
        assert "context size (2048 tokens)" in r.json()["error"]
    else:
        check_envelope(protocol, 400, r.json(), kind="exceed_context_size_error")
        assert r.json()["error"]["n_ctx"] == 2048 and r.json()["error"]["n_prompt_tokens"] > 2048
    assert httpx.post(keyed_server.url + path, json=good, headers=AUTH, timeout=60).status_code == 200
