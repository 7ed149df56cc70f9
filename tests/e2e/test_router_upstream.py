"""Remote backends: a second real `kinetic serve` process as the OpenAI-compatible upstream of a router.

The router serves `remote` from a pool of two upstreams (one address nobody listens on, one live
kinetic), next to local models; kinetic's key check stays in front. Only one process decodes at a
time: requests are sent one after the other.
"""

from __future__ import annotations

import json
from typing import Iterator

import httpx
import pytest

from kinetic.models import bundled_model_path
from tests.server import KineticServer, free_port

KEY = "sk-class"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def upstream(model_lock: None) -> Iterator[KineticServer]:
    with KineticServer("-c", "2048", "-np", "2", "-a", "gemma-up", "--embeddings") as server:
        yield server


def router_for(upstream_url: str, minilm: str) -> KineticServer:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the pool must skip it
    return KineticServer("--api-key", KEY, "--upstream", f"remote={dead},model=gemma-up",
                         "--upstream", f"remote={upstream_url},model=gemma-up",
                         "-m", str(bundled_model_path()), "-a", "local", "-m", minilm, "-a", "minilm",
                         "-c", "2048", "-np", "1")


@pytest.fixture(scope="module")
def router(upstream: KineticServer, minilm_path: str) -> Iterator[KineticServer]:
    with router_for(upstream.url, minilm_path) as server:
        yield server


def sse_chunks(response: httpx.Response) -> list[dict]:
    chunks = []
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            chunks.append(json.loads(line[6:]))
    return chunks


def members(server: KineticServer, name: str) -> list[dict]:
    rows = httpx.get(server.url + "/v1/models", headers=AUTH, timeout=30).json()["data"]
    return next(row for row in rows if row["id"] == name)["status"]["upstreams"]


def test_openai_sdk_streams_from_the_upstream_and_chats_locally(router: KineticServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=router.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    stream = client.chat.completions.create(model="remote", messages=CHAT, max_tokens=6,  # type: ignore[arg-type]
                                            stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert all(chunk.model == "remote" for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    local = client.chat.completions.create(model="local", messages=CHAT, max_tokens=3)  # type: ignore[arg-type]
    assert local.model == "local" and local.usage is not None and local.usage.completion_tokens >= 1
    # the dead member was tried once, then taken out of rotation
    assert sorted(m["healthy"] for m in members(router, "remote")) == [False, True]


def test_llama_server_timings_come_through(router: KineticServer) -> None:
    with httpx.stream("POST", router.url + "/v1/chat/completions", headers=AUTH, timeout=120, json={
            "model": "remote", "messages": CHAT, "max_tokens": 5, "stream": True, "ignore_eos": True}) as response:
        chunks = sse_chunks(response)
    timings = chunks[-1]["timings"]
    assert timings["predicted_n"] == 5 and timings["prompt_n"] + timings["cache_n"] >= 5


def test_every_protocol_reaches_the_upstream(router: KineticServer) -> None:
    from anthropic import Anthropic
    from openai import OpenAI

    openai = OpenAI(base_url=router.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    completion = openai.completions.create(model="remote", prompt="Once upon a time", max_tokens=3)
    assert completion.model == "remote" and completion.usage is not None and completion.usage.completion_tokens == 3
    response = openai.responses.create(model="remote", input="Hello", max_output_tokens=4)
    assert response.model == "remote" and response.usage is not None and response.usage.output_tokens == 4
    message = Anthropic(base_url=router.url, api_key=KEY, max_retries=0).messages.create(
        model="remote", max_tokens=3, messages=[{"role": "user", "content": "Hello"}])
    assert message.model == "remote" and message.usage.output_tokens == 3 and message.stop_reason == "max_tokens"
    remote = openai.embeddings.create(model="remote", input=["a cat", "a dog"])
    local = openai.embeddings.create(model="minilm", input=["a cat"])
    assert [len(d.embedding) for d in remote.data] == [640, 640]  # Gemma 270M's width, computed upstream
    assert len(local.data[0].embedding) == 384 and remote.usage.prompt_tokens >= 2
    import ollama

    reply = ollama.Client(host=router.url, headers=AUTH).chat(model="remote", messages=CHAT,
                                                              options={"num_predict": 3})
    assert reply.model == "remote" and reply.eval_count == 3 and reply.done_reason == "length"
    native = httpx.post(router.url + "/completion", headers=AUTH, timeout=60,
                        json={"model": "remote", "prompt": "Hello", "n_predict": 2}).json()
    assert native["model"] == "remote" and native["tokens_predicted"] == 2


def test_the_classroom_layer_stays_in_front(router: KineticServer) -> None:
    body = {"model": "remote", "messages": CHAT, "max_tokens": 2}
    assert httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30).status_code == 401
    bad = httpx.post(router.url + "/v1/chat/completions", headers=AUTH, timeout=30,
                     json={**body, "max_tokens": 0})
    assert bad.status_code == 400  # validated by kinetic before anything is forwarded


def test_an_upstream_going_down_mid_run(model_lock: None, minilm_path: str) -> None:
    with KineticServer("-c", "2048", "-np", "1", "-a", "gemma-up") as upstream, \
            router_for(upstream.url, minilm_path) as server:
        request = {"model": "remote", "messages": CHAT, "max_tokens": 2000, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", headers=AUTH, json=request,
                          timeout=120) as response:
            lines = response.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert "chat.completion.chunk" in first
            assert upstream.proc is not None
            upstream.proc.kill()  # a crash, not a graceful stop
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"  # the stream still ends as OpenAI streams end...
        error = json.loads(rest[-2][6:])
        assert "error" in error and "failed mid-answer" in error["error"]["message"]  # ...with the error in-band
        assert len(rest) < 2000
        after = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, timeout=60,
                           json={"model": "remote", "messages": CHAT, "max_tokens": 2})
        assert after.status_code == 503 and "no upstream server" in after.json()["error"]["message"]
        assert [m["healthy"] for m in members(server, "remote")] == [False, False]
        # the local models at the same address are untouched
        local = httpx.post(server.url + "/v1/chat/completions", headers=AUTH, timeout=60,
                           json={"model": "local", "messages": CHAT, "max_tokens": 2})
        assert local.status_code == 200
