"""llama-server behaviours that llama.cpp's own server tests check, on `kinetic serve` with the bundled
model: --host with several addresses, --tags, the localhost CORS default that --tools brings, and the
/cors-proxy route (--ui-mcp-proxy), driven with requests and httpx as a script or page would."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import requests

from tests.server import KineticServer

pytestmark = pytest.mark.e2e

KEY = "parity-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Target(BaseHTTPRequestHandler):
    """The server behind the proxy: records what reached it, answers with headers of its own."""

    seen: list[dict[str, Any]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        Target.seen.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                            "body": body})
        status = 404 if self.path.startswith("/missing") else 200
        payload = json.dumps({"path": self.path, "echo": body.decode()}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Access-Control-Allow-Origin", "http://target.example")  # must not come back
        self.send_header("X-Target", "yes")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def agent_server(model_lock: None) -> Iterator[KineticServer]:
    """llama-server's flag line for an agent setup: two addresses, aliases and tags, tools, the proxy."""
    with KineticServer("-c", "1024", "-np", "1", "--host", "127.0.0.1,::1", "-a", "tiny,fim,code",
                       "--tags", "chat,fim,small", "--tools", "all", "--ui-mcp-proxy", "--api-key", KEY) as server:
        yield server


# --------------------------------------------------------------------------- --host a,b and --tags


def test_every_address_of_host_serves(agent_server: KineticServer) -> None:
    ipv6 = agent_server.url.replace("127.0.0.1", "[::1]")
    for base in (agent_server.url, ipv6):
        assert requests.get(base + "/health", timeout=30).status_code == 200
        assert requests.post(base + "/v1/completions", json={}, timeout=30).status_code == 401
        with requests.post(base + "/v1/completions", headers=AUTH, stream=True, timeout=120,
                           json={"prompt": "Once upon a time", "max_tokens": 4, "stream": True}) as res:
            events = [line for line in res.iter_lines() if line.startswith(b"data: ")]
        assert res.status_code == 200 and events[-1] == b"data: [DONE]" and len(events) > 2
    assert f"listening on {agent_server.url}, {ipv6}" in agent_server.log()


def test_models_list_aliases_and_tags(agent_server: KineticServer) -> None:
    (model,) = requests.get(agent_server.url + "/v1/models", headers=AUTH, timeout=30).json()["data"]
    assert model["id"] == "code"  # the alphabetically first alias, as llama-server's std::set
    assert sorted(model["aliases"]) == ["code", "fim", "tiny"]
    assert model["tags"] == ["chat", "fim", "small"]


# --------------------------------------------------------------------------- CORS with --tools


@pytest.mark.parametrize("origin, allowed", [("http://localhost:8080", True), ("http://127.0.0.1:3000", True),
                                             ("http://[::1]:5173", True), ("http://evil.com", False),
                                             ("http://localhost.evil.com", False)])
