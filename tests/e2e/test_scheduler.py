"""The scheduler on the real model: fair turns between keys, the prompt budget shared between slots,
per-key limits, prefixes copied between slots, and batching that changes no answer.

Every assertion is about order or equality, never about time.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server import KineticServer, wait_until

pytestmark = pytest.mark.e2e

# A long, fixed prompt: what a class shares (a system prompt), about 600 tokens on Gemma.
SHARED = ("You are the teaching assistant of a course on serving language models locally. " * 40).strip()


def metrics(url: str, headers: dict[str, str] | None = None) -> dict[str, float]:
    values = {}
    for line in httpx.get(url + "/metrics", headers=headers).text.splitlines():
        if line.startswith("llamacpp:") and "{" not in line:
            name, value = line.split()
            values[name.removeprefix("llamacpp:")] = float(value)
    return values



def complete(url: str, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    r = httpx.post(url + "/completion", json=body, headers=headers, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


# ------------------------------------------------------------------------------ fair share


@pytest.fixture(scope="module")
def one_slot_two_keys(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer("-c", "2048", "-np", "1", "--api-key", "ka,kb", "--metrics", "--max-in-flight", "0") as server:
        yield server


def test_a_second_key_is_served_before_the_first_keys_backlog(one_slot_two_keys: KineticServer) -> None:
    url = one_slot_two_keys.url
    auth = {"Authorization": "Bearer ka"}
    finished: list[str] = []
    lock = threading.Lock()

    def run(name: str, key: str, n_predict: int) -> None:
        complete(url, {"prompt": f"Request {name}:", "n_predict": n_predict, "ignore_eos": True}, key)
        with lock:
            finished.append(name)

    threads = [threading.Thread(target=run, args=("a0", "ka", 200))]
    threads[0].start()
    wait_until(lambda: metrics(url, auth)["requests_processing"] == 1, "a0 to take the slot")
    for i in range(1, 10):
        threads.append(threading.Thread(target=run, args=(f"a{i}", "ka", 4)))
        threads[-1].start()
    wait_until(lambda: metrics(url, auth)["requests_deferred"] == 9, "key A's backlog to queue")
    with lock:
        done_before_b = len(finished)
    threads.append(threading.Thread(target=run, args=("b1", "kb", 4)))
    threads[-1].start()
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(finished) == sorted(["b1"] + [f"a{i}" for i in range(10)])
    # B waited only for the request running when it arrived, not for A's nine queued ones.
    assert finished.index("b1") == done_before_b + 1, finished


def test_the_queue_per_key_shows_in_metrics(one_slot_two_keys: KineticServer) -> None:
    url = one_slot_two_keys.url
    auth = {"Authorization": "Bearer ka"}
    threads = [threading.Thread(target=complete, args=(url, {"prompt": "x", "n_predict": 120, "ignore_eos": True},
                                                       "ka"))]
    threads[0].start()
    wait_until(lambda: metrics(url, auth)["requests_processing"] == 1, "the slot to be taken")
    for key in ("ka", "ka", "kb"):
        threads.append(threading.Thread(target=complete, args=(url, {"prompt": "y", "n_predict": 2}, key)))
        threads[-1].start()
    wait_until(lambda: metrics(url, auth)["requests_deferred"] == 3, "three to wait")
    text = httpx.get(url + "/metrics", headers=auth).text
    assert 'llamacpp:requests_deferred_by_key{key="key-1"} 2' in text
    assert 'llamacpp:requests_deferred_by_key{key="key-2"} 1' in text
    assert "ka" not in text and "kb" not in text  # names, never keys
    slots = httpx.get(url + "/slots", headers=auth).json()
    assert slots[0]["is_processing"] and slots[0]["key"] == "key-1"
    for thread in threads:
        thread.join(timeout=300)


def test_more_requests_in_flight_than_allowed_get_429(model_lock: None) -> None:
    with KineticServer("-c", "2048", "-np", "1", "--api-key", "ka,kb", "--metrics", "--max-in-flight", "2") as server:
        url = server.url
        body = {"prompt": "x", "n_predict": 64, "ignore_eos": True}  # both in flight while the third is refused
        threads = [threading.Thread(target=complete, args=(url, body, "ka")) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_until(lambda: metrics(url, {"Authorization": "Bearer kb"})["requests_deferred"] == 1, "two in flight")
        third = httpx.post(url + "/v1/chat/completions", headers={"Authorization": "Bearer ka"},
                           json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert third.status_code == 429 and third.headers["retry-after"] == "1"
        assert third.json()["error"]["type"] == "rate_limit_error"
        anthropic_third = httpx.post(url + "/v1/messages", headers={"x-api-key": "ka"},
                                     json={"model": "m", "max_tokens": 2,
                                           "messages": [{"role": "user", "content": "hi"}]})
        assert anthropic_third.status_code == 429
        message = anthropic_third.json()["error"]["message"]
        assert anthropic_third.json() == {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
        # another key is not limited by the first one's requests
        other = httpx.post(url + "/completion", headers={"Authorization": "Bearer kb"},
                           json={"prompt": "z", "n_predict": 1}, timeout=300)
        assert other.status_code == 200
        for thread in threads:
            thread.join(timeout=300)


# ----------------------------------------------------------------------- the prompt budget


def test_a_long_prompt_does_not_hold_back_another_slots_stream(model_lock: None) -> None:
    """With a 64-token step budget the long prompt needs dozens of steps; the short request on
    the other slot gets its share of each step, so its whole answer streams before the long
    prompt's first token."""
    with KineticServer("-c", "8192", "-np", "2", "-b", "64", "-ub", "64") as server:
        events: list[str] = []
        lock = threading.Lock()

        def stream(name: str, prompt: str, n_predict: int) -> None:
            body = {"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", server.url + "/completion", json=body, timeout=300) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        with lock:
                            events.append(name if not json.loads(line[6:]).get("stop") else name + "-end")

        long = threading.Thread(target=stream, args=("long", SHARED * 2, 2))
        long.start()
        wait_until(lambda: any(s["is_processing"] for s in httpx.get(server.url + "/slots").json()), "the long prompt")
        short = threading.Thread(target=stream, args=("short", "Hello", 12))
        short.start()
        long.join(timeout=300)
        short.join(timeout=300)
    assert events.count("short") == 12 and "long" in events
    assert events.index("short-end") < events.index("long"), events


