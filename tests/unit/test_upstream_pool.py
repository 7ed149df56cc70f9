"""Cache-affine routing over an upstream pool, without a model: the prompt's links, the affinity table's
choices (affine, spilled, moved, new), the members' own load figures, and draining. The pool's members
are httpx MockTransports; the real two-server pool is tests/e2e/test_upstream_pool.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from kinetic.backends.config import ModelConfig
from kinetic.backends.sources import ModelSpec, UpstreamSpec
from kinetic.backends.upstream.affinity import AffinityTable, PoolPolicy, prompt_print
from kinetic.backends.upstream.backend import UpstreamBackend
from kinetic.backends.upstream.load import from_metrics, from_slots
from kinetic.backends.upstream.pool import UpstreamPool
from kinetic.config.args import parse_serve_args
from kinetic.config.settings import ServerSettings
from kinetic.errors import UnavailableError
from kinetic.model_registry.registry import ModelRegistry
from kinetic.server.app import create_app

SYSTEM = {"role": "system", "content": "You are the lab's assistant. " * 20}
AFFINE = PoolPolicy()


def chat(*turns: str, system: bool = True) -> dict[str, Any]:
    """A chat body: user and assistant messages alternating, after the lab's system prompt."""
    messages = [SYSTEM] if system else []
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": text} for i, text in enumerate(turns)]
    return {"model": "m", "messages": messages}


def test_a_follow_up_turn_extends_the_links_of_the_one_before() -> None:
    first = prompt_print(chat("Hi"), "alice")
    second = prompt_print(chat("Hi", "Hello! How can I help?", "Explain tokens."), "alice")
    assert first is not None and second is not None
    assert second.links[:len(first.links)] == first.links and second.shared == first.shared == 1
    bob = prompt_print(chat("Hi"), "bob")
    assert bob is not None
    assert bob.links[0] == first.links[0]  # the system prompt is shared by the class
    assert bob.links[1] != first.links[1]  # the same first question is another student's conversation
    assert prompt_print({"model": "m", "input": ["a", "b"]}, "alice") is None  # embeddings: nothing to follow


def test_raw_prompts_share_their_leading_blocks() -> None:
    short = prompt_print({"prompt": "x" * 600}, "alice")
    longer = prompt_print({"prompt": "x" * 600 + "more"}, "alice")
    assert short is not None and longer is not None and len(short.links) == 3
    assert longer.links[:2] == short.links[:2] and longer.total == 604
    tokens = prompt_print({"prompt": list(range(130))}, "alice")
    assert tokens is not None and len(tokens.links) == 3


def test_a_conversation_goes_back_to_its_member_and_new_ones_spread() -> None:
    table = AffinityTable()
    idle = {0: 0, 1: 0}
    alice, bob = prompt_print(chat("Hi"), "alice"), prompt_print(chat("Hi"), "bob")
    assert alice is not None and bob is not None
    order, reason = table.route(alice, idle, AFFINE)
    assert (order, reason) == ([0, 1], "new")
    table.record(alice, 0)
    order, reason = table.route(bob, idle, AFFINE)  # equal loads: the member holding fewer conversations
    assert (order[0], reason) == (1, "new")
    table.record(bob, 1)
    follow_up = prompt_print(chat("Hi", "Hello there, I am a long answer " * 10, "Thanks"), "alice")
    assert follow_up is not None
    assert table.route(follow_up, idle, AFFINE) == ([0, 1], "affine")
    # the held part counts the answer the member generated, so a long answer keeps the share high
    holder = table.holder(follow_up)
    assert holder is not None and holder.matched > 0.9 * follow_up.total
    assert table.route(follow_up, {0: 3, 1: 0}, AFFINE) == ([0, 1], "affine")  # busy, within the bounds


