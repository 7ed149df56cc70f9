"""One KV pool shared by every slot (-kvu, the default without -np): idle slots keep their last prompt's cells in it.

A class's distinct prompts filled the pool with cached prompts until each new one found no free cells, and every
request after that failed with a 500 (llama_decode's status 1) while no request was running. Like llama-server
(its try_clear_idle_slots), kinetic then purges the least recently used idle slot's cells, one slot at a time, and
decodes the same batch again. When the running requests alone overfill it, llama-server fails every request in the
batch; kinetic takes one out and the others go on: a prompt still being read (the newest) waits until a running
request has ended, else the slot holding the most cells fails with llama-server's message. A saved state (the host
cache's, a hybrid model's checkpoint) restored into a full pool makes room the same way.

The real server on the bundled model, and on the tests' tiny Qwen3.5 (hybrid, the course's layer pattern), token
prompts to /completion, so that the cells each one takes are known.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from kinetic.engine.llama.admission import CHECKPOINT_END_OFFSET
from tests.hybrid_model import tiny_model
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

N_CTX = 1024
PROMPT_TOKENS = 230  # four cached (with their answers: 4 x 238 cells) leave no room in 1024 for a fifth


def prompt(index: int, n: int = PROMPT_TOKENS) -> list[int]:
    """BOS, then tokens from the middle of Gemma's vocabulary; prompts of different indexes part at the second."""
    return [2] + [1000 + (97 * index + 13 * k) % 20000 for k in range(n - 1)]


def complete(url: str, tokens: list[int], **fields: Any) -> httpx.Response:
    body = {"prompt": tokens, "n_predict": 8, "temperature": 0, "ignore_eos": True, **fields}
    return httpx.post(url + "/completion", json=body, timeout=300)


@pytest.fixture(scope="module")
def pool(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer("-c", str(N_CTX), "-np", "8", "-kvu") as server:
        yield server


def idle(url: str) -> bool:
    return not any(slot["is_processing"] for slot in httpx.get(url + "/slots", timeout=30).json())


def test_a_new_prompt_purges_the_least_recently_used_idle_slot(pool: KineticServer) -> None:
    for index in range(4):
        first = complete(pool.url, prompt(index))
        assert first.status_code == 200, first.text
    fifth = complete(pool.url, prompt(4))
    assert fifth.status_code == 200, fifth.text
    assert fifth.json()["tokens_predicted"] == 8 and fifth.json()["timings"]["prompt_n"] == PROMPT_TOKENS
    assert "purging idle slot" in pool.log()
    # only what the fifth needed went: the most recently used idle slot still holds its prompt
    again = complete(pool.url, prompt(3))
    assert again.status_code == 200, again.text
    assert again.json()["timings"]["cache_n"] == PROMPT_TOKENS - 1
    # and the purged one was saved to the host cache first: restored there, after another idle slot made room
    purged = complete(pool.url, prompt(0))
    assert purged.status_code == 200, purged.text
    assert purged.json()["timings"]["cache_n"] == PROMPT_TOKENS - 1
    assert idle(pool.url)


def test_a_request_that_outgrows_the_pool_fails_alone(pool: KineticServer) -> None:
    # two 450-token prompts fit (900 cells, the idle slots purged); their answers then grow past 1024
    with ThreadPoolExecutor(2) as workers:
        answers = list(workers.map(lambda i: complete(pool.url, prompt(10 + i, 450), n_predict=120), range(2)))
    failed = [a for a in answers if a.status_code != 200]
    served = [a for a in answers if a.status_code == 200]
    assert len(failed) == 1 and len(served) == 1, [a.status_code for a in answers]
    assert failed[0].status_code == 500
    assert failed[0].json()["error"]["message"].startswith("Context size has been exceeded.")
    assert served[0].json()["tokens_predicted"] == 120
    assert idle(pool.url)
    after = complete(pool.url, prompt(20))
    assert after.status_code == 200, after.text
    assert after.json()["tokens_predicted"] == 8


def test_a_prompt_with_no_room_waits_for_the_running_stream_to_end(pool: KineticServer) -> None:
    assert_a_prompt_waits_for_room(pool)


def test_a_prompt_that_waits_keeps_what_its_earlier_steps_read(model_lock: None) -> None:
    # 256-token batches: the newcomer reads 255 tokens beside the stream's, and finds no room for the rest
    with KineticServer("-c", str(N_CTX), "-np", "8", "-kvu", "-b", "256") as server:
        waited = assert_a_prompt_waits_for_room(server)
        # restored from the host cache when it started again: what it had read before the batch that found no room
        assert waited["timings"]["cache_n"] >= 100


def assert_a_prompt_waits_for_room(pool: KineticServer) -> dict[str, Any]:
    """A 450-token prompt sent while a stream that will hold 900 cells runs (1350 > 1024 with every idle slot
    purged) is answered after the stream, as it would be alone: its answer."""
    body = {"prompt": prompt(30, 600), "n_predict": 300, "temperature": 0, "ignore_eos": True, "stream": True}
    final: dict[str, Any] = {}
    stream_ended = float("inf")
    with ThreadPoolExecutor(1) as workers, httpx.Client(timeout=300) as client, \
            connect_sse(client, "POST", pool.url + "/completion", json=body) as sse:
        events = sse.iter_sse()
        next(events)
        newcomer = workers.submit(lambda: (complete(pool.url, prompt(31, 450)), time.monotonic()))
        for event in events:
            if (data := event.json()).get("stop"):
                final, stream_ended = data, time.monotonic()
        waited, answered = newcomer.result()
    assert final["tokens_predicted"] == 300 and final["stop_type"] == "limit", final
    assert waited.status_code == 200, waited.text
    timings = waited.json()["timings"]
    assert waited.json()["tokens_predicted"] == 8 and timings["prompt_n"] + timings["cache_n"] == 450
    assert answered > stream_ended  # answered after the stream's last event: read once the stream had freed its cells
    assert "waits for a running request to end" in pool.log()
    alone = complete(pool.url, prompt(31, 450), cache_prompt=False)
    assert alone.json()["content"] == waited.json()["content"]  # greedy: nothing of the failed batch stayed
    assert idle(pool.url)
    answer: dict[str, Any] = waited.json()
    return answer


def test_the_course_models_pool_makes_room_restores_its_checkpoints_and_lets_a_prompt_wait(model_lock: None) -> None:
    with KineticServer("-m", str(tiny_model("qwen35")), "-c", str(N_CTX), "-np", "8", "-kvu") as server:
        fresh: dict[int, str] = {}
        for index in range(6):
            answer = complete(server.url, prompt(index))
            assert answer.status_code == 200, answer.text
            assert answer.json()["timings"]["cache_n"] == 0
            fresh[index] = answer.json()["content"]
        for index in (0, 5):  # each one's checkpoint, saved 4 tokens before its end, is restored into the full pool
            again = complete(server.url, prompt(index))
            assert again.status_code == 200, again.text
            assert again.json()["timings"]["cache_n"] == PROMPT_TOKENS - CHECKPOINT_END_OFFSET
            assert again.json()["content"] == fresh[index]  # greedy: the restored state answers as a fresh one
        assert "purging idle slot" in server.log()
        assert_a_prompt_waits_for_room(server)