def test_tools_limit_cors_to_localhost(agent_server: KineticServer, origin: str, allowed: bool) -> None:
    res = requests.options(agent_server.url + "/completions", timeout=30, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization"})
    assert res.status_code == 200
    assert res.headers.get("Access-Control-Allow-Origin") == (origin if allowed else None)
    # kinetic's deliberate difference: the requested headers are echoed (a browser never lets * cover
    # Authorization), where llama-server answers *.
    assert res.headers["Access-Control-Allow-Headers"] == "Authorization"
    assert "tools" in agent_server.log() and "localhost" in agent_server.log()


def test_without_tools_any_origin_is_allowed(live_server: KineticServer) -> None:
    res = requests.options(live_server.url + "/completions", timeout=30, headers={
        "Origin": "http://evil.com", "Access-Control-Request-Method": "POST"})
    assert res.headers["Access-Control-Allow-Origin"] == "http://evil.com"


# --------------------------------------------------------------------------- /cors-proxy


def test_cors_proxy_forwards_only_the_explicit_proxy_headers(agent_server: KineticServer, target: str) -> None:
    Target.seen.clear()
    res = requests.get(agent_server.url + "/cors-proxy", params={"url": target + "/capture?x=1"}, timeout=60,
                       headers={**AUTH, "Proxy-Authorization": "Basic secret", "X-Api-Key": KEY,
                                "Cookie": "session=secret", "Origin": "http://localhost:5173",
                                "x-llama-server-proxy-header-accept": "application/json",
                                "x-llama-server-proxy-header-authorization": "Bearer explicit"})
    assert res.status_code == 200 and res.json() == {"path": "/capture?x=1", "echo": ""}
    (seen,) = Target.seen
    headers = {k.lower(): v for k, v in seen["headers"].items()}
    assert headers["accept"] == "application/json" and headers["authorization"] == "Bearer explicit"
    assert not {"proxy-authorization", "x-api-key", "cookie", "origin"} & set(headers)
    assert not any(k.startswith("x-llama-server") for k in headers)
    assert headers["host"] == target.removeprefix("http://")
    # the target's own headers come back, except its CORS ones: this server's apply
    assert res.headers["X-Target"] == "yes"
    assert res.headers["Access-Control-Allow-Origin"] == "http://localhost:5173"


def test_cors_proxy_posts_the_body_and_keeps_the_status(agent_server: KineticServer, target: str) -> None:
    Target.seen.clear()
    with httpx.Client(timeout=60) as client:
        res = client.post(agent_server.url + "/cors-proxy", params={"url": target + "/missing"},
                          content=b'{"jsonrpc": "2.0"}',
                          headers={**AUTH, "x-llama-server-proxy-header-content-type": "application/json"})
    assert res.status_code == 404 and res.json()["echo"] == '{"jsonrpc": "2.0"}'
    assert Target.seen[0]["method"] == "POST" and Target.seen[0]["headers"]["content-type"] == "application/json"


@pytest.mark.parametrize("url, message", [
    ("ftp://127.0.0.1/x", "unsupported URL scheme"),
    ("http://user:pw@127.0.0.1/x", "authentication in target URL is not supported"),
    ("http:///nohost", "missing host"),
    ("", "missing host"),
])
def test_cors_proxy_refuses_bad_targets(agent_server: KineticServer, url: str, message: str) -> None:
    res = requests.get(agent_server.url + "/cors-proxy", params={"url": url}, headers=AUTH, timeout=30)
    assert res.status_code == 400 and message in res.json()["error"]["message"]


def test_cors_proxy_reports_an_unreachable_target(agent_server: KineticServer) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    res = requests.get(agent_server.url + "/cors-proxy", params={"url": f"http://127.0.0.1:{port}/"},
                       headers=AUTH, timeout=60)
    assert res.status_code == 500 and res.json()["error"]["message"].startswith("proxy error: ")


def test_cors_proxy_needs_the_key(agent_server: KineticServer, target: str) -> None:
    res = requests.get(agent_server.url + "/cors-proxy", params={"url": target}, timeout=30)
    assert res.status_code == 401


def test_cors_proxy_is_off_by_default(live_server: KineticServer, target: str) -> None:
    for method in ("GET", "POST"):
        res = requests.request(method, live_server.url + "/cors-proxy", params={"url": target}, timeout=30)
        assert res.status_code == 403
        assert res.json()["error"] == {"code": 403, "message": "this feature is disabled", "type": "feature_disabled"}


# --------------------------------------------------------------------------- copies of one prompt


def test_copies_of_a_prompt_in_one_request_give_one_greedy_text(model_lock: None) -> None:
    """llama.cpp's test_completion_with_tokens_input on its own server (its flags): a prompt completed
    alone leaves its cells in a slot; then `[tokens, tokens]` and `[tokens, text]` must give that same
    text twice. The second copy once started a step later, then from other cells in batches of another
    shape, and parted ways at a near tie; now copies start together from the same cells."""
    with KineticServer("-c", "512", "-b", "32", "-np", "2", "-n", "64", "-s", "42", "--temp", "0") as server:
        text = "I believe the meaning of life is"
        tokens = requests.post(server.url + "/tokenize", json={"content": text, "add_special": True},
                               timeout=30).json()["tokens"]
        alone = requests.post(server.url + "/completion", json={"prompt": tokens}, timeout=120).json()
        for prompt in ([tokens, tokens], [tokens, text]):
            both = requests.post(server.url + "/completion", json={"prompt": prompt}, timeout=120).json()
            assert [r["content"] for r in both] == [alone["content"]] * 2
            assert [r["tokens_predicted"] for r in both] == [64, 64]


# --------------------------------------------------------------------------- a unified cache outgrown


def test_slots_outgrowing_a_unified_cache_fail_in_llama_servers_words(model_lock: None) -> None:
    """llama.cpp's test_completion_unified: four slots share 256 KV cells and ask for more than that in
    all. The decode that finds no free cell fails the requests in it with llama-server's message (its
    clients match "context size has been exceeded"), the others finish, and the server goes on serving."""
    with KineticServer("-c", "256", "-np", "4", "-kvu") as server:
        def complete(n_predict: int) -> requests.Response:
            return requests.post(server.url + "/completion", json={"prompt": "A", "n_predict": n_predict}, timeout=120)

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(complete, [70, 70, 70, 70]))
        failed = [a for a in answers if a.status_code != 200]
        assert failed, "280 tokens fit in 256 cells?"
        for answer in failed:
            assert answer.status_code == 500
            assert "context size has been exceeded" in answer.json()["error"]["message"].lower()
        for answer in answers:
            if answer.status_code == 200:
                assert answer.json()["timings"]["predicted_n"] == 70
        assert complete(8).json()["timings"]["predicted_n"] == 8
        assert all(not s["is_processing"] for s in requests.get(server.url + "/slots", timeout=30).json())
