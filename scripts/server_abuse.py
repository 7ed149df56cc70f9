"""Throw bad and hostile traffic at a running kinetic (or llama-server) and check it keeps serving.

    python scripts/server_abuse.py --url http://127.0.0.1:8080
    python scripts/server_abuse.py -- kinetic serve model.gguf -c 512 --port 8091
    python scripts/server_abuse.py --long --url ...     # also: stalled heads and bodies are dropped (30 s)
    python scripts/server_abuse.py --student-key sk-alice --admin-key sk-teacher --url ...  # the role walk alone

Every check sends one kind of abuse and asserts the server's answer (status, JSON error body, or
the connection closed), then the server must still answer /health. The results are printed as a
table. The role walk calls every route of docs/reference/routes.md with the student key and the admin key
given (the management routes must refuse the student with 403 and let the admin through), or, with
no keys given, checks that an open server refuses no route. The server's limits (--max-connections,
--header-timeout, --max-header-size, --max-body-size, --body-timeout) are read from the command after `--`,
or given to this script with the same flags when it tests a --url. Traffic goes only to the URL given
(loopback in practice); every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

CHAT = "/v1/chat/completions"
HELLO = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


MiB = 1024 * 1024


@dataclass
class Target:
    url: str
    body_timeout: float = 30.0
    header_timeout: float = 30.0
    max_connections: int = 64
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 4 * MiB
    student_key: str | None = None  # the role walk: a student's key and the admin's
    admin_key: str | None = None

    @property
    def address(self) -> tuple[str, int]:
        parsed = urlparse(self.url)
        return parsed.hostname or "127.0.0.1", parsed.port or 80

    def connect(self, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection(self.address, timeout=timeout)

    def raw(self, payload: bytes, *, timeout: float = 10.0) -> Answer:
        """Sends bytes on a fresh TCP connection; returns the answer and whether the server closed."""
        with self.connect(timeout) as sock:
            try:
                sock.sendall(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed on us while sending: what it said first is still readable
            return read_answer(sock)


@dataclass
class Answer:
    status: int  # 0: no HTTP response at all
    body: bytes
    closed: bool  # the server closed the connection (after its answer, if any)

    def error(self) -> dict:
        """The JSON error body ({"error": {...}}); raises if the body is not one."""
        data = json.loads(self.body)
        expect(isinstance(data.get("error"), dict), f"not a JSON error body: {self.body[:160]!r}")
        return data["error"]


def read_answer(sock: socket.socket, *, wait_for_close: bool = True) -> Answer:
    data = b""
    closed = False
    try:
        while chunk := sock.recv(65536):
            data += chunk
            if _complete(data):
                break
        else:
            closed = True
        if not closed and wait_for_close:
            sock.settimeout(5)
            closed = sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    except TimeoutError:
        pass
    head, _, body = data.partition(b"\r\n\r\n")
    return Answer(_status(data), body, closed)


def _complete(response: bytes) -> bool:
    head, sep, body = response.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if sep and line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _status(response: bytes) -> int:
    try:
        return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/") else 0
    except (IndexError, ValueError):
        return 0


def expect_json_refusal(answer: Answer, status: int, words: str = "") -> None:
    """The answer is `status` with a JSON error body (mentioning `words`), and the server closed."""
    expect(answer.status == status, f"status {answer.status}, expected {status}: {answer.body[:160]!r}")
    message = answer.error().get("message", "")
    expect(words in message, f"error message {message!r} does not mention {words!r}")
    expect(answer.closed, "the connection was left open after the refusal")


Check = Callable[[Target], str | None]  # what it returns is shown in the table's detail column
CHECKS: list[tuple[str, Check]] = []
LONG_CHECKS: list[tuple[str, Check]] = []


def check(description: str, *, long: bool = False) -> Callable[[Check], Check]:
    def register(func: Check) -> Check:
        (LONG_CHECKS if long else CHECKS).append((description, func))
        return func

    return register


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


@check("malformed JSON gets a 400 with a JSON error body")
def malformed_json(t: Target) -> None:
    for raw in (b"{not json", b"", b"\xff\xfe", b"[]", b"null"):
        r = httpx.post(t.url + CHAT, content=raw, headers={"content-type": "application/json"})
        expect(r.status_code == 400 and "error" in r.json(), f"{raw!r}: {r.status_code} {r.text[:120]}")


@check("wrong field types get a 400 naming the field")
def wrong_types(t: Target) -> None:
    for field, value in (("max_tokens", "many"), ("temperature", "hot"), ("messages", "hi"), ("stream", [1])):
        r = httpx.post(t.url + CHAT, json={**HELLO, field: value})
        expect(r.status_code == 400 and field in r.json()["error"]["message"],
               f"{field}: {r.status_code} {r.text[:160]}")


@check("a body declared over --max-body-size gets a JSON 413 before it is sent")
def oversized_body(t: Target) -> None:
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {t.max_body_bytes + 1}\r\n\r\n").encode()
    expect_json_refusal(t.raw(head + b"{"), 413, "larger than")


@check("a chunked body over --max-body-size gets a JSON 413 before it is all sent")
def oversized_chunked_body(t: Target) -> None:
    chunk = b"x" * 65536
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    planned = 4 * t.max_body_bytes // len(chunk) + 4
    sent = 0
    with t.connect(timeout=30) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        try:
            while sent < planned and not select.select([sock], [], [], 0)[0]:
                sock.sendall(frame)
                sent += 1
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_answer(sock)
    expect_json_refusal(answer, 413, "larger than")
    expect(sent < planned, f"the server read all {sent} chunks before answering")


@check("headers over --max-header-size get a JSON 431, whole or still arriving")
def oversized_headers(t: Target) -> None:
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * t.max_header_bytes + 1024) + b"\r\n"
    for payload in (head + b"\r\n", head):
        expect_json_refusal(t.raw(payload), 431, "headers larger than")


@check("a body just under --max-body-size does not hold up other clients")
def large_body_under_limit(t: Target) -> None:
    words = "hello world " * ((t.max_body_bytes - 4096) // 12)
    body = json.dumps({"messages": [{"role": "user", "content": words}], "max_tokens": 1}).encode()
    order: list[str] = []
    with t.connect(timeout=300) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body[:-1])
        time.sleep(1)  # the server takes the body in; the last byte then starts seconds of tokenizing

        def read_big() -> Answer:
            big_answer = read_answer(sock, wait_for_close=False)
            order.append("big")
            return big_answer

        with ThreadPoolExecutor(max_workers=1) as pool:
            big = pool.submit(read_big)
            sock.sendall(body[-1:])
            for _ in range(10):
                status = httpx.get(t.url + "/v1/models", timeout=300).status_code
                expect(status == 200, f"/v1/models: {status}")
                order.append("small")
            answer = big.result()
    expect(answer.status in (200, 400), f"the large request got {answer.status}")
    expect(order[-1] == "big", f"the large request was answered before the others: {order}")


@check("a chunked request body is accepted")
def chunked_body(t: Target) -> None:
    def parts():
        data = json.dumps(HELLO).encode()
        for i in range(0, len(data), 7):
            yield data[i:i + 7]

    r = httpx.post(t.url + CHAT, content=parts(), headers={"content-type": "application/json"}, timeout=60)
    expect(r.status_code == 200 and r.json()["choices"], f"{r.status_code} {r.text[:120]}")


@check("an HTTP/2 preface gets a 400 or a clean close")
def http2_preface(t: Target) -> None:
    answer = t.raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x12\x04" + b"\x00" * 32)
    expect(answer.closed, "the connection was left open")
    expect(answer.status in (0, 400), f"status {answer.status}: {answer.body[:160]!r}")


@check("bytes that are not HTTP (a TLS hello) get a 400 or a clean close")
def garbage(t: Target) -> None:
    answer = t.raw(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\xab" * 64 + b"\r\n\r\n")
    expect(answer.closed, "the connection was left open")
    expect(answer.status in (0, 400), f"status {answer.status}: {answer.body[:160]!r}")


@check("bad input to the llama-server routes is a 400")
def bad_native_input(t: Target) -> None:
    for path, body in (("/completion", {"prompt": []}), ("/completion", {"prompt": [999999999]}),
                       ("/tokenize", {"content": {"a": 1}}), ("/detokenize", {"tokens": "abc"}),
                       ("/apply-template", {"messages": []})):
        r = httpx.post(t.url + path, json=body)
        expect(r.status_code == 400 and "error" in r.json(), f"{path} {body}: {r.status_code} {r.text[:120]}")


# ------------------------------------------------------------------------ Ollama routes (/api/*)


def _ollama_model(t: Target) -> str:
    return httpx.get(t.url + "/api/tags").json()["models"][0]["name"]


@check("bad input to the Ollama routes is a 400 (404 for an unknown model) in Ollama's {\"error\"} shape")
def bad_ollama_input(t: Target) -> None:
    model = _ollama_model(t)
    hi = [{"role": "user", "content": "hi"}]
    probes: list[tuple[str, object, int, str]] = [
        ("/api/chat", b"{not json", 400, "JSON"),
        ("/api/chat", b"", 400, ""),
        ("/api/chat", {"model": model, "messages": "hi"}, 400, "messages"),
        ("/api/chat", {"model": model, "messages": hi, "options": {"top_k": "many"}}, 400, "options.top_k"),
        ("/api/chat", {"model": model, "messages": hi, "options": {"temperature": 9}}, 400, "options.temperature"),
        ("/api/chat", {"model": model, "messages": hi, "format": {"type": "nonsense"}}, 400, "format"),
        ("/api/chat", {"model": model, "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400,
         "image"),
        ("/api/chat", {"model": "no-such-model", "messages": hi}, 404, "no-such-model"),
        ("/api/chat", {"messages": hi}, 400, "model is required"),
        ("/api/generate", {"model": model, "prompt": ["hi"]}, 400, "prompt"),
        ("/api/generate", {"model": model, "prompt": "hi", "stream": [1]}, 400, "stream"),
        ("/api/generate", {"model": model, "prompt": "hi", "context": ["x"]}, 400, "context"),
        ("/api/embed", {"model": model, "input": {"a": 1}}, 400, "input"),
        ("/api/show", {}, 400, "model is required"),
    ]
    for path, body, status, words in probes:
        if isinstance(body, bytes):
            r = httpx.post(t.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
        else:
            r = httpx.post(t.url + path, json=body, timeout=60)
        ok = r.status_code == status and list(r.json()) == ["error"] and words in r.json()["error"]
        expect(ok, f"{path} {body!r}: {r.status_code} {r.text[:160]}")


@check("a client that leaves an Ollama NDJSON stream frees its slot")
def leave_ollama_stream(t: Target) -> None:
    body = {"model": _ollama_model(t), "messages": [{"role": "user", "content": "Hello"}],
            "options": {"num_predict": 500}}
    for _ in range(2):
        with httpx.stream("POST", t.url + "/api/chat", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if '"done":false' in line:
                    break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not any(s["is_processing"] for s in httpx.get(t.url + "/slots").json()):
            return
        time.sleep(0.1)
    raise AssertionError("slots still busy after the clients left")


@check("a request sent one byte at a time is served")
def one_byte_at_a_time(t: Target) -> None:
    body = json.dumps(HELLO).encode()
    payload = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body
    with socket.create_connection(t.address, timeout=60) as sock:
        for i in range(len(payload)):
            sock.sendall(payload[i:i + 1])
            time.sleep(0.001)
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    expect(_status(response) == 200, response[:120].decode(errors="replace"))


@check("clients that leave before their body are let go, and leak no connection")
def disconnect_before_body(t: Target) -> None:
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 500\r\n\r\n").encode()
    # A half close (no more to send): the server ends the connection without a request to answer.
    with t.connect(timeout=t.body_timeout + 15) as sock:
        sock.sendall(head + b'{"messages":')
        sock.shutdown(socket.SHUT_WR)
        answer = read_answer(sock)
    expect(answer.closed, "the server kept the half-closed connection")
    expect(answer.status in (0, 400, 408), f"status {answer.status}: {answer.body[:160]!r}")
    # More full disconnects than the connection cap: had any leaked, the next request would get a 503.
    for _ in range(t.max_connections + 4):
        with t.connect() as sock:
            sock.sendall(head + b'{"messages":')
    # The server counts a connection out when its read sees the close, a moment after the client left: a leaked one
    # would keep the 503 of a full server for good, so /health is asked for up to 2 s.
    deadline = time.monotonic() + 2.0
    while (status := httpx.get(t.url + "/health", timeout=30).status_code) == 503 and time.monotonic() < deadline:
        time.sleep(0.05)
    expect(status == 200, f"/health: {status} after the disconnects")


@check("a client that disconnects mid-stream frees its slot")
def disconnect_mid_stream(t: Target) -> None:
    for _ in range(3):
        body = {**HELLO, "max_tokens": 500, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", t.url + CHAT, json=body, timeout=60) as response:
            for line in response.iter_lines():
                if '"content":"' in line:
                    break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        slots = httpx.get(t.url + "/slots").json()
        if not any(s["is_processing"] for s in slots):
            return
        time.sleep(0.1)
    raise AssertionError(f"slots still busy: {slots}")


@check("100 parallel connections: each is served or gets a JSON 503, none hangs")
def parallel_connections(t: Target) -> None:
    def hit(_: int) -> tuple[int, bool]:
        try:
            r = httpx.get(t.url + "/health", timeout=30)
        except httpx.HTTPError:
            return -1, False
        return r.status_code, r.status_code != 503 or r.headers.get("content-type") == "application/json"

    with ThreadPoolExecutor(max_workers=100) as pool:
        results = list(pool.map(hit, range(100)))
    statuses = [status for status, _ in results]
    expect(all(s in (200, 503) for s in statuses), f"statuses {sorted(set(statuses))}")
    expect(all(json_ok for _, json_ok in results), "a 503 without a JSON body")
    expect(statuses.count(200) >= 1, "nothing served")


@check("one connection over --max-connections gets a JSON 503; freed, it is served again")
def connection_cap(t: Target) -> None:
    held: list[socket.socket] = []
    try:
        for _ in range(t.max_connections):  # served once, then kept alive: each holds a connection
            sock = t.connect(timeout=30)
            held.append(sock)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = read_answer(sock, wait_for_close=False)
            expect(answer.status == 200, f"connection {len(held)}: status {answer.status}")
        expect_json_refusal(t.raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"), 503, "connections")
    finally:
        for sock in held:
            sock.close()
    status = httpx.get(t.url + "/health", timeout=30).status_code
    expect(status == 200, f"/health: {status} once the connections closed")


@check("8 parallel chats all complete")
def parallel_chats(t: Target) -> None:
    def chat(i: int) -> int:
        body = {"messages": [{"role": "user", "content": f"Question {i}"}], "max_tokens": 8}
        return httpx.post(t.url + CHAT, json=body, timeout=300).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(chat, range(8)))
    expect(statuses == [200] * 8, f"statuses {statuses}")


@check("a client that sends headers and then stalls gets a 408 and a close", long=True)
def stalled_body(t: Target) -> None:
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 100\r\n\r\n").encode()
    with t.connect(timeout=t.body_timeout + 30) as sock:
        sock.sendall(head + b"{")
        answer = read_answer(sock)
    expect_json_refusal(answer, 408, "body")


@check("a client that sends part of its headers and stalls gets a 408 and a close", long=True)
def stalled_headers(t: Target) -> None:
    with t.connect(timeout=t.header_timeout + 30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        answer = read_answer(sock)
    expect_json_refusal(answer, 408, "headers")


ROUTES_DOC = Path(__file__).resolve().parents[1] / "docs" / "reference" / "routes.md"
ROUTE_ROW = re.compile(r"^\| ([A-Z, ]+) \| `([^`]+)` \| (anyone|student|admin)")


def route_table() -> list[tuple[str, str, str]]:
    """(method, path, who may call it) of every route, from the docs' table ({...} filled with 0)."""
    rows = []
    for line in ROUTES_DOC.read_text(encoding="utf-8").splitlines():
        if match := ROUTE_ROW.match(line):
            methods, route, who = match.groups()
            rows += [(method.strip(), re.sub(r"\{[^}]*\}", "0", route), who) for method in methods.split(",")]
    return rows


