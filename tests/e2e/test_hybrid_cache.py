"""Every KV-cache path on models whose memory is not one cell per token (tests/hybrid_model.py).

A hybrid model (LFM2, Qwen3.5: attention beside short convolutions or gated delta nets) and a recurrent
one (Mamba) keep one state snapshot per sequence for their recurrent layers: it cannot be trimmed back
to a shorter prefix, and copying a sequence copies its whole state. So a cached prefix is only valid
when the state is at exactly that prefix. Each test here sends a prompt through one cache path and
checks that its greedy text is the one a fresh evaluation of the same prompt gives (`cache_prompt:
false` evaluates it whole), and that the server keeps serving. `cache_n` may be smaller than on an
attention model, but never claims cells the answer was not computed from.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.hybrid_model import tiny_model
from tests.server import KineticServer, wait_until

pytestmark = pytest.mark.e2e

N_PREDICT = 12
# Token prompts: ids from the middle of Gemma's vocabulary, fixed, so every run sends the same prompts.
P1 = [2] + [1000 + 37 * i % 5000 for i in range(95)]  # 96 tokens, BOS first
P2 = P1[:95] + [7777]  # shares its first 95 tokens with P1
UNRELATED = [2] + [9000 + 13 * i % 4000 for i in range(60)]
SYSTEM = [2] + [20000 + 11 * i % 3000 for i in range(150)]  # a class's shared system prompt
STUDENTS = [SYSTEM + [30000 + 101 * s + i for i in range(20)] for s in range(4)]
SHORT = [2] + [15000 + 7 * i for i in range(9)]  # 10 tokens: shorter than any prefix worth sharing between prompts

ARCHITECTURES = ("lfm2", "qwen35", "mamba")


def complete(url: str, prompt: list[int], **fields: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, **fields}
    response = httpx.post(url + "/completion", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def fresh(url: str, prompt: list[int]) -> str:
    """The text of `prompt` evaluated whole, from no cached state."""
    return complete(url, prompt, cache_prompt=False)["content"]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def architecture(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def one_slot_and_references(architecture: str, model_lock: None, tmp_path_factory: pytest.TempPathFactory,
                            ) -> Iterator[tuple[KineticServer, dict[str, str]]]:
    """The lab's own server line: one slot, so other prompts go through the host-memory cache. Before it
    serves anything else, it gives each prompt's fresh text (the references): evaluated whole
    (`cache_prompt: false`), from a slot that holds nothing yet."""
    slot_files = tmp_path_factory.mktemp("slot-files")
    with KineticServer("-m", str(tiny_model(architecture)), "-c", "2048", "-np", "1",
                       "--slot-save-path", str(slot_files)) as server:
        prompts = {"P1": P1, "P2": P2, "UNRELATED": UNRELATED, "SHORT": SHORT}
        prompts.update({f"S{i}": p for i, p in enumerate(STUDENTS)})
        texts = {name: fresh(server.url, prompt) for name, prompt in prompts.items()}
        # the fixed prompts must part ways: otherwise an answer copied from the wrong state could pass
        assert texts["P1"] != texts["P2"]
        yield server, texts


@pytest.fixture(scope="module")
def references(one_slot_and_references: tuple[KineticServer, dict[str, str]]) -> dict[str, str]:
    """Each prompt's fresh text."""
    return one_slot_and_references[1]


@pytest.fixture(scope="module")
def one_slot(one_slot_and_references: tuple[KineticServer, dict[str, str]]) -> KineticServer:
    return one_slot_and_references[0]


@pytest.fixture(scope="module")
def unified(architecture: str, model_lock: None) -> Iterator[KineticServer]:
    """kinetic's default: 16 slots over one unified cache (cells shared between slots)."""
    with KineticServer("-m", str(tiny_model(architecture)), "-c", "4096", "--metrics", "--embeddings") as server:
        yield server


@pytest.fixture(scope="module")
def two_streams(architecture: str, model_lock: None) -> Iterator[KineticServer]:
    """-np 2: one KV stream per slot (llama.cpp copies between streams only whole)."""
    with KineticServer("-m", str(tiny_model(architecture)), "-c", "2048", "-np", "2") as server:
        yield server


def test_the_model_kind_is_reported(unified: KineticServer, architecture: str) -> None:
    props = httpx.get(unified.url + "/props").json()
    expected = {"lfm2": "hybrid", "qwen35": "hybrid", "mamba": "recurrent"}[architecture]
    assert props["memory_kind"] == expected
    slots = httpx.get(unified.url + "/slots").json()
    assert len(slots) == 16 and all(slot["n_ctx"] == 4096 for slot in slots)


