"""The instructor's limits per key (the key file's fields) on one keyed server, `-np 1 --max-queue 2`:
a token budget that runs out (429 in each protocol's envelope, `x-ratelimit-*` headers), lesson hours
and dates (403), a list of models (404, and the lists show only those), the admin served first while
students wait, the waiting line's cap (503 with Retry-After, every count back to zero), a SIGHUP that
changes a key's limits, and a restart that reads the usage back from the ledger."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.server import KineticServer, wait_until

pytestmark = pytest.mark.e2e

ADMIN = "sk-teacher-limits"
ALIAS = "kinetic-limits"
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
TOMORROW = DAYS[(datetime.now().weekday() + 1) % 7]  # lesson hours that are surely not now


def key_file(hal_tokens: int) -> str:
    return (f"sk-ann ann tokens=40/day\n"
            f"sk-ben ben models=another-model\n"
            f"sk-cam cam hours={TOMORROW}@00:00-23:59\n"
            f"sk-dan dan until=2020-01-01\n"
            f"* tokens=1000000/week\n"
            f"sk-fay fay\n"
            f"sk-hal hal tokens={hal_tokens}/day\n")


class Servers:
    """The module's server, which the restart test replaces by a new one on the same files."""

    def __init__(self, tmp: Path):
        self.keys = tmp / "keys.txt"
        self.ledger = tmp / "ledger.jsonl"
        self.keys.write_text(key_file(hal_tokens=1), encoding="utf-8")
        self.server = self.new()

    def new(self) -> KineticServer:
        return KineticServer("-c", "2048", "-np", "1", "-a", ALIAS, "--api-key-file", str(self.keys),
                             "--admin-key", ADMIN, "--ledger", str(self.ledger), "--max-queue", "2",
                             "--max-in-flight", "0", "--metrics").start()


@pytest.fixture(scope="module")
def servers(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    held = Servers(tmp_path_factory.mktemp("limits"))
    yield held
    held.server.stop()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(url: str, key: str, max_tokens: int = 4, **extra: Any) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers=auth(key), timeout=120,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, **extra})


def me(url: str, key: str) -> dict[str, Any]:
    answer = httpx.get(url + "/v1/me", headers=auth(key), timeout=10)
    assert answer.status_code == 200
    return answer.json()


def test_a_budget_runs_out_with_a_429_in_every_protocol_that_says_when_it_resets(servers: Servers) -> None:
    url = servers.server.url
    first = chat(url, "sk-ann")
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-tokens"] == "40" and first.headers["x-ratelimit-remaining-tokens"] == "40"
    spent = first.json()["usage"]["total_tokens"]
    while (answer := chat(url, "sk-ann")).status_code == 200:
        spent += answer.json()["usage"]["total_tokens"]
    assert answer.status_code == 429 and spent >= 40
    assert answer.headers["x-ratelimit-remaining-tokens"] == "0" and int(answer.headers["retry-after"]) > 0
    assert answer.headers["x-ratelimit-reset-tokens"].endswith("s")

    with pytest.raises(openai.RateLimitError) as oa:
        openai.OpenAI(base_url=url + "/v1", api_key="sk-ann", max_retries=0).chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert f"token budget used up: {spent} of 40 tokens this day; it resets at" in str(oa.value)
    with pytest.raises(anthropic.RateLimitError) as an:
        anthropic.Anthropic(base_url=url, api_key="sk-ann", max_retries=0).messages.create(
            model=ALIAS, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert an.value.body["type"] == "error" and "token budget used up" in an.value.body["error"]["message"]
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=url, headers=auth("sk-ann")).chat(model=ALIAS, messages=[{"role": "user", "content": "hi"}])
    assert ol.value.status_code == 429 and "token budget used up" in ol.value.error
    native = httpx.post(url + "/completion", headers=auth("sk-ann"), json={"prompt": "hi", "n_predict": 2})
    assert native.status_code == 429 and native.json()["error"]["type"] == "rate_limit_error"
    assert httpx.post(url + "/tokenize", headers=auth("sk-ann"), json={"content": "hi"}).status_code == 200

    standing = me(url, "sk-ann")
    assert standing["name"] == "ann" and standing["role"] == "student"
    assert standing["budget"]["used"] == spent and standing["budget"]["left"] == 0
    assert standing["budget"]["period"] == "day" and standing["limits"]["tokens"] == 40
    recent = standing["recent"]
    assert recent[0]["route"] == "/tokenize" and [r["status"] for r in recent[1:5]] == [429, 429, 429, 429]
    assert all(r.get("route") != "/v1/me" for r in recent)
    assert me(url, "sk-fay")["recent"] == []  # never another key's


def test_outside_its_hours_or_dates_a_key_gets_a_403_saying_when_it_opens(servers: Servers) -> None:
    url = servers.server.url
    with pytest.raises(openai.PermissionDeniedError) as oa:
        openai.OpenAI(base_url=url + "/v1", api_key="sk-cam", max_retries=0).models.list()
    assert f"outside this key's lesson hours ({TOMORROW}@00:00-23:59); they open again at" in str(oa.value)
    with pytest.raises(anthropic.PermissionDeniedError) as an:
        anthropic.Anthropic(base_url=url, api_key="sk-cam", max_retries=0).messages.create(
            model=ALIAS, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert "lesson hours" in an.value.body["error"]["message"]
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=url, headers=auth("sk-dan")).generate(model=ALIAS, prompt="hi")
    assert ol.value.status_code == 403 and ol.value.error == "this key was valid until 2020-01-01"
    assert "lesson hours" in me(url, "sk-cam")["refused"]  # its standing still answers, saying why