def answer_status(t: Target, method: str, path: str, key: str | None) -> tuple[int, str]:
    """The status and the start of the body of one call; a stream (/models/sse) is left after its head."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body: dict[str, Any] | None = {} if method == "POST" else None
    with httpx.stream(method, t.url + path, headers=headers, timeout=60, json=body) as r:
        if r.headers.get("content-type", "").startswith(("text/event-stream", "application/x-ndjson")):
            return r.status_code, ""
        return r.status_code, r.read().decode("utf-8", "replace")[:300]


def refused_for_role(status: int, text: str) -> bool:
    """401, or a 403 that is about the key (not a feature switched off: /cors-proxy's feature_disabled)."""
    return status == 401 or (status == 403 and "feature_disabled" not in text)


def role_walk(t: Target) -> tuple[int, int, int]:
    """Every route with the student key and the admin key (or, with no keys, none refused): returns the
    routes refused to the student, those allowed to the admin, and the routes walked."""
    rows = route_table()
    expect(len(rows) > 40, f"only {len(rows)} routes read from {ROUTES_DOC}")
    refused = allowed = 0
    for method, path, who in rows:
        if t.student_key is None:
            status, text = answer_status(t, method, path, None)
            expect(not refused_for_role(status, text), f"open server: {method} {path} refused: {status} {text}")
            continue
        status, text = answer_status(t, method, path, t.student_key)
        if who == "admin":
            expect(status == 403 and (method == "HEAD" or "admin key" in text),
                   f"student on {method} {path}: {status} {text}")
            refused += 1
        else:
            expect(not refused_for_role(status, text), f"student refused {method} {path}: {status} {text}")
        if t.admin_key is not None:
            status, text = answer_status(t, method, path, t.admin_key)
            expect(not refused_for_role(status, text), f"admin refused {method} {path}: {status} {text}")
            allowed += 1
    return refused, allowed, len(rows)


@check("the role walk: management routes refuse a student's key (403) and let the admin through")
def roles(t: Target) -> str | None:
    refused, allowed, walked = role_walk(t)
    if t.student_key is None:
        return f"{walked} routes, none refused with no key"
    return f"{walked} routes: {refused} refused to the student, {allowed} allowed to the admin"


def healthy(t: Target) -> bool:
    try:
        return httpx.get(t.url + "/health", timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Result:
    description: str
    failure: str | None  # None: passed, and the server still answered /health afterwards
    seconds: float
    detail: str | None = None  # what a passing check reports


def run_checks(target: Target, *, long: bool = False) -> list[Result]:
    results: list[Result] = []
    checks = CHECKS + (LONG_CHECKS if long else [])
    if target.student_key is not None:  # a keyed server: the other checks send no key, so only the walk
        checks = [(description, func) for description, func in checks if func is roles]
    for description, func in checks:
        started = time.monotonic()
        detail = None
        try:
            detail = func(target)
            failure = None
        except Exception as exc:  # a failing check is reported, the run goes on
            failure = f"{type(exc).__name__}: {exc}"
        if failure is None and not healthy(target):
            failure = "the server stopped answering /health afterwards"
        results.append(Result(description, failure, time.monotonic() - started, detail))
    return results


def table(results: list[Result]) -> str:
    """A Markdown table: readable in a terminal, pasteable into notes."""
    rows = [("check", "result", "seconds", "detail")]
    rows += [(r.description, "FAIL" if r.failure else "ok", f"{r.seconds:.1f}",
              (r.failure or r.detail or "").replace("|", "/").replace("\n", " ")[:200]) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + " |"
             for row in rows]
    lines.insert(1, "|" + "|".join("-" * (width + 2) for width in widths) + "|")
    return "\n".join(lines)


def wait_ready(url: str, process: subprocess.Popen | None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}")
        if healthy(Target(url)):
            return
        time.sleep(0.3)
    raise SystemExit(f"{url} did not become healthy in {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        command = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="server to test (default: from the command's --host/--port)")
    parser.add_argument("--long", action="store_true", help="also run the slow checks (stalled heads and bodies)")
    parser.add_argument("--student-key", help="a student's key, for the role walk (else: the server must be open)")
    parser.add_argument("--admin-key", help="the admin key, for the role walk")
    for flag, default, kind in LIMIT_FLAGS:
        parser.add_argument(flag, type=kind, default=None, help=f"the server's {flag} (default: {default})")
    args = parser.parse_args(argv)
    url = args.url
    if not url and command:
        url = f"http://{_flag(command, '--host', '127.0.0.1')}:{_flag(command, '--port', '8080')}"
    if not url:
        parser.error("give --url or a server command after --")
    limits = {}
    for flag, default, kind in LIMIT_FLAGS:
        given = getattr(args, flag[2:].replace("-", "_"))
        limits[flag] = given if given is not None else kind(_flag(command, flag, default))
    target = Target(url, body_timeout=limits["--body-timeout"], header_timeout=limits["--header-timeout"],
                    max_connections=limits["--max-connections"], max_header_bytes=limits["--max-header-size"],
                    max_body_bytes=limits["--max-body-size"], student_key=args.student_key,
                    admin_key=args.admin_key)
    process = subprocess.Popen(command) if command else None
    try:
        wait_ready(url, process)
        results = run_checks(target, long=args.long)
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
    print(table(results))
    failed = sum(1 for r in results if r.failure)
    print(f"\n{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def byte_size(text: str) -> int:
    """'4M', '64K', '65536' -> bytes, as kinetic's --max-*-size flags read them."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1024, "M": MiB, "G": 1024 * MiB}
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


LIMIT_FLAGS: list[tuple[str, str, Callable[[str], Any]]] = [
    ("--body-timeout", "30", float), ("--header-timeout", "30", float), ("--max-connections", "64", int),
    ("--max-header-size", "64K", byte_size), ("--max-body-size", "4M", byte_size),
]


def _flag(command: list[str], name: str, default: str) -> str:
    """The value of `name` in a server command line (`--name value` or `--name=value`)."""
    for index, token in enumerate(command):
        if token == name and index + 1 < len(command):
            return command[index + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return default


if __name__ == "__main__":
    raise SystemExit(main())