def test_own_slot_after_a_longer_prompt(one_slot: KineticServer, references: dict[str, str]) -> None:
    """P1 then P2 on one slot: the slot's state is past P2's shared prefix and cannot be trimmed back."""
    url = one_slot.url
    assert complete(url, P1)["content"] == references["P1"]
    second = complete(url, P2)
    assert second["content"] == references["P2"]
    assert second["timings"]["cache_n"] <= 95


def test_the_same_prompt_twice_reuses_a_checkpoint(one_slot: KineticServer, references: dict[str, str]) -> None:
    """As llama-server's context checkpoints: the state a few tokens before the prompt's end is kept."""
    url = one_slot.url
    complete(url, UNRELATED)
    complete(url, P1)
    again = complete(url, P1)
    assert again["content"] == references["P1"]
    assert 0 < again["timings"]["cache_n"] < len(P1)


def test_a_short_prompt_sent_again_reuses_its_checkpoint(one_slot: KineticServer,
                                                         references: dict[str, str]) -> None:
    """llama-server keeps the state 4 tokens before the end of any prompt, however short: sent again, the prompt
    evaluates only those 4, even after another prompt took the slot."""
    url = one_slot.url
    complete(url, SHORT)
    complete(url, UNRELATED)
    again = complete(url, SHORT)
    assert again["content"] == references["SHORT"]
    assert again["timings"]["cache_n"] == len(SHORT) - 4
    assert again["timings"]["prompt_n"] == 4


def test_host_cache_after_an_unrelated_prompt(one_slot: KineticServer, references: dict[str, str]) -> None:
    """P1, an unrelated prompt, then P2: the host-memory cache restores; every later request still works."""
    url = one_slot.url
    complete(url, P1)
    assert complete(url, UNRELATED)["content"] == references["UNRELATED"]
    assert complete(url, P2)["content"] == references["P2"]
    assert complete(url, P1)["content"] == references["P1"]
    assert complete(url, UNRELATED)["content"] == references["UNRELATED"]


def test_a_continuation_reuses_the_whole_state(one_slot: KineticServer) -> None:
    """A prompt that extends everything the slot holds (a chat's next turn) evaluates only what is new."""
    url = one_slot.url
    first = complete(url, P1, return_tokens=True)
    follow_up = P1 + first["tokens"][:-1] + [4242, 4243, 4244]
    reference = fresh(url, follow_up)
    complete(url, P1)  # the slot holds P1 and its answer again
    second = complete(url, follow_up)
    assert second["content"] == reference
    assert second["timings"]["cache_n"] >= len(P1)


def test_slot_file_round_trip(one_slot: KineticServer, references: dict[str, str]) -> None:
    url = one_slot.url
    complete(url, P1)
    saved = httpx.post(url + "/slots/0?action=save", json={"filename": "p1.bin"}, timeout=60)
    assert saved.status_code == 200, saved.text
    assert httpx.post(url + "/slots/0?action=erase", timeout=60).status_code == 200
    restored = httpx.post(url + "/slots/0?action=restore", json={"filename": "p1.bin"}, timeout=60)
    assert restored.status_code == 200, restored.text
    assert restored.json()["n_restored"] == saved.json()["n_saved"]
    assert complete(url, P2)["content"] == references["P2"]
    extended = complete(url, P1)
    assert extended["content"] == references["P1"]


def test_cross_slot_from_an_idle_slot(unified: KineticServer, references: dict[str, str]) -> None:
    url = unified.url
    assert complete(url, P1, id_slot=0)["content"] == references["P1"]
    other = complete(url, P2, id_slot=1)
    assert other["content"] == references["P2"]


def test_cross_slot_from_a_busy_slot(unified: KineticServer, references: dict[str, str]) -> None:
    """P2 arrives while P1 is still generating on another slot."""
    url = unified.url
    results: dict[str, Any] = {}

    def long_p1() -> None:
        results["p1"] = complete(url, P1, id_slot=2, n_predict=400, ignore_eos=True)

    thread = threading.Thread(target=long_p1)
    thread.start()
    try:
        wait_until(lambda: any(s["is_processing"] and s["id"] == 2 and s["next_token"][0]["n_decoded"] > 5
                               for s in httpx.get(url + "/slots").json()), "P1 generating on slot 2")
        assert complete(url, P2, id_slot=3)["content"] == references["P2"]
    finally:
        thread.join()
    assert results["p1"]["content"].startswith(references["P1"])


