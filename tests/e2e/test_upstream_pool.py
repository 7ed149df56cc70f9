"""A cache-affine pool of two real upstream `kinetic serve -t 1` processes behind a keyed router.

Two models at once is the exception to "one model at a time": with one thread each they share the two
cores, and the module holds the model lock throughout. Which server answered is read from the admin's
/v1/models (each server's `served`), so requests go one after another unless a test says otherwise.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server import KineticServer, wait_until

ADMIN = {"Authorization": "Bearer sk-teacher"}
STUDENTS = ("alice", "bob", "carol", "dave", "eve")
SYSTEM = {"role": "system", "content": "You are the teaching assistant of the lab on local language models. "
          "Answer in one short sentence, name the tool the student should use, and never write code. " * 3}
UPSTREAM_ARGS = ("-t", "1", "-c", "4096", "-np", "3", "-a", "gemma-up")


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer sk-{name}"}


@pytest.fixture(scope="module")
def servers(model_lock: None) -> Iterator[list[KineticServer]]:
    """The pool's two servers, started one after the other; the first reports its load at /metrics,
    the second at /slots only."""
    first = KineticServer(*UPSTREAM_ARGS, "--metrics").start()
    try:
        second = KineticServer(*UPSTREAM_ARGS).start()
    except BaseException:
        first.stop()
        raise
    yield [first, second]
    first.stop()
    second.stop()


@pytest.fixture(scope="module")
def router(servers: list[KineticServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[KineticServer]:
    keys = tmp_path_factory.mktemp("pool") / "keys.txt"
    keys.write_text("".join(f"sk-{name} {name}\n" for name in STUDENTS), encoding="utf-8")
    # a tight absolute bound so that two requests over the other server spill a conversation; probes
    # twice a second so the test sees a server's own load without waiting ten seconds
    with KineticServer("--api-key-file", str(keys), "--admin-key", "sk-teacher", "-np", "4",
                       *(arg for s in servers for arg in ("--upstream", f"class={s.url},model=gemma-up")),
                       "--upstream-balance-abs-threshold", "1", "--upstream-probe-interval", "0.5") as server:
        yield server


def members(router: KineticServer, headers: dict[str, str] = ADMIN) -> list[dict[str, Any]]:
    rows = httpx.get(router.url + "/v1/models", headers=headers, timeout=30).json()["data"]
    return next(row for row in rows if row["id"] == "class")["status"].get("upstreams", [])


def member_of(router: KineticServer, server: KineticServer) -> dict[str, Any]:
    return next(m for m in members(router) if m["url"] == server.url + "/v1")


class Chat:
    """One student's conversation: each turn sends the whole history, as every chat client does."""

    def __init__(self, router: KineticServer, name: str):
        self.router, self.name = router, name
        self.messages: list[dict[str, Any]] = [SYSTEM]
        self.prompt_tokens: list[int] = []

    def turn(self, question: str, max_tokens: int = 6) -> tuple[str, dict[str, Any]]:
        """Asks, and says which server answered (by its URL) and the answer's timings."""
        before = {m["url"]: m["served"] for m in members(self.router)}
        self.messages.append({"role": "user", "content": question})
        reply = httpx.post(self.router.url + "/v1/chat/completions", headers=auth(self.name), timeout=120, json={
            "model": "class", "messages": self.messages, "max_tokens": max_tokens, "temperature": 0})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        self.messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
        self.prompt_tokens.append(body["usage"]["prompt_tokens"])
        after = {m["url"]: m["served"] for m in members(self.router)}
        # the pool is listed once its model is loaded: before the first request it may not be yet
        served = [url for url in after if after[url] != before.get(url, 0)]
        assert len(served) == 1, (before, after)
        return served[0], body["timings"]


def test_a_conversation_stays_on_its_server_and_reads_its_cache(router: KineticServer) -> None:
    alice, bob = Chat(router, "alice"), Chat(router, "bob")
    alice_server, _ = alice.turn("Which tool runs a model on a laptop?")
    bob_server, _ = bob.turn("Which tool runs a model on a laptop?")
    assert alice_server != bob_server  # new conversations spread: the same question, two students
    for question in ("And how do I give it a key?", "Where do I see my requests?"):
        for chat, server in ((alice, alice_server), (bob, bob_server)):
            answered_by, timings = chat.turn(question)
            assert answered_by == server
            # the server evaluated only the new turn: the whole prompt before it came from its cache
            assert timings["cache_n"] >= chat.prompt_tokens[-2], (timings, chat.prompt_tokens)
    view = members(router)
    assert [m["state"] for m in view] == ["ready", "ready"]
    assert all(m["affine"] == 2 and m["conversations"] >= 1 and m["cache_hit_rate"] > 0.5 for m in view), view
    assert view[0]["reported"]["source"] == "metrics" and view[1]["reported"]["source"] == "slots"
    assert members(router, auth("alice")) == []  # the servers' addresses and load are the admin's
    stats = httpx.get(router.url + "/dashboard/stats", headers=ADMIN, timeout=30).json()
    shown = ("url", "state", "load", "served", "affine", "cache_hit_rate")  # the dashboard's columns
    assert [(u["model"], *(u[f] for f in shown)) for u in stats["upstreams"]] == \
        [("class", *(m[f] for f in shown)) for m in view]


