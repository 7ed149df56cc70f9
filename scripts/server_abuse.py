"""Throw bad and hostile traffic at a running kinetic (or llama-server) and check it keeps serving.

    python scripts/server_abuse.py --url http://127.0.0.1:8080
    python scripts/server_abuse.py -- kinetic serve model.gguf -c 512 --port 8091
    python scripts/server_abuse.py --long --url ...     # also: a stalled body is dropped (30 s)

Every check sends one kind of abuse, then the server must still answer /health. Traffic goes
only to the URL given (loopback in practice); every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlparse

import httpx

CHAT = "/v1/chat/completions"
HELLO = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


@dataclass
class Target:
    url: str
    body_timeout: float = 30.0

    @property
    def address(self) -> tuple[str, int]:
        parsed = urlparse(self.url)
        return parsed.hostname or "127.0.0.1", parsed.port or 80

    def raw(self, payload: bytes, *, read: bool = True, timeout: float = 10.0) -> bytes:
        """Sends bytes on a fresh TCP connection; returns what came back before the server closed."""
        with socket.create_connection(self.address, timeout=timeout) as sock:
            sock.sendall(payload)
            if not read:
                return b""
            chunks = []
            try:
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
                    if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                        break
            except (socket.timeout, ConnectionResetError):
                pass
            return b"".join(chunks)


def _complete(response: bytes) -> bool:
    head, _, body = response.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _status(response: bytes) -> int:
    try:
        return int(response.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


Check = Callable[[Target], None]
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
        expect(r.status_code == 400 and field in r.json()["error"]["message"], f"{field}: {r.status_code} {r.text[:160]}")


@check("an oversized body is refused before it is read")
def oversized_body(t: Target) -> None:
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {200 * 1024 * 1024}\r\n\r\n").encode()
    status = _status(t.raw(head + b"{"))
    expect(status == 413, f"status {status}")


@check("oversized headers are refused")
def oversized_headers(t: Target) -> None:
    payload = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000 + b"\r\n\r\n"
    try:
        status = _status(t.raw(payload))
    except (ConnectionResetError, BrokenPipeError):
        status = 431  # closed on us: refused too
    expect(status in (0, 400, 413, 431), f"status {status}")


@check("a chunked request body is accepted")
def chunked_body(t: Target) -> None:
    def parts():
        data = json.dumps(HELLO).encode()
        for i in range(0, len(data), 7):
            yield data[i:i + 7]

    r = httpx.post(t.url + CHAT, content=parts(), headers={"content-type": "application/json"}, timeout=60)
    expect(r.status_code == 200 and r.json()["choices"], f"{r.status_code} {r.text[:120]}")


@check("an HTTP/2 preface on the HTTP/1.1 port is answered or closed, not fatal")
def http2_preface(t: Target) -> None:
    t.raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 32)


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


@check("a client that disconnects before sending its body does no harm")
def disconnect_before_body(t: Target) -> None:
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 500\r\n\r\n").encode()
    for _ in range(5):
        t.raw(head + b'{"messages":', read=False)


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


@check("100 parallel connections: each is served or gets a 503, none hangs")
def parallel_connections(t: Target) -> None:
    def hit(_: int) -> int:
        try:
            return httpx.get(t.url + "/health", timeout=30).status_code
        except httpx.HTTPError:
            return -1

    with ThreadPoolExecutor(max_workers=100) as pool:
        statuses = list(pool.map(hit, range(100)))
    expect(all(s in (200, 503) for s in statuses), f"statuses {sorted(set(statuses))}")
    expect(statuses.count(200) >= 1, "nothing served")


@check("8 parallel chats all complete")
def parallel_chats(t: Target) -> None:
    def chat(i: int) -> int:
        body = {"messages": [{"role": "user", "content": f"Question {i}"}], "max_tokens": 8}
        return httpx.post(t.url + CHAT, json=body, timeout=300).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = list(pool.map(chat, range(8)))
    expect(statuses == [200] * 8, f"statuses {statuses}")


@check("a client that sends headers and then stalls is disconnected", long=True)
def stalled_body(t: Target) -> None:
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 100\r\n\r\n").encode()
    started = time.monotonic()
    with socket.create_connection(t.address, timeout=t.body_timeout + 30) as sock:
        sock.sendall(head + b"{")
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
    waited = time.monotonic() - started
    expect(waited < t.body_timeout + 15, f"still connected after {waited:.0f}s")


def healthy(t: Target) -> bool:
    try:
        return httpx.get(t.url + "/health", timeout=30).status_code == 200
    except httpx.HTTPError:
        return False


def run_checks(target: Target, *, long: bool = False) -> list[tuple[str, str | None]]:
    """Each check's description and its failure (None when it passed and the server stayed up)."""
    results: list[tuple[str, str | None]] = []
    for description, func in CHECKS + (LONG_CHECKS if long else []):
        try:
            func(target)
            failure = None
        except Exception as exc:  # a failing check is reported, the run goes on
            failure = f"{type(exc).__name__}: {exc}"
        if failure is None and not healthy(target):
            failure = "the server stopped answering /health afterwards"
        results.append((description, failure))
    return results


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
    parser.add_argument("--long", action="store_true", help="also run the slow checks (stalled body)")
    parser.add_argument("--body-timeout", type=float, default=30.0, help="the server's body timeout, seconds")
    args = parser.parse_args(argv)
    url = args.url
    if not url and command:
        port = command[command.index("--port") + 1] if "--port" in command else "8080"
        host = command[command.index("--host") + 1] if "--host" in command else "127.0.0.1"
        url = f"http://{host}:{port}"
    if not url:
        parser.error("give --url or a server command after --")
    process = subprocess.Popen(command) if command else None
    try:
        wait_ready(url, process)
        results = run_checks(Target(url, args.body_timeout), long=args.long)
    finally:
        if process is not None:
            process.terminate()
            process.wait(timeout=30)
    for description, failure in results:
        print(f"{'FAIL' if failure else 'ok  '}  {description}" + (f"\n      {failure}" if failure else ""))
    failed = sum(1 for _, failure in results if failure)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