def test_copies_of_one_prompt(unified: KineticServer, references: dict[str, str]) -> None:
    url = unified.url
    body = {"prompt": [P2, P2], "n_predict": N_PREDICT, "temperature": 0}
    response = httpx.post(url + "/completion", json=body, timeout=120)
    assert response.status_code == 200, response.text
    assert [r["content"] for r in response.json()] == [references["P2"]] * 2
    copies = complete(url, P1, n_cmpl=2)
    assert [c["content"] for c in copies] == [references["P1"]] * 2


def test_the_class_shares_its_system_prompt(unified: KineticServer, references: dict[str, str]) -> None:
    """Students with one system prompt and their own questions, each on a slot of its own: after the
    first two, the shared prefix comes from the saved state, and every answer is the fresh one."""
    url = unified.url
    answers = [complete(url, prompt, id_slot=8 + i) for i, prompt in enumerate(STUDENTS)]
    assert [a["content"] for a in answers] == [references[f"S{i}"] for i in range(len(STUDENTS))]
    assert all(a["timings"]["cache_n"] >= len(SYSTEM) for a in answers[2:])


def test_separate_streams_share_and_keep_serving(two_streams: KineticServer, references: dict[str, str]) -> None:
    """-np 2: reuse across streams while the other slot streams; nothing answers 500, nothing is cut."""
    url = two_streams.url
    complete(url, P1, id_slot=0)
    results: dict[str, Any] = {}

    def long_unrelated() -> None:
        results["long"] = complete(url, UNRELATED, id_slot=0, n_predict=300, ignore_eos=True)

    thread = threading.Thread(target=long_unrelated)
    thread.start()
    try:
        wait_until(lambda: any(s["is_processing"] and s["id"] == 0 for s in httpx.get(url + "/slots").json()),
                   "the long request on slot 0")
        assert complete(url, P2, id_slot=1)["content"] == references["P2"]
        assert complete(url, P1, id_slot=1)["content"] == references["P1"]
    finally:
        thread.join()
    assert results["long"]["content"].startswith(references["UNRELATED"])
    assert results["long"]["timings"]["predicted_n"] == 300


def test_the_rest_of_the_server_on_the_model(unified: KineticServer, architecture: str) -> None:
    """The chat route (no template in the GGUF: the fallback), a constrained answer, /metrics and the
    embedding routes work on this memory as on Gemma."""
    url = unified.url
    chat = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        "max_tokens": 8, "temperature": 0})
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] > 0
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    constrained = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "Answer in JSON"}], "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}})
    assert constrained.status_code == 200, constrained.text
    assert isinstance(json.loads(constrained.json()["choices"][0]["message"]["content"])["ok"], bool)
    metrics = httpx.get(url + "/metrics").text
    assert "llamacpp:prompt_tokens_total" in metrics and "llamacpp:tokens_predicted_total" in metrics
    embedded = httpx.post(url + "/v1/embeddings", json={"input": ["one", "two words"]}, timeout=120)
    assert embedded.status_code == 200, embedded.text
    vectors = [item["embedding"] for item in embedded.json()["data"]]
    assert [len(v) for v in vectors] == [64, 64] and vectors[0] != vectors[1]


def test_a_chat_class_shares_its_system_prompt_from_the_second_student(unified: KineticServer) -> None:
    """On the chat route the state is also saved where the last message starts (the end of the system
    prompt and the template's preamble), so already the second student starts from it."""
    url = unified.url
    system = "You are the assistant of a course on serving language models locally. " * 12

    def ask(question: str, **extra: Any) -> dict[str, Any]:
        response = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 8, "temperature": 0, **extra})
        assert response.status_code == 200, response.text
        return response.json()

    questions = ["What is a slot?", "Why does cache_n grow?", "How many tokens per second?"]
    expected = [ask(q, cache_prompt=False)["choices"][0]["message"]["content"] for q in questions]
    n_system = len(httpx.post(url + "/tokenize", json={"content": system}).json()["tokens"])
    answers = [ask(q, id_slot=12 + i) for i, q in enumerate(questions)]
    assert [a["choices"][0]["message"]["content"] for a in answers] == expected
    assert all(a["timings"]["cache_n"] >= n_system for a in answers[1:])
