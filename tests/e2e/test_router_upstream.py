"""Remote backends: a second real `kinetic serve` process as the OpenAI-compatible upstream of a router.

The router serves `remote` from a pool of two upstreams (one address nobody listens on, one live
kinetic), next to local models; kinetic's key check stays in front. Only one process decodes at a
time: requests are sent one after the other.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kinetic.backends.bundled import gemma_model_path
from kinetic.classroom.ledger import read_ledger
from tests.projector_model import png_image, tiny_projector
from tests.server import KineticServer, free_port, wait_until

KEY = "sk-class"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def upstream_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What reached the upstream: one line per request it answered."""
    return tmp_path_factory.mktemp("upstream") / "ledger.jsonl"


@pytest.fixture(scope="module")
def upstream(model_lock: None, upstream_ledger: Path) -> Iterator[KineticServer]:
    # it reads images too (the tiny test projector): the router sends them on inline
    with KineticServer("-c", "2048", "-np", "2", "-a", "gemma-up", "--embeddings", "-mm", str(tiny_projector("gemma3")),
                       "--ledger", str(upstream_ledger)) as server:
        yield server


def router_for(upstream_url: str, minilm: str) -> KineticServer:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the pool must skip it
    return KineticServer("--api-key", KEY, "--upstream", f"remote={dead},model=gemma-up",
                         "--upstream", f"remote={upstream_url},model=gemma-up",
                         "-m", str(gemma_model_path()), "-a", "local", "-m", minilm, "-a", "minilm",
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


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                   "required": ["city"]}}}
FORCE = {"type": "function", "function": {"name": "get_weather"}}


def assert_weather_call(name: str | None, arguments: str | dict) -> None:
    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert name == "get_weather" and parsed["city"] in ("Paris", "Oslo")