def stream_directly(server: KineticServer, done: list[int]) -> threading.Thread:
    """A long answer asked of the server itself, not through the router: load kinetic did not send."""

    def run() -> None:
        with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": "Tell a story."}], "max_tokens": 96, "ignore_eos": True,
                "stream": True}) as response:
            done.append(sum(1 for line in response.iter_lines() if line.startswith("data: ")))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_conversation_spills_over_when_its_server_is_loaded_by_others(router: KineticServer,
                                                                        servers: list[KineticServer]) -> None:
    carol = Chat(router, "carol")
    first, _ = carol.turn("What is a token?")
    holder = next(s for s in servers if s.url + "/v1" == first)
    other = next(s for s in servers if s is not holder)
    done: list[int] = []
    threads = [stream_directly(holder, done) for _ in range(2)]
    try:
        wait_until(lambda: member_of(router, holder)["load"] >= 2, "the router reads the server's own load", 30)
        spilled, timings = carol.turn("And a context window?")
        assert spilled == other.url + "/v1"
        assert timings["cache_n"] < carol.prompt_tokens[-2]  # the other server had to read the history
    finally:
        for thread in threads:
            thread.join()
    assert len(done) == 2 and all(count > 1 for count in done)
    wait_until(lambda: member_of(router, holder)["load"] == 0, "the server's load is read back to 0", 30)
    stays, timings = carol.turn("Thanks, and a slot?")
    assert stays == spilled and timings["cache_n"] >= carol.prompt_tokens[-2]  # it moved, and stays moved


def test_a_conversation_follows_a_fail_over_and_keeps_its_new_server(router: KineticServer,
                                                                      servers: list[KineticServer]) -> None:
    dave = Chat(router, "dave")
    first, _ = dave.turn("How do I stop the server?")
    gone = next(s for s in servers if s.url + "/v1" == first)
    gone.stop()
    moved, _ = dave.turn("And start it again?")  # refused before the first byte: tried on the other
    assert moved != first
    assert member_of(router, gone)["state"] == "down"
    gone.start()  # back on the same address
    wait_until(lambda: member_of(router, gone)["state"] == "ready", "the restarted server back in rotation", 30)
    stays, timings = dave.turn("Does my history survive?")
    assert stays == moved and timings["cache_n"] >= dave.prompt_tokens[-2]
    eve = Chat(router, "eve")
    fresh, _ = eve.turn("How do I stop the server?")
    assert fresh == first  # the restarted server holds no conversation now: the new one goes there


def test_a_drained_server_finishes_its_stream_takes_nothing_new_and_comes_back(router: KineticServer) -> None:
    alice = Chat(router, "alice")
    home, _ = alice.turn("Which model is served?")
    lines: list[str] = []
    opened = threading.Event()

    def long_answer() -> None:
        with httpx.stream("POST", router.url + "/v1/chat/completions", headers=auth("alice"), timeout=120, json={
                "model": "class", "messages": alice.messages + [{"role": "user", "content": "Tell a story."}],
                "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True}}) as response:
            for line in response.iter_lines():
                if line:
                    lines.append(line)
                    opened.set()

    thread = threading.Thread(target=long_answer)
    thread.start()
    try:
        assert opened.wait(60)
        refused = httpx.post(router.url + "/models/drain", headers=auth("bob"), timeout=30,
                             json={"model": "class", "upstream": home})
        assert refused.status_code == 403
        drained = httpx.post(router.url + "/models/drain", headers=ADMIN, timeout=30,
                             json={"model": "class", "upstream": home}).json()
        assert drained["success"] and drained["upstream"]["state"] == "draining"
        assert drained["upstream"]["outstanding"] == 1  # the story is still being told there
        elsewhere, _ = Chat(router, "bob").turn("Is the server still up?")
        assert elsewhere != home
        waited = httpx.post(router.url + "/models/drain", headers=ADMIN, timeout=120,
                            json={"model": "class", "upstream": home, "wait": True}).json()
        assert waited["upstream"]["outstanding"] == 0
    finally:
        thread.join()
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert lines[-1] == "data: [DONE]" and not any("error" in chunk for chunk in chunks)  # ended whole
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish in (["length"], ["stop"]) and chunks[-1]["usage"]["completion_tokens"] >= 1
    back = httpx.post(router.url + "/models/undrain", headers=ADMIN, timeout=30,
                      json={"model": "class", "upstream": home}).json()
    assert back["upstream"]["state"] == "ready"
    returned, timings = alice.turn("Which model was that again?")
    assert returned == home and timings["cache_n"] >= alice.prompt_tokens[-2]  # its cache was kept meanwhile
