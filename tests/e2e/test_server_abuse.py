"""scripts/server_abuse.py against a live server: each kind of abuse, then the server still answers."""

from __future__ import annotations

import importlib.util
import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from kinetic.classroom.roles import ADMIN_ROUTES
from tests.server import KineticServer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "server_abuse.py"
BODY_TIMEOUT_S = 2.0
HEADER_TIMEOUT_S = 2.0


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("server_abuse", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["server_abuse"] = module
    spec.loader.exec_module(module)
    return module


abuse = load_script()


@pytest.fixture(scope="module")
def target(model_lock: None, live_server: KineticServer) -> Iterator[object]:
    with KineticServer("-c", "2048", "-np", "2", "--metrics", "--body-timeout", str(BODY_TIMEOUT_S),
                       "--header-timeout", str(HEADER_TIMEOUT_S)) as server:
        yield abuse.Target(server.url, body_timeout=BODY_TIMEOUT_S, header_timeout=HEADER_TIMEOUT_S)


@pytest.mark.parametrize("description, check", abuse.CHECKS + abuse.LONG_CHECKS,
                         ids=[func.__name__ for _, func in abuse.CHECKS + abuse.LONG_CHECKS])
def test_server_survives(target: object, description: str, check: object) -> None:
    check(target)  # type: ignore[operator]
    assert abuse.healthy(target), f"not healthy after: {description}"


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a socket timeout (a hang) fails the test."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def engine_counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith(("llamacpp:n_decode_total", "llamacpp:prompt_tokens_total",
                                "llamacpp:requests_processing"))}


def test_disconnect_before_body_runs_nothing(target: object) -> None:
    # the script's check asserts the close; this one that no prompt of a half-sent body is decoded
    url = target.url  # type: ignore[attr-defined]
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 500\r\n\r\n{\"messages\":")
    before = engine_counters(url)
    for _ in range(3):
        with socket.create_connection(target.address, timeout=30) as sock:  # type: ignore[attr-defined]
            sock.sendall(head)
            sock.shutdown(socket.SHUT_WR)  # the client is gone with 488 bytes of its body unsent
            response = read_until_closed(sock)
        # closed, or refused with a client error; never served
        assert response == b"" or re.match(rb"HTTP/1\.1 4\d\d ", response), response[:300]
    assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
    after = engine_counters(url)
    assert after == before and after["llamacpp:requests_processing"] == 0  # no prompt reached the engine


def test_the_role_walk_on_a_keyed_server(model_lock: None, live_server: KineticServer, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-alice alice\nsk-bob bob\n", encoding="utf-8")
    with KineticServer("-c", "1024", "-np", "1", "--metrics", "--api-key-file", str(keys), "--admin-key", "sk-teacher",
                       "--slot-save-path", str(tmp_path / "slots"), "--ui-mcp-proxy") as server:
        target = abuse.Target(server.url, student_key="sk-alice", admin_key="sk-teacher")
        refused, allowed, walked = abuse.role_walk(target)
        assert abuse.healthy(target)
    print(f"role walk: {refused} of {walked} routes refused to a student, {allowed} allowed to the admin")
    assert refused == len(ADMIN_ROUTES) and allowed == walked  # every management route, nothing else
