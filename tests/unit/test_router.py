"""Router mode without a model: where models come from (flags, folder, preset, upstreams), the decode
turns, the registry's resolution, LRU unloading and load failures, and the upstream body translation."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from kinetic.backends.base import ModelBackend
from kinetic.backends.config import ModelConfig
from kinetic.backends.local import LocalBackend
from kinetic.backends.sources import ModelSpec, UpstreamSpec, model_specs, read_preset
from kinetic.backends.upstream.backend import UpstreamBackend
from kinetic.backends.upstream.body import chat_body
from kinetic.backends.upstream.pool import upstream_error
from kinetic.backends.upstream.stream import read_events
from kinetic.chat.types import (
    ChatRequest,
    GenerationOptions,
    Message,
    SamplingOptions,
    TextPart,
    ToolChoice,
    ToolSpec,
)
from kinetic.config.args import parse_serve_args
from kinetic.config.settings import ServerSettings, SettingsError
from kinetic.engine.turns import DecodeTurns
from kinetic.engine.types import StructuredCall, Timings, Usage
from kinetic.errors import (
    InvalidRequestError,
    ModelLoadError,
    NotFoundError,
    NotSupportedError,
    ServerError,
)
from kinetic.model_registry.factory import model_config
from kinetic.model_registry.registry import ModelRegistry, ModelState
from tests.scripted import ScriptedEngine

GGUF = b"GGUF" + b"\0" * 16


def gguf(folder: Path, name: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(GGUF)
    return path


# ------------------------------------------------------------------ the command line


def test_each_a_names_the_m_it_follows() -> None:
    s = parse_serve_args(["-a", "first", "-m", "a.gguf", "-m", "b.gguf",
                          "-a", "bee", "-m", "dir/c-00001-of-00002.gguf"], environ={})
    assert s.router_mode
    specs, _ = model_specs(s)
    assert [(spec.name, spec.aliases) for spec in specs] == [("first", ("first",)), ("bee", ("bee",)), ("c", ())]


def test_hf_repos_mix_with_paths() -> None:
    s = parse_serve_args(["-hf", "org/chat-GGUF:Q8_0", "-a", "chat", "-m", "e.gguf", "-hf", "org/other"], environ={})
    specs, _ = model_specs(s)
    assert [(spec.name, spec.hf_repo, spec.path) for spec in specs] == [
        ("chat", "org/chat-GGUF:Q8_0", None), ("e", None, Path("e.gguf")), ("org/other", "org/other", None)]


def test_one_model_keeps_todays_mode() -> None:
    s = parse_serve_args(["-m", "a.gguf", "-a", "x"], environ={})
    assert not s.router_mode and s.model == "a.gguf" and s.alias == "x" and s.model_args == ()


def test_upstream_flags_repeat_and_are_checked() -> None:
    s = parse_serve_args(["--upstream", "big=http://a:8000/v1,key=k1", "--upstream", "big=http://b:8000,model=Q/Q"],
                         environ={})
    specs, _ = model_specs(s)
    assert specs == [ModelSpec(name="big", source="upstream", upstreams=(
        UpstreamSpec("http://a:8000/v1", key="k1"), UpstreamSpec("http://b:8000/v1", model="Q/Q")))]
    with pytest.raises(SettingsError, match="--upstream.*NAME=URL"):
        parse_serve_args(["--upstream", "big"], environ={})
    with pytest.raises(ModelLoadError, match="unknown option 'token'"):
        UpstreamSpec.parse("http://a,token=x")


def test_models_dir_names_by_stem(tmp_path: Path) -> None:
    gguf(tmp_path, "qwen.gguf")
    gguf(tmp_path, "sub/big-00001-of-00002.gguf")
    gguf(tmp_path, "sub/big-00002-of-00002.gguf")
    gguf(tmp_path, "mmproj-qwen.gguf")
    specs, _ = model_specs(parse_serve_args(["--models-dir", str(tmp_path)], environ={}))
    assert sorted(spec.name for spec in specs) == ["big", "qwen"]
    with pytest.raises(SettingsError, match="--models-dir: no such folder"):
        parse_serve_args(["--models-dir", str(tmp_path / "nope")], environ={})


def test_preset_sections_defaults_and_ignored_keys(tmp_path: Path) -> None:
    preset = tmp_path / "models.ini"
    preset.write_text("version = 1\n[*]\nc = 1024\n\n[chat]\nhf = org/repo:Q8_0\nalias = c1, c2\n"
                      "load-on-startup = true\nn-gpu-layers = 99\n\n[embed]\nmodel = e.gguf\n"
                      "LLAMA_ARG_CTX_SIZE = 256\n\n[big]\nupstream = http://a:1/v1,key=k http://b:1\n")
    base = ServerSettings(temp=0.3)
    specs, ignored = read_preset(preset, base)
    chat, embed, big = specs
    assert (chat.hf_repo, chat.aliases, chat.load_on_startup) == ("org/repo:Q8_0", ("c1", "c2"), True)
    assert chat.settings is not None and chat.settings.ctx_size == 1024 and chat.settings.temp == 0.3
    assert embed.path == tmp_path / "e.gguf" and embed.settings is not None and embed.settings.ctx_size == 256
    assert [u.url for u in big.upstreams] == ["http://a:1/v1", "http://b:1/v1"] and big.remote
    assert ignored == ["[chat] n-gpu-layers"]


def test_preset_errors_name_the_section(tmp_path: Path) -> None:
    preset = tmp_path / "p.ini"
    preset.write_text("[nothing]\nctx-size = 12\n")
    with pytest.raises(ModelLoadError, match=r"\[nothing\]: no model, hf or upstream"):
        read_preset(preset, ServerSettings())
    preset.write_text("[m]\nmodel = a.gguf\nctx-size = lots\n")
    with pytest.raises(ModelLoadError, match=r"\[m\] ctx_size"):
        read_preset(preset, ServerSettings())


def test_two_models_under_one_name_stop_the_start(tmp_path: Path) -> None:
    gguf(tmp_path, "chat.gguf")
    s = parse_serve_args(["--models-dir", str(tmp_path), "--upstream", "chat=http://x:1"], environ={})
    with pytest.raises(ModelLoadError, match="two models are named 'chat'"):
        model_specs(s)


# ------------------------------------------------------------------ the decode turns


def test_decode_turns_serve_waiting_threads_in_arrival_order() -> None:
    turns = DecodeTurns()
    order: list[int] = []
    turns.acquire()
    threads = []
    for i in range(4):
        thread = threading.Thread(target=lambda i=i: (turns.acquire(), order.append(i), turns.release()))
        thread.start()
        threads.append(thread)
        while turns._next_ticket < i + 2:  # wait until thread i holds its ticket
            time.sleep(0.001)
    turns.release()
    for thread in threads:
        thread.join()
    assert order == [0, 1, 2, 3] and not turns.locked()


# ------------------------------------------------------------------ the registry


def registry(names: list[str], *, models_max: int = 0, autoload: bool = True,
             fail: set[str] = frozenset()) -> tuple[ModelRegistry, list[str]]:
    settings = ServerSettings(models_max=models_max, models_autoload=autoload)
    built: list[str] = []

    def factory(spec: ModelSpec, lock: object) -> ModelBackend:
        if spec.name in fail:
            raise ModelLoadError(f"cannot load model {spec.name}.gguf")
        built.append(spec.name)
        loaded = threading.Event()
        loaded.set()
        return LocalBackend(model_config(settings), ScriptedEngine(["x"], loaded=loaded), spec.name, spec.aliases)

    specs = [ModelSpec(name=n, aliases=(n, n + "-alias")) for n in names]
    return ModelRegistry(settings, specs, factory, router=True), built


def test_resolution_errors() -> None:
    reg, _ = registry(["a"])
    with pytest.raises(InvalidRequestError, match="model name is missing from the request"):
        reg.resolve(None)
    with pytest.raises(NotFoundError, match="model 'b' not found"):
        reg.resolve("b")
    assert reg.resolve("a-alias") is reg.entries["a"]


def test_lru_unloads_the_least_recently_used_idle_model() -> None:
    async def scenario() -> list[tuple[str, ...]]:
        reg, built = registry(["a", "b", "c"], models_max=2)
        seen = []
        for name in ("a", "b", "a", "c", "b"):
            entry, _ = await reg.acquire(name)
            reg.release(entry)
            seen.append(tuple(e.name for e in reg.entries.values() if e.state is ModelState.LOADED))
        assert built == ["a", "b", "c", "b"]
        return seen

    # b unloaded for c (a was used more recently); then a (least recent) unloaded for b
    assert asyncio.run(scenario()) == [("a",), ("a", "b"), ("a", "b"), ("a", "c"), ("b", "c")]


def test_a_model_in_use_is_not_unloaded_until_released() -> None:
    async def scenario() -> None:
        reg, _ = registry(["a", "b"], models_max=1)
        held, _ = await reg.acquire("a")
        waiting = asyncio.create_task(reg.acquire("b"))
        await asyncio.sleep(0.2)
        assert not waiting.done() and reg.entries["a"].state is ModelState.LOADED
        reg.release(held)
        entry, _ = await asyncio.wait_for(waiting, 5)
        assert entry.name == "b" and reg.entries["a"].state is ModelState.UNLOADED

    asyncio.run(scenario())


def test_a_load_waiting_for_room_drains_the_busy_model_it_replaces() -> None:
    """--models-max 1: while b waits for a's room, new requests for a wait outside a (they would keep
    it busy for ever); once a is unloaded and b has run, they load a again."""
    async def scenario() -> list[str]:
        reg, built = registry(["a", "b"], models_max=1)
        held, _ = await reg.acquire("a")  # a0: running on a
        for_b = asyncio.create_task(reg.acquire("b"))
        await asyncio.sleep(0.2)
        assert reg.entries["a"].draining and not for_b.done()
        for_a = asyncio.create_task(reg.acquire("a"))  # a1: comes after b's request
        await asyncio.sleep(0.2)
        assert not for_a.done() and reg.entries["a"].leases == 1  # waits outside a: only a0 holds it
        reg.release(held)  # a0 done: a is unloaded, b loads and b's request runs
        b_entry, _ = await asyncio.wait_for(for_b, 5)
        assert reg.entries["a"].state is ModelState.UNLOADED and not reg.entries["a"].draining
        await asyncio.sleep(0.2)
        assert not for_a.done() and reg.entries["b"].draining  # now a1's load waits for b's room
        reg.release(b_entry)
        a_entry, _ = await asyncio.wait_for(for_a, 5)
        reg.release(a_entry)
        return built

    assert asyncio.run(scenario()) == ["a", "b", "a"]


def test_no_autoload_and_load_failures() -> None:
    async def scenario() -> None:
        reg, _ = registry(["a"], autoload=False)
        with pytest.raises(InvalidRequestError, match="model is not loaded"):
            await reg.acquire("a")
        entry, _ = await reg.acquire("a", autoload=True)  # ?autoload=true
        assert entry.state is ModelState.LOADED
        broken, _ = registry(["bad"], fail={"bad"})
        with pytest.raises(ServerError, match="model 'bad' failed to load: cannot load model bad.gguf"):
            await broken.acquire("bad")
        assert broken.entries["bad"].state is ModelState.UNLOADED and "bad.gguf" in broken.entries["bad"].failure

    asyncio.run(scenario())


# ------------------------------------------------------------------ the upstream body


def test_chat_request_becomes_an_openai_body() -> None:
    req = ChatRequest(messages=(Message(role="user", parts=(TextPart("hi"),)),),
                      options=GenerationOptions(sampling=SamplingOptions({"temperature": 0.2, "top_k": 5}),
                                                max_tokens=7, stop=("\n",)))
    body = chat_body(req, "Qwen/Qwen3-32B", -1)
    assert body == {"model": "Qwen/Qwen3-32B", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                    "stream_options": {"include_usage": True}, "max_tokens": 7, "stop": ["\n"],
                    "temperature": 0.2, "top_k": 5}
    tools = (ToolSpec(name="f", parameters={"type": "object"}),)
    named = chat_body(ChatRequest(messages=req.messages, tools=tools, tool_choice=ToolChoice("required", "f"),
                                  parallel_tool_calls=True), "m", -1)
    assert named["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert named["tool_choice"] == {"type": "function", "function": {"name": "f"}} and named["parallel_tool_calls"]
    assert chat_body(ChatRequest(messages=req.messages, tools=tools), "m", -1)["tool_choice"] == "auto"
    with pytest.raises(InvalidRequestError, match="tool_choice"):  # kinetic's 400, before forwarding
        chat_body(ChatRequest(messages=req.messages, tool_choice=ToolChoice("required")), "m", -1)


def sse(*chunks: dict) -> httpx.Response:
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})


def test_upstream_stream_becomes_engine_events() -> None:
    async def events(response: httpx.Response) -> list:
        return [event async for event in read_events(response, is_chat=True)]

    got = asyncio.run(events(sse(
        {"choices": [{"delta": {"reasoning_content": "think"}}]},
        {"choices": [{"delta": {"content": "Hi"}}]},
        {"choices": [{"delta": {}, "finish_reason": "length"}],
         "usage": {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 3}},
         "timings": {"cache_n": 3, "prompt_n": 2, "prompt_ms": 4.0, "predicted_n": 2, "predicted_ms": 10.0}})))
    *deltas, finished = got
    assert [d.text for d in deltas] == ["<think>think", "</think>Hi"]  # split again by the answer parser
    assert finished.finish_reason == "length" and finished.usage == Usage(5, 2, 3)
    assert finished.timings == Timings(cache_n=3, prompt_n=2, prompt_ms=4.0, predicted_n=2, predicted_ms=10.0)
    # streamed call deltas are gathered and given as structure on the end event, the upstream's id kept
    *texts, ended = asyncio.run(events(sse(
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "abc",
                                                "function": {"name": "f", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]})))
    assert texts == [] and ended.text == ""
    assert ended.calls == (StructuredCall(name="f", arguments='{"x": 1}', id="abc"),)
    with pytest.raises(ServerError, match="upstream: boom"):
        asyncio.run(events(sse({"error": {"message": "boom"}})))


def test_upstream_4xx_keeps_its_kind_and_message() -> None:
    err = upstream_error(400, b'{"error": {"message": "bad temperature"}}')
    assert isinstance(err, InvalidRequestError) and err.message == "upstream: bad temperature"
    assert isinstance(upstream_error(404, b"no such model"), NotFoundError)


def test_token_routes_go_to_the_upstreams_root_or_are_a_501_naming_the_route() -> None:
    seen: list[tuple[str, dict]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        if request.url.host == "vllm":  # an OpenAI-only server: no native routes
            return httpx.Response(404, json={"detail": "Not Found"})
        if request.url.path == "/detokenize":
            return httpx.Response(400, json={"error": {"message": "tokens must be a list"}})
        return httpx.Response(200, json={"tokens": [1, 2]})

    async def scenario() -> None:
        for host in ("llama", "vllm"):
            spec = ModelSpec(name=host, upstreams=(UpstreamSpec(url=f"http://{host}:8000/v1", model="m"),))
            engine = UpstreamBackend(spec, ModelConfig())
            engine.pool._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
            if host == "llama":
                assert await engine.forward_token_route("/tokenize", {"content": "hi"}) == {"tokens": [1, 2]}
                with pytest.raises(InvalidRequestError, match="upstream: tokens must be a list"):
                    await engine.forward_token_route("/detokenize", {"tokens": "x"})
            else:
                with pytest.raises(NotSupportedError, match=r"cannot serve /tokenize: its upstream server "
                                                            r"\(http://vllm:8000/v1\) has no such route"):
                    await engine.forward_token_route("/tokenize", {"content": "hi"})
            await engine.pool.close()

    asyncio.run(scenario())
    assert seen[0] == ("/tokenize", {"content": "hi", "model": "m"})  # the root, not /v1