def test_a_key_sees_and_uses_only_its_models(servers: Servers) -> None:
    url = servers.server.url
    assert httpx.get(url + "/v1/models", headers=auth("sk-ben")).json()["data"] == []
    assert httpx.get(url + "/api/tags", headers=auth("sk-ben")).json()["models"] == []
    assert [m["id"] for m in httpx.get(url + "/v1/models", headers=auth("sk-fay")).json()["data"]] == [ALIAS]
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=url + "/v1", api_key="sk-ben", max_retries=0).chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=url, headers=auth("sk-ben")).chat(model=ALIAS, messages=[{"role": "user", "content": "hi"}])
    assert ol.value.status_code == 404
    assert me(url, "sk-ben")["limits"]["models"] == ["another-model"]


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", headers=auth(ADMIN), timeout=10).text
    # a label value may hold spaces (kinetic:device_info{description="..."}): the value is after the last one
    samples = (line.rpartition(" ") for line in text.splitlines() if line and line[0] != "#")
    return {name: float(value) for name, _, value in samples}


def queue(url: str) -> dict[str, Any]:
    return httpx.get(url + "/dashboard/stats", headers=auth(ADMIN), timeout=10).json()["queue"]


def test_the_admin_waiting_behind_students_is_served_first(servers: Servers) -> None:
    url = servers.server.url
    finished: dict[str, float] = {}

    def ask(name: str, key: str, n: int) -> None:
        body = {"prompt": "Once", "n_predict": n, "ignore_eos": True}
        assert httpx.post(url + "/completion", headers=auth(key), json=body, timeout=120).status_code == 200
        finished[name] = time.monotonic()

    holder = threading.Thread(target=ask, args=("holder", "sk-fay", 48))
    holder.start()
    wait_until(lambda: queue(url)["processing"] == 1, "the slot is taken")
    student = threading.Thread(target=ask, args=("student", "sk-fay", 4))
    student.start()
    wait_until(lambda: queue(url)["deferred"] == 1, "a student waits")
    admin = threading.Thread(target=ask, args=("admin", ADMIN, 4))
    admin.start()
    wait_until(lambda: queue(url)["deferred"] == 2, "the admin waits behind the student")
    for thread in (holder, student, admin):
        thread.join(timeout=120)
    assert finished["admin"] < finished["student"]


def test_past_the_queue_cap_a_503_with_retry_after_at_once_and_no_count_leaks(servers: Servers) -> None:
    url = servers.server.url

    async def flood() -> list[tuple[int, float, httpx.Headers, dict[str, Any]]]:
        async with httpx.AsyncClient(timeout=120) as client:
            async def one() -> tuple[int, float, httpx.Headers, dict[str, Any]]:
                started = time.monotonic()
                answer = await client.post(url + "/v1/chat/completions", headers=auth("sk-fay"), json={
                    "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True})
                return answer.status_code, time.monotonic() - started, answer.headers, \
                    (answer.json() if answer.status_code != 200 else {})
            return await asyncio.gather(*[one() for _ in range(8)])

    started = time.monotonic()
    answers = asyncio.run(asyncio.wait_for(flood(), 120))
    assert time.monotonic() - started < 60  # bounded: nobody waits without end
    refused = [a for a in answers if a[0] == 503]
    served = [a for a in answers if a[0] == 200]
    assert len(refused) + len(served) == 8 and len(served) >= 3 and refused  # 1 running + 2 waiting at most
    for _, elapsed, headers, body in refused:
        assert int(headers["retry-after"]) >= 1 and elapsed < 5  # at once, not after a wait
        assert "--max-queue" in body["error"]["message"] and body["error"]["type"] == "unavailable_error"
    wait_until(lambda: queue(url)["processing"] == 0 and queue(url)["deferred"] == 0, "the line empties")
    numbers = metrics(url)
    assert numbers["llamacpp:requests_processing"] == 0 and numbers["llamacpp:requests_deferred"] == 0
    slots = httpx.get(url + "/slots", headers=auth(ADMIN), timeout=10).json()
    assert not any(slot["is_processing"] for slot in slots)
    assert queue(url)["deferred_by_key"] == {} and queue(url)["max_queue"] == 2


@pytest.mark.skipif(sys.platform == "win32", reason="Windows has no SIGHUP; a restart rereads the key file")
def test_sighup_changes_a_keys_limits_and_keeps_its_usage(servers: Servers) -> None:
    url = servers.server.url
    assert chat(url, "sk-hal").status_code == 200  # under its one token at the start
    assert chat(url, "sk-hal").status_code == 429
    used = me(url, "sk-hal")["budget"]["used"]
    servers.keys.write_text(key_file(hal_tokens=100000), encoding="utf-8")
    assert servers.server.proc is not None
    servers.server.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: me(url, "sk-hal")["limits"]["tokens"] == 100000, "the new limit", timeout=10)
    assert me(url, "sk-hal")["budget"]["used"] == used
    assert chat(url, "sk-hal").status_code == 200


def test_a_restart_reads_the_usage_back_from_the_ledger(servers: Servers) -> None:
    before = me(servers.server.url, "sk-ann")["budget"]
    ledger_lines = [json.loads(line) for line in servers.ledger.read_text().splitlines()]
    assert any(line["client"] == "ann" and line["status"] == 429 for line in ledger_lines)
    servers.server.stop()
    servers.server = servers.new()
    url = servers.server.url
    after = me(url, "sk-ann")
    assert after["budget"]["used"] == before["used"] and after["budget"]["left"] == 0
    assert chat(url, "sk-ann").status_code == 429
    assert [r["route"] for r in after["recent"]][:1] == ["/tokenize"]  # its last requests come back too
    assert datetime.fromisoformat(after["budget"]["resets_at"]) - datetime.now().astimezone() <= timedelta(days=1)
