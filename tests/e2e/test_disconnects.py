"""Clients that leave: a non-streamed generation stops and frees its slot; a queued request is
dropped before it ever takes one. The live server has two slots (-np 2) and --metrics."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlparse

import httpx

from tests.server import wait_until

LONG = 1900  # tokens: a minute or more of generation, far longer than any step below
CHAT = "/v1/chat/completions"



def metric(base_url: str, name: str) -> float:
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def slots(base_url: str) -> list[dict]:
    return httpx.get(base_url + "/slots").json()


def busy(base_url: str) -> int:
    return sum(1 for slot in slots(base_url) if slot["is_processing"])


def open_chat(base_url: str, content: str, *, stream: bool) -> socket.socket:
    """Sends a long, EOS-ignoring chat on a raw socket and returns it unread: closing it is leaving."""
    body = json.dumps({"messages": [{"role": "user", "content": content}], "max_tokens": LONG,
                       "ignore_eos": True, "stream": stream}).encode()
    parsed = urlparse(base_url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=30)
    sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def test_a_non_streaming_client_that_leaves_frees_its_slot(base_url: str) -> None:
    wait_until(lambda: busy(base_url) == 0, "slots idle before the test")
    predicted_before = metric(base_url, "tokens_predicted_total")
    sock = open_chat(base_url, "Tell me a long story", stream=False)
    try:
        wait_until(lambda: busy(base_url) == 1, "the generation takes a slot")
    finally:
        sock.close()
    wait_until(lambda: busy(base_url) == 0, "the slot is freed")
    # A generation that ran to the end would have added its LONG tokens; a cancelled one adds none.
    assert metric(base_url, "tokens_predicted_total") - predicted_before < LONG


def test_a_queued_request_whose_client_left_never_takes_a_slot(base_url: str) -> None:
    wait_until(lambda: busy(base_url) == 0, "slots idle before the test")
    holders = [open_chat(base_url, "First", stream=True), open_chat(base_url, "Second", stream=True)]
    try:
        wait_until(lambda: busy(base_url) == 2, "both slots generating")
        queued = open_chat(base_url, "A much longer question " * 40, stream=False)  # 200+ prompt tokens
        wait_until(lambda: metric(base_url, "requests_deferred") == 1, "the third request waits in the queue")
        queued.close()
        wait_until(lambda: metric(base_url, "requests_deferred") == 0, "the left request leaves the queue")
        assert metric(base_url, "requests_processing") == 2  # while both slots are still taken
    finally:
        for sock in holders:
            sock.close()
    wait_until(lambda: busy(base_url) == 0, "the streams' slots are freed")
    # Each slot's last prompt is one of the two short ones: the long queued prompt never ran.
    prompts = [slot["n_prompt_tokens"] for slot in slots(base_url)]
    assert all(n < 50 for n in prompts), prompts