def test_the_holder_over_both_bounds_spills_to_the_least_loaded() -> None:
    table = AffinityTable()
    turn = prompt_print(chat("Hi"), "alice")
    assert turn is not None
    table.record(turn, 0)
    again = prompt_print(chat("Hi", "Hello", "More"), "alice")
    assert again is not None
    assert table.route(again, {0: 65, 1: 1}, AFFINE) == ([0, 1], "affine")  # 64 over: not more than 64
    assert table.route(again, {0: 66, 1: 1}, AFFINE) == ([1, 0], "spilled")
    assert table.route(again, {0: 90, 1: 70}, AFFINE)[1] == "affine"  # 20 over: within the absolute bound
    tight = PoolPolicy(balance_abs=1, balance_rel=1.5)
    assert table.route(again, {0: 2, 1: 0}, tight) == ([1, 0], "spilled")
    assert table.route(again, {0: 3, 1: 2}, tight)[1] == "affine"  # 1.5 times 2 is 3: not over
    table.record(again, 1)  # served by member 1: the conversation has moved there
    assert table.route(prompt_print(chat("Hi", "Hello", "More", "Sure", "Go"), "alice"), {0: 0, 1: 0},
                       AFFINE) == ([1, 0], "affine")
    assert table.conversations == {0: 0, 1: 1}


def test_a_conversation_whose_member_is_gone_moves_and_stays_moved() -> None:
    table = AffinityTable()
    first = prompt_print(chat("Hi"), "alice")
    assert first is not None
    table.record(first, 0)
    second = prompt_print(chat("Hi", "Hello", "Again"), "alice")
    assert second is not None
    order, reason = table.route(second, {1: 0}, AFFINE)  # member 0 out of rotation (down or drained)
    assert (order, reason) == ([1], "moved")
    table.record(second, 1)
    third = prompt_print(chat("Hi", "Hello", "Again", "Yes", "Once more"), "alice")
    assert table.route(third, {0: 0, 1: 0}, AFFINE) == ([1, 0], "affine")  # member 0 back: it stays on 1
    table.forget(1)  # member 1 went down: what it held is gone
    assert table.holder(third) is None and table.conversations[1] == 0


def test_a_prompt_mostly_new_is_placed_by_load() -> None:
    table = AffinityTable()
    first = prompt_print(chat("Hi", system=False), "alice")
    assert first is not None
    table.record(first, 0)
    pasted = prompt_print(chat("Hi", "Yo", "x" * 5000, system=False), "alice")  # a whole file pasted in
    assert table.route(pasted, {0: 1, 1: 0}, AFFINE) == ([1, 0], "new")


def test_least_outstanding_looks_at_load_alone() -> None:
    table = AffinityTable()
    turn = prompt_print(chat("Hi"), "alice")
    assert turn is not None
    table.record(turn, 0)
    policy = PoolPolicy(policy="least-outstanding")
    assert table.route(prompt_print(chat("Hi", "Hey", "So"), "alice"), {0: 1, 1: 0}, policy) == \
        ([1, 0], "least-loaded")


def test_the_shared_prefix_breaks_a_tie() -> None:
    table = AffinityTable()
    alice, bob, carol = (prompt_print(chat("Hi"), name) for name in ("alice", "bob", "carol"))
    assert alice is not None and bob is not None and carol is not None
    table.record(alice, 2)
    table.record(bob, 1)
    other_lab = prompt_print({"model": "m", "messages": [{"role": "system", "content": "Another lab."},
                                                          {"role": "user", "content": "Hi"}]}, "dave")
    assert other_lab is not None
    table.record(other_lab, 0)
    # members 1 and 2 hold one conversation each and the lab's prompt; member 0 one, but not that prompt
    assert table.route(carol, {0: 0, 1: 0, 2: 0}, AFFINE)[0] == [1, 2, 0]
    assert table.shared_match(carol, 0) == 0 and table.shared_match(carol, 2) == carol.ends[0]