def test_tool_calls_come_back_from_the_upstream_in_openai_chat(router: KineticServer) -> None:
    """The upstream (a base model) is forced to call: its call is grammar-constrained, so real."""
    from openai import OpenAI

    client = OpenAI(base_url=router.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    reply = client.chat.completions.create(model="remote", messages=CHAT, max_tokens=64,  # type: ignore[arg-type]
                                           tools=[WEATHER], tool_choice=FORCE)  # type: ignore[list-item,arg-type]
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.id and call.type == "function"
    assert_weather_call(call.function.name, call.function.arguments)  # type: ignore[union-attr]
    stream = client.chat.completions.create(model="remote", messages=CHAT, max_tokens=64, stream=True,  # type: ignore
                                            tools=[WEATHER], tool_choice="required")  # type: ignore[list-item]
    name, arguments, finish = None, "", None
    for chunk in stream:
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            name = name or (delta_call.function.name if delta_call.function else None)
            arguments += (delta_call.function.arguments or "") if delta_call.function else ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls"
    assert_weather_call(name, arguments)
    # a tool result sent back is forwarded as OpenAI messages: the upstream answers in text
    follow = client.chat.completions.create(model="remote", max_tokens=4, tools=[WEATHER],  # type: ignore[list-item]
                                            tool_choice="none", messages=[  # type: ignore[list-item]
        *CHAT, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    assert follow.choices[0].finish_reason == "length" and not follow.choices[0].message.tool_calls


def test_tool_calls_come_back_from_the_upstream_in_anthropic_responses_and_ollama(router: KineticServer) -> None:
    from anthropic import Anthropic
    from openai import OpenAI

    anthropic = Anthropic(base_url=router.url, api_key=KEY, max_retries=0)
    tool = {"name": "get_weather", "description": "The weather in a city",
            "input_schema": WEATHER["function"]["parameters"]}
    message = anthropic.messages.create(model="remote", max_tokens=64, messages=CHAT,  # type: ignore[arg-type]
                                        tools=[tool], tool_choice={"type": "tool", "name": "get_weather"})  # type: ignore
    assert message.stop_reason == "tool_use"
    uses = [block for block in message.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].id
    assert_weather_call(uses[0].name, uses[0].input)  # type: ignore[arg-type]
    with anthropic.messages.stream(model="remote", max_tokens=64, messages=CHAT,  # type: ignore[arg-type]
                                   tools=[tool], tool_choice={"type": "any"}) as stream:  # type: ignore[list-item]
        final = stream.get_final_message()
    streamed = [block for block in final.content if block.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(streamed) == 1
    assert_weather_call(streamed[0].name, streamed[0].input)  # type: ignore[arg-type]

    openai = OpenAI(base_url=router.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    function = {"type": "function", **WEATHER["function"]}
    response = openai.responses.create(model="remote", input="Weather?", max_output_tokens=64,
                                       tools=[function], tool_choice={"type": "function", "name": "get_weather"})  # type: ignore
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].call_id
    assert_weather_call(calls[0].name, calls[0].arguments)  # type: ignore[union-attr]
    events = list(openai.responses.create(model="remote", input="Weather?", max_output_tokens=64, stream=True,
                                          tools=[function], tool_choice="required"))  # type: ignore[list-item]
    done = [e for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert len(done) == 1
    assert_weather_call(done[0].item.name, done[0].item.arguments)  # type: ignore[union-attr]

    # Ollama has no tool_choice: `format` holds the upstream to one call's JSON, which the upstream
    # reads as a call because it names one of the tools.
    import ollama

    schema = {"type": "object", "properties": {"name": {"const": "get_weather"},
                                               "arguments": WEATHER["function"]["parameters"]},
              "required": ["name", "arguments"]}
    client = ollama.Client(host=router.url, headers=AUTH)
    reply = client.chat(model="remote", messages=CHAT, tools=[WEATHER], format=schema, options={"num_predict": 64})
    assert reply.message.tool_calls and len(reply.message.tool_calls) == 1
    assert_weather_call(reply.message.tool_calls[0].function.name, dict(reply.message.tool_calls[0].function.arguments))
    parts = list(client.chat(model="remote", messages=CHAT, tools=[WEATHER], format=schema, stream=True,
                             options={"num_predict": 64}))
    streamed_calls = [call for part in parts for call in (part.message.tool_calls or [])]
    assert len(streamed_calls) == 1 and parts[-1].done
    assert_weather_call(streamed_calls[0].function.name, dict(streamed_calls[0].function.arguments))


def test_token_routes_are_answered_by_the_upstream(router: KineticServer, upstream: KineticServer) -> None:
    """kinetic has no tokenizer for a remote model: the upstream's native routes answer, and they
    agree with the same GGUF loaded locally under the name `local`."""
    def post(server: KineticServer, route: str, body: dict) -> dict:
        reply = httpx.post(server.url + route, json=body, headers=AUTH, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()

    text = {"content": "Hello world", "with_pieces": True}
    remote = post(router, "/tokenize", {"model": "remote", **text})
    assert remote == post(upstream, "/tokenize", text) == post(router, "/tokenize", {"model": "local", **text})
    assert [piece["piece"] for piece in remote["tokens"]] == ["Hello", " world"]
    ids = [piece["id"] for piece in remote["tokens"]]
    assert post(router, "/detokenize", {"model": "remote", "tokens": ids}) == {"content": "Hello world"}
    template = {"messages": CHAT}
    rendered = post(router, "/apply-template", {"model": "remote", **template})["prompt"]
    assert rendered == post(router, "/apply-template", {"model": "local", **template})["prompt"]
    assert "Say hello." in rendered and rendered != "Say hello."
    from anthropic import Anthropic

    anthropic = Anthropic(base_url=router.url, api_key=KEY, max_retries=0)
    counted = anthropic.messages.count_tokens(model="remote", messages=CHAT)  # type: ignore[arg-type]
    local = anthropic.messages.count_tokens(model="local", messages=CHAT)  # type: ignore[arg-type]
    assert counted.input_tokens == local.input_tokens > 3


def chats(ledger: Path) -> list[tuple[str | None, int]]:
    """(who, status) of each chat request a server's ledger recorded, in order."""
    return [(r.client, r.status) for r in read_ledger(ledger) if r.route.endswith("/chat/completions")]


def test_the_classroom_layer_stays_in_front(upstream: KineticServer, upstream_ledger: Path, tmp_path: Path) -> None:
    """Before anything is forwarded, kinetic checks the key (401), validates the request (400) and
    holds the key to its requests in flight (429); its ledger records each attempt by name. Only the
    one valid request reaches the upstream."""
    ledger = tmp_path / "router.jsonl"
    with KineticServer("--api-key", KEY, "--upstream", f"remote={upstream.url},model=gemma-up",
                       "--max-in-flight", "1", "--ledger", str(ledger)) as router:
        url = router.url + "/v1/chat/completions"
        forwarded_before = len(chats(upstream_ledger))
        body = {"model": "remote", "messages": CHAT, "max_tokens": 2}
        assert httpx.post(url, json=body, timeout=30).status_code == 401
        bad = httpx.post(url, headers=AUTH, timeout=30, json={**body, "max_tokens": 0})
        assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
        long = {**body, "max_tokens": 1900, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", url, headers=AUTH, json=long, timeout=120) as response:
            lines = response.iter_lines()  # held: a dropped iterator closes the stream
            next(line for line in lines if line.startswith("data: "))  # it runs upstream
            second = httpx.post(url, headers=AUTH, timeout=30, json=body)
        assert second.status_code == 429 and "in flight" in second.json()["error"]["message"]
        wait_until(lambda: len(chats(ledger)) == 4, "the router's ledger records the four attempts")
        assert chats(ledger) == [(None, 401), ("key-1", 400), ("key-1", 429), ("key-1", 200)]
        # the stream the client left is cancelled upstream too; it is the only request forwarded
        wait_until(lambda: len(chats(upstream_ledger)) > forwarded_before, "the upstream records the stream")
        assert chats(upstream_ledger)[forwarded_before:] == [(None, 200)]
        wait_until(lambda: not any(slot["is_processing"] for slot in httpx.get(upstream.url + "/slots").json()),
                   "the upstream's slots are idle again")


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


def test_an_image_reaches_the_upstream_inline(router: KineticServer, upstream_ledger: Path) -> None:
    """The router loads the file under its own rules and sends it on as a data: URL: the upstream's ledger line
    shows the image its prompt read, and the answer's usage counts it."""
    image = "data:image/png;base64," + base64.b64encode(png_image(64, 64, 81)).decode()
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                             {"type": "image_url", "image_url": {"url": image}}]}]
    response = httpx.post(router.url + "/v1/chat/completions", headers=AUTH, timeout=120,
                          json={"model": "remote", "messages": messages, "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] >= 16  # the tiny projector's 16 embeddings
    seen = [line for line in read_ledger(upstream_ledger) if line.media is not None]
    media = seen[-1].media if seen else None
    assert media is not None and media.model_dump() == {"images": 1, "audio": 0, "tokens": 16}