# Batching changes llama.cpp's arithmetic a little: a sequence decoded beside others goes through
# other matmul kernels and micro-batch splits (batch composition picks them, and it depends on
# timing) than it does alone. Measured on the bundled model, same tokens, alone vs in a batch:
# logprobs move by 0.02 nats typically and up to 0.24 (-1.889 vs -1.648); kinetic before the
# scheduler changes of issue 15 shows the same first difference on the same token (8098 vs 16976,
# a 0.005-nat tie). So greedy text is identical until two candidates are that close, and may
# differ from there on. These tests demand exactly that: the same tokens, or a first difference
# where, in each run, both choices are among its top candidates less than NEAR_TIE apart. A tie can
# have three ways (clean run f: "4" -2.013, "7" -2.057 alone, and a third digit won in the batch),
# so the candidates looked at are the top N_CANDIDATES, not two. Cross-talk between slots (a wrong
# logits row, sequence or sampler) picks tokens far from this sequence's top candidates.
NEAR_TIE = 0.5  # nats: twice the largest drift measured
N_CANDIDATES = 5


def assert_same_or_near_tie(alone: dict[str, Any], other: dict[str, Any]) -> None:
    a, b = alone["tokens"], other["tokens"]
    if a == b:
        return
    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    for run in (alone, other):
        top = run["completion_probabilities"][k]["top_logprobs"]
        logprob = {t["id"]: t["logprob"] for t in top}
        assert a[k] in logprob and b[k] in logprob, (k, top)
        assert abs(logprob[a[k]] - logprob[b[k]]) < NEAR_TIE, (k, top)


def greedy(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"prompt": prompt, "n_predict": 24, "temperature": 0, "ignore_eos": True, "return_tokens": True,
            "n_probs": N_CANDIDATES, **extra}


# --------------------------------------------------------------------- shared prefixes


def test_a_prefix_cached_on_another_slot_is_copied_and_answers_the_same(live_server: KineticServer) -> None:
    url = live_server.url
    n_shared = len(httpx.post(url + "/tokenize", json={"content": SHARED}).json()["tokens"])
    first = complete(url, {"prompt": SHARED + " Question one:", "n_predict": 4, "id_slot": 0, "temperature": 0})
    assert first["id_slot"] == 0
    copied = complete(url, greedy(SHARED + " Question two:", id_slot=1))
    assert copied["id_slot"] == 1
    assert copied["timings"]["cache_n"] >= n_shared - 1  # the shared system prompt was not evaluated again
    evaluated = complete(url, greedy(SHARED + " Question two:", id_slot=1, cache_prompt=False))
    assert evaluated["timings"]["cache_n"] == 0
    assert_same_or_near_tie(evaluated, copied)