def test_old_conversations_stop_counting_and_the_table_is_bounded() -> None:
    table = AffinityTable(max_links=4, idle_s=10)
    for index in range(3):
        turn = prompt_print(chat(f"question {index}"), f"student{index}")
        assert turn is not None
        table.record(turn, index % 2, now=float(index))
    assert sum(table.conversations.values()) == 3
    late = prompt_print(chat("late"), "late")
    assert late is not None
    table.record(late, 0, now=100.0)
    assert dict(table.conversations) == {0: 1, 1: 0}
    assert len(table._held) <= 4


LLAMA_METRICS = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
llamacpp:prompt_tokens_total 1200
"""
VLLM_METRICS = """vllm:num_requests_running{model_name="Qwen/Qwen3-8B"} 4.0
vllm:num_requests_waiting{model_name="Qwen/Qwen3-8B"} 1.0
"""


def test_load_is_read_from_metrics_or_slots() -> None:
    llama = from_metrics(LLAMA_METRICS)
    assert llama is not None and (llama.processing, llama.deferred, llama.busy) == (2, 3, 5)
    vllm = from_metrics(VLLM_METRICS)
    assert vllm is not None and (vllm.processing, vllm.deferred) == (4, 1)
    assert from_metrics("process_cpu_seconds_total 3\n") is None
    slots = from_slots(json.dumps([{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}]).encode())
    assert slots is not None and (slots.processing, slots.slots, slots.source) == (1, 2, "slots")
    assert from_slots(b'{"error": "no"}') is None and from_slots(b"<html>") is None


def members_answering(metrics: dict[str, str | None]) -> httpx.MockTransport:
    """Members by host: `metrics[host]` is its /metrics text (None: 501 there, then /slots answers)."""

    def handler(request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": []})
        if path == "/metrics":
            text = metrics[host]
            return httpx.Response(501) if text is None else httpx.Response(200, text=text)
        if path == "/slots":
            return httpx.Response(200, json=[{"id": 0, "is_processing": False}])
        body = json.loads(request.content)
        return httpx.Response(200, json={"choices": [], "served_by": host, "n": len(body["messages"])})

    return httpx.MockTransport(handler)


def pool_of(hosts: tuple[str, ...], transport: httpx.MockTransport, policy: PoolPolicy = AFFINE) -> UpstreamPool:
    pool = UpstreamPool("m", tuple(UpstreamSpec(url=f"http://{h}:8000/v1") for h in hosts), policy)
    pool._client = httpx.AsyncClient(transport=transport)
    return pool


async def served_by(pool: UpstreamPool, body: dict[str, Any], client: str) -> str:
    member, response = await pool.open("/chat/completions", body, client=client)
    await pool.done(member, response)
    return member.spec.url


def test_a_members_own_load_steers_new_conversations_away() -> None:
    async def run() -> None:
        pool = pool_of(("a", "b"), members_answering({"a": LLAMA_METRICS, "b": None}))
        await pool.check_now()
        a, b = pool.members
        assert a.reading is not None and a.reading.source == "metrics" and a.foreign == 5
        assert b.reading is not None and b.reading.source == "slots" and b.foreign == 0
        assert await served_by(pool, chat("Hi"), "alice") == "http://b:8000/v1"  # a is busy with others' work
        status = pool.statuses()[0]
        assert status["load"] == 5 and status["reported"] == {"processing": 2, "deferred": 3, "slots": None,
                                                               "source": "metrics"}
        await pool.close()

    asyncio.run(run())


def test_a_drained_member_takes_nothing_new_and_its_running_requests_finish() -> None:
    async def run() -> None:
        pool = pool_of(("a", "b"), members_answering({"a": None, "b": None}))
        await pool.check_now()
        a, b = pool.members
        assert await served_by(pool, chat("Hi"), "alice") == a.spec.url
        running, response = await pool.open("/chat/completions", chat("Hi", "Hello", "Go on"), client="alice")
        assert running is a and a.outstanding == 1  # the conversation's member, still answering
        waiter = asyncio.get_running_loop().create_task(pool.drain(a, wait_s=5))
        await asyncio.sleep(0.1)
        assert not waiter.done() and a.state == "draining"
        assert await served_by(pool, chat("Hi", "Hello", "Go on", "Ok", "More"), "alice") == b.spec.url
        await pool.done(running, response)
        await asyncio.wait_for(waiter, 1)
        assert a.outstanding == 0 and pool.routed["moved"] == 1
        await pool.undrain(a)
        assert a.state == "ready"
        # the conversation moved to b and stays there; a new one goes to a, which holds none now
        assert await served_by(pool, chat("Hi", "Hello", "Go on", "Ok", "More", "K", "End"), "alice") == b.spec.url
        assert await served_by(pool, chat("Hi"), "bob") == a.spec.url
        await pool.drain(b)
        await pool.drain(a)
        with pytest.raises(UnavailableError, match=r"model 'm' is reachable \(2 of its 2 servers drained\)"):
            await pool.open("/chat/completions", chat("Hi"), client="carol")
        await pool.close()

    asyncio.run(run())


def test_members_are_found_by_the_url_as_given_or_shown() -> None:
    pool = pool_of(("a", "b"), members_answering({}))
    assert pool.find("http://b:8000") is pool.members[1]
    assert pool.find("http://b:8000/v1/") is pool.members[1]
    assert pool.find("http://c:8000") is None


def test_the_policy_flags_reach_the_pool_with_vllm_routers_defaults() -> None:
    assert ModelConfig().pool == PoolPolicy(policy="cache-aware", cache_threshold=0.3, balance_abs=64,
                                            balance_rel=1.5, probe_interval_s=10.0)
    settings = parse_serve_args(["--upstream", "m=http://a:1", "--upstream-policy", "least-outstanding",
                                 "--upstream-cache-threshold", "0.5", "--upstream-balance-abs-threshold", "8",
                                 "--upstream-balance-rel-threshold", "2", "--upstream-probe-interval", "0.5"],
                                environ={})
    from kinetic.model_registry.factory import model_config

    assert model_config(settings).pool == PoolPolicy("least-outstanding", 0.5, 8, 2.0, 0.5)


def drain_app() -> TestClient:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": []})

    def factory(spec: ModelSpec, lock: object) -> UpstreamBackend:
        backend = UpstreamBackend(spec, ModelConfig())
        backend.pool._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        return backend

    spec = ModelSpec(name="remote", upstreams=(UpstreamSpec(url="http://a:8000/v1"), UpstreamSpec(url="http://b:1/v1")))
    return TestClient(create_app(ModelRegistry(ServerSettings(), [spec], factory, router=True)))


def test_the_drain_routes_name_what_is_wrong() -> None:
    with drain_app() as client:
        client.post("/models/load", json={"model": "remote"})
        drained = client.post("/models/drain", json={"model": "remote", "upstream": "http://a:8000"})
        assert drained.status_code == 200 and drained.json()["upstream"]["state"] == "draining"
        rows = client.get("/v1/models").json()["data"][0]["status"]["upstreams"]
        assert [row["state"] for row in rows] == ["draining", "ready"]
        unknown = client.post("/models/drain", json={"model": "remote", "upstream": "http://c:1"})
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "upstream"
        assert "http://a:8000/v1, http://b:1/v1" in unknown.json()["error"]["message"]
        missing = client.post("/models/drain", json={"model": "nope", "upstream": "http://a:8000"})
        assert missing.status_code == 400 and missing.json()["error"]["message"] == "model is not found"
        back = client.post("/models/undrain", json={"model": "remote", "upstream": "http://a:8000/v1"})
        assert back.json()["upstream"]["state"] == "ready"
        assert client.post("/models/drain", json={"model": "remote"}).status_code == 400  # no upstream named
