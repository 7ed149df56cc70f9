"""One KV pool shared by every slot (-kvu, the default without -np): idle slots keep their last prompt's cells in it.

A class's distinct prompts filled the pool with cached prompts until each new one found no free cells, and every
request after that failed with a 500 (llama_decode's status 1) while no request was running. Like llama-server
(its try_clear_idle_slots), kinetic then purges the least recently used idle slot's cells, one slot at a time, and
decodes the same batch again. When the running requests alone overfill it, one of them fails with llama-server's
message (a prompt still being read, the newest first, else the slot holding the most cells) and the others go on;
llama-server fails every request in the batch there. A saved state (the host cache's, a hybrid model's checkpoint)
restored into a full pool makes room the same way.

The real server on the bundled model, and on the tests' tiny Qwen3.5 (hybrid, the course's layer pattern), token
prompts to /completion, so that the cells each one takes are known.
"""

from __future__ import annotations

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


def test_a_batch_the_running_requests_overfill_fails_and_the_server_goes_on(pool: KineticServer) -> None:
    # four prompts of 300 tokens, each answer 100 long: 1600 cells with every idle slot purged
    with ThreadPoolExecutor(4) as workers:
        answers = list(workers.map(lambda i: complete(pool.url, prompt(10 + i, 300), n_predict=100), range(4)))
    failed = [a for a in answers if a.status_code != 200]
    assert failed, [a.status_code for a in answers]
    for answer in failed:
        assert answer.status_code == 500
        assert answer.json()["error"]["message"].startswith("Context size has been exceeded.")
    assert idle(pool.url)
    after = complete(pool.url, prompt(20))
    assert after.status_code == 200, after.text
    assert after.json()["tokens_predicted"] == 8


def test_a_prompt_that_overfills_the_pool_fails_alone_and_the_running_stream_goes_on(pool: KineticServer) -> None:
    # a stream that will hold 900 cells, then a 450-token prompt: 1350 > 1024 with every idle slot purged
    body = {"prompt": prompt(30, 600), "n_predict": 300, "temperature": 0, "ignore_eos": True, "stream": True}
    texts: list[str] = []
    with httpx.Client(timeout=300) as client, connect_sse(client, "POST", pool.url + "/completion", json=body) as sse:
        events = sse.iter_sse()
        texts.append(next(events).json()["content"])
        newcomer = complete(pool.url, prompt(31, 450))
        final: dict[str, Any] = {}
        for event in events:
            data = event.json()
            texts.append(data.get("content", ""))
            if data.get("stop"):
                final = data
    assert newcomer.status_code == 500
    assert newcomer.json()["error"]["message"].startswith("Context size has been exceeded.")
    assert final["tokens_predicted"] == 300 and final["stop_type"] == "limit", final
    assert idle(pool.url)
    assert complete(pool.url, prompt(32)).status_code == 200


def test_the_course_models_pool_makes_room_and_restores_its_checkpoints(model_lock: None) -> None:
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
        assert idle(server.url)