# ------------------------------------------------------------------ batching changes nothing


def test_concurrent_requests_give_the_answers_they_give_alone(live_server: KineticServer) -> None:
    url = live_server.url
    bodies = [greedy(f"Story number {i}:", cache_prompt=False) for i in range(4)]
    alone = [complete(url, body) for body in bodies]
    together: dict[int, dict[str, Any]] = {}

    def run(i: int) -> None:
        together[i] = complete(url, bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for i in range(4):
        assert_same_or_near_tie(alone[i], together[i])


def test_a_prompt_sent_again_with_its_head_cached_is_answered_as_the_first_time(live_server: KineticServer) -> None:
    # llama-server's own suite asks this (test_completion_stream_vs_non_stream, seeded at temperature 0.8):
    # the first time the whole prompt is read from position 0, the second time only its last token is
    body = {"prompt": "I believe the meaning of life is", "n_predict": 8, "temperature": 0.8, "seed": 42,
            "n_probs": N_CANDIDATES, "id_slot": 0}
    first = complete(live_server.url, {**body, "cache_prompt": False})
    again = complete(live_server.url, body)
    assert first["timings"]["cache_n"] == 0
    assert again["timings"]["cache_n"] == again["tokens_evaluated"] - 1
    assert again["content"] == first["content"]
    # the same arithmetic: before kinetic read prompts in llama-server's shapes, the logprobs parted by 0.003-0.05
    steps = zip(again["completion_probabilities"], first["completion_probabilities"], strict=True)
    for step_again, step_first in steps:
        assert [c["id"] for c in step_again["top_logprobs"]] == [c["id"] for c in step_first["top_logprobs"]]
        assert [c["logprob"] for c in step_again["top_logprobs"]] == pytest.approx(
            [c["logprob"] for c in step_first["top_logprobs"]], abs=1e-4)


def test_a_cancelled_stream_does_not_change_its_neighbour(live_server: KineticServer) -> None:
    url = live_server.url
    body = greedy("The neighbour says", n_predict=40, cache_prompt=False)
    alone = complete(url, body)
    result: dict[str, dict[str, Any]] = {}

    def neighbour() -> None:
        result["answer"] = complete(url, body)

    with httpx.stream("POST", url + "/completion", timeout=300,
                      json={"prompt": "Another story", "n_predict": 400, "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        thread = threading.Thread(target=neighbour)
        thread.start()
        for _ in range(5):
            next(lines)
    # the stream is closed here, mid-generation, while the neighbour is still generating
    thread.join(timeout=300)
    assert_same_or_near_tie(alone, result["answer"])
    slots = httpx.get(url + "/slots").json()
    assert not any(slot["is_processing"] for slot in slots)  # the cancelled one freed its slot


# ------------------------------------------------------------------- host-memory prefixes


@pytest.mark.parametrize("cache_ram", ["64", "0"])
def test_a_prefix_the_slot_moved_on_from_comes_back_from_host_memory(model_lock: None, cache_ram: str) -> None:
    """One slot: the class's shared prompt, then another prompt takes the slot, then the shared
    prompt again. With --cache-ram its cells come back from host memory instead of being evaluated."""
    with KineticServer("-c", "2048", "-np", "1", "--cache-ram", cache_ram) as server:
        url = server.url
        n_shared = len(httpx.post(url + "/tokenize", json={"content": SHARED}).json()["tokens"])
        complete(url, {"prompt": SHARED + " Question one:", "n_predict": 4, "temperature": 0})
        complete(url, {"prompt": "Something else entirely, " * 8, "n_predict": 4, "temperature": 0})
        again = complete(url, greedy(SHARED + " Question two:"))
        if cache_ram == "0":
            assert again["timings"]["cache_n"] < 16  # evaluated again: only a token or two in common
            return
        assert again["timings"]["cache_n"] >= n_shared - 1
        evaluated = complete(url, greedy(SHARED + " Question two:", cache_prompt=False))
        assert_same_or_near_tie(evaluated, again)
