"""Issue 23 parts 5 and 7 without a model: control vectors (files summed as llama.cpp's common sums them),
--rerank and /rerank's JSON, --sleep-idle-seconds (on a scripted engine), --sse-ping-interval's pings, --perf
and the logging flags. Their effect on a served model: tests/e2e/test_server_flags_more.py."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import gguf
import numpy as np
import pytest

from kinetic.backends.prompt_log import write_prompt
from kinetic.config.args import parse_serve_args
from kinetic.config.settings import ServerSettings, SettingsError
from kinetic.engine.llama.control_vector import load_control_vectors
from kinetic.engine.llama.params import context_params
from kinetic.engine.options import LlamaOptions
from kinetic.engine.types import RankScore
from kinetic.errors import InvalidRequestError, ModelLoadError
from kinetic.model_registry import idle_sleep
from kinetic.model_registry.registry import ModelRegistry
from kinetic.protocols.common.sse_ping import PING, with_pings
from kinetic.protocols.llamacpp.rerank import rerank_request, to_rerank_body
from kinetic.server.log_setup import configure_logging
from tests.control_vector_model import write_control_vector
from tests.scripted import ScriptedEngine, single_model_backend


def test_control_vector_flags_become_options(tmp_path: Path) -> None:
    a, b, c = (write_control_vector(tmp_path / f"{n}.gguf", seed=i) for i, n in enumerate("abc"))
    s = parse_serve_args(["--control-vector", f"{a},{b}", "--control-vector-scaled", f"{c}:-0.5",
                          "--control-vector-layer-range", "2", "5", "-np", "1"], environ={})
    options = s.llama_options()
    assert options.control_vectors == ((str(a), 1.0), (str(b), 1.0), (str(c), -0.5))
    assert options.control_vector_layers == (2, 5) and s.parallel == 1  # the range read its two values
    assert parse_serve_args([], environ={}).llama_options().control_vector_layers == (-1, -1)
    assert options.describe()["control_vectors"][2] == {"path": str(c), "scale": -0.5}
    for argv, message in ((["--control-vector", "/no/such.gguf"], "for --control-vector: '/no/such.gguf'"),
                          (["--control-vector-scaled", str(a)], "for --control-vector-scaled: .* FNAME:SCALE"),
                          (["--control-vector-layer-range", "1", "x"], "for --control-vector-layer-range")):
        with pytest.raises(SettingsError, match=message):
            parse_serve_args(argv, environ={})


def test_control_vectors_are_scaled_and_summed_as_llama_cpp_sums_them(tmp_path: Path) -> None:
    a = write_control_vector(tmp_path / "a.gguf", seed=1, layers=3, n_embd=4)
    b = write_control_vector(tmp_path / "b.gguf", seed=2, layers=5, n_embd=4)
    directions = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(a)).tensors}
    summed = load_control_vectors([(str(a), 2.0), (str(b), 1.0)]).data
    assert summed.shape == (5, 4)  # layers 1..5: the longer file sets the length
    only_b = load_control_vectors([(str(b), 1.0)]).data
    assert np.allclose(summed[0], 2 * directions["direction.1"] + only_b[0])
    assert np.allclose(summed[4], only_b[4])
    assert not load_control_vectors([(str(a), 1.0), (str(a), -1.0)]).data.any()  # a vector and its negative


def test_a_file_that_is_no_control_vector_is_refused_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "lora.gguf"
    writer = gguf.GGUFWriter(str(bad), arch="gemma3")
    writer.add_tensor("blk.0.ffn_down.weight.lora_a", np.zeros((2, 4), dtype=np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    with pytest.raises(ModelLoadError, match="lora.gguf: tensor 'blk.0.ffn_down.weight.lora_a' is not direction"):
        load_control_vectors([(str(bad), 1.0)])
    small = write_control_vector(tmp_path / "small.gguf", n_embd=4)
    big = write_control_vector(tmp_path / "big.gguf", n_embd=8)
    with pytest.raises(ModelLoadError, match="big.gguf: its directions have 8 values, the ones before 4"):
        load_control_vectors([(str(small), 1.0), (str(big), 1.0)])


def test_rerank_flag_sets_embeddings_and_rank_pooling() -> None:
    for argv, environ in ((["--rerank"], {}), (["--reranking", "--pooling", "mean"], {}),
                          ([], {"LLAMA_ARG_RERANKING": "1"})):
        s = parse_serve_args(argv, environ=environ)
        assert (s.rerank, s.embeddings, s.pooling) == (True, True, "rank")
    assert parse_serve_args([], environ={}).pooling is None


@pytest.mark.parametrize(("body", "message"), [
    ({"documents": ["a"]}, '"query" must be provided'),
    ({"query": 1, "documents": ["a"]}, '"query" must be a string'),
    ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": None}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": 123}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [1, 2, 3]}, '"documents" must be a non-empty string array'),
    ({"query": "q"}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": ["a"], "top_n": "2"}, '"top_n" must be an integer'),
])
def test_bad_rerank_bodies_are_a_400_naming_the_field(body: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        rerank_request(body)


def test_rerank_bodies_follow_llama_server() -> None:
    scores = [RankScore(0.1, 5), RankScore(2.0, 7), RankScore(-1.0, 3)]
    jina = rerank_request({"query": "q", "documents": ["a", "b", "c"], "top_n": 2})
    assert to_rerank_body(jina, scores, model="m") == {
        "model": "m", "object": "list", "usage": {"prompt_tokens": 15, "total_tokens": 15},
        "results": [{"index": 1, "relevance_score": 2.0}, {"index": 0, "relevance_score": 0.1}]}
    asked = rerank_request({"query": "q", "documents": ["a", "b", "c"], "model": "x", "return_documents": True})
    body = to_rerank_body(asked, scores, model="m")
    assert body["model"] == "x"
    assert body["results"][0] == {"index": 1, "relevance_score": 2.0, "document": {"text": "b"}}
    tei = rerank_request({"query": "q", "texts": ["a", "b", "c"], "return_text": True, "top_n": 99})
    assert to_rerank_body(tei, scores, model="m") == [{"index": 1, "score": 2.0, "text": "b"},
                                                     {"index": 0, "score": 0.1, "text": "a"},
                                                     {"index": 2, "score": -1.0, "text": "c"}]
    plain_tei = rerank_request({"query": "q", "texts": ["a", "b", "c"]})
    assert to_rerank_body(plain_tei, scores, model="m")[2] == {"index": 2, "score": -1.0}


def test_sleep_idle_seconds_takes_llama_servers_values() -> None:
    assert parse_serve_args([], environ={}).sleep_idle_seconds == -1
    assert parse_serve_args(["--sleep-idle-seconds", "30"], environ={}).sleep_idle_seconds == 30
    for bad in ("0", "-2"):
        with pytest.raises(SettingsError, match="for --sleep-idle-seconds: cannot be 0 or less than -1"):
            parse_serve_args(["--sleep-idle-seconds", bad], environ={})


def test_perf_reaches_the_context_params() -> None:
    def built(options: LlamaOptions) -> bool:
        return context_params(options, n_ctx=256, n_batch=256, n_ubatch=256, n_seq_max=1, n_threads=1,
                              kv_unified=True).no_perf

    assert built(LlamaOptions()) is True
    assert built(parse_serve_args(["--perf"], environ={}).llama_options()) is False
    assert parse_serve_args(["--perf", "--no-perf"], environ={}).perf is False


async def slow_frames(gaps: list[float]) -> AsyncIterator[bytes]:
    for index, gap in enumerate(gaps):
        await asyncio.sleep(gap)
        yield f"data: {index}\n\n".encode()


def test_a_silent_stream_gets_pings_and_a_busy_one_none() -> None:
    async def collect(gaps: list[float], interval: float) -> list[bytes]:
        return [frame async for frame in with_pings(slow_frames(gaps), interval)]

    frames = asyncio.run(collect([0.35, 0.0], 0.1))
    assert frames[-2:] == [b"data: 0\n\n", b"data: 1\n\n"] and 2 <= frames.count(PING) <= 4
    assert PING not in asyncio.run(collect([0.0, 0.0, 0.0], 0.1))

    async def close_early() -> None:
        stream = with_pings(slow_frames([0.0, 5.0]), 0.05)
        assert await stream.__anext__() == b"data: 0\n\n"
        assert await stream.__anext__() == PING
        await stream.aclose()  # the pending frame is cancelled, the source closed

    asyncio.run(asyncio.wait_for(close_early(), 2))


def test_logging_flags_shape_the_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger("kinetic-test-logging")
    root.propagate = False

    def lines(*argv: str) -> list[str]:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        log_file = tmp_path / "out.log"
        log_file.unlink(missing_ok=True)
        configure_logging(parse_serve_args([*argv, "--log-file", str(log_file)], environ={}), root)
        root.debug("debugging"), root.info("informing"), root.warning("warning you")
        return log_file.read_text().splitlines()

    assert lines() == ["INFO kinetic-test-logging: informing", "WARNING kinetic-test-logging: warning you"]
    assert lines("-lv", "2") == ["WARNING kinetic-test-logging: warning you"]
    assert lines("--log-verbosity", "4")[0] == "DEBUG kinetic-test-logging: debugging"
    assert lines("-lv", "0") == []
    assert lines("--no-log-prefix") == ["informing", "warning you"]
    assert lines("--log-colors", "on") == lines()  # colours only on the terminal's stream, never in a file
    jsonl = [json.loads(line) for line in lines("--log-jsonl")]
    assert jsonl == [{"type": "log", "time": 0, "level": "info", "msg": "informing"},
                     {"type": "log", "time": 0, "level": "warn", "msg": "warning you"}]
    assert json.loads(lines("--log-jsonl", "--log-timestamps")[0])["time"] > 0

    stream = logging.StreamHandler()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(stream)
    configure_logging(parse_serve_args(["--log-colors", "on"], environ={}), root)
    assert "\033[35mWARNING\033[0m" in stream.format(root.makeRecord(root.name, logging.WARNING, "", 0, "w", (),
                                                                        None))
    configure_logging(parse_serve_args(["--log-colors", "auto"], environ={}), root)  # stderr is no terminal here
    assert "\033" not in stream.format(root.makeRecord(root.name, logging.WARNING, "", 0, "w", (), None))
    root.removeHandler(stream)


def test_log_prompts_dir_writes_one_file_a_prompt(tmp_path: Path) -> None:
    folder = tmp_path / "prompts" / "deeper"
    root = logging.getLogger("kinetic-test-prompts")
    configure_logging(parse_serve_args(["--log-prompts-dir", str(folder)], environ={}), root)
    assert folder.is_dir()  # created at start, as llama-server creates it
    first, second = write_prompt(str(folder), "<bos>one"), write_prompt(str(folder), "<bos>two")
    assert first is not None and second is not None and first != second
    assert first.stem.isdigit() and len(first.stem) == 12 and first.read_text() == "<bos>one"
    assert write_prompt(str(tmp_path / "missing"), "x") is None


class SleepyEngine(ScriptedEngine):
    """A scripted engine that counts its sleeps and wake-ups (LlamaEngine.sleep and wake unload and reload)."""

    def __init__(self) -> None:
        super().__init__([])
        self.sleeping = False
        self.calls: list[str] = []

    def sleep(self) -> None:
        self.calls.append("sleep")
        self.sleeping, self._ready = True, False

    def wake(self) -> None:
        self.calls.append("wake")
        self.sleeping, self._ready = False, True


def test_an_idle_model_sleeps_and_a_request_wakes_it_but_a_look_does_not() -> None:
    async def scenario() -> None:
        engine = SleepyEngine()
        engine.loaded.set()
        settings = ServerSettings(sleep_idle_seconds=1)
        registry = ModelRegistry.single(settings, single_model_backend(settings, engine, "m"))
        await registry.load(registry.only)  # loaded and announced, as the app's start does it
        registry.announced = True
        assert registry.sleeper is not None and ModelRegistry.single(
            ServerSettings(), single_model_backend(ServerSettings(), engine, "m")).sleeper is None
        registry.sleeper.seconds = 0.2
        async with idle_sleep.watching(registry.sleeper):
            await asyncio.sleep(0.1)
            assert engine.calls == []  # the idle time counts from the start, not from the epoch
            entry, _ = await registry.acquire(None)
            await asyncio.sleep(0.4)
            assert engine.calls == []  # a request in flight keeps it awake
            registry.release(entry)
            await asyncio.sleep(0.4)
            assert engine.calls == ["sleep"] and registry.ready and registry.only.sleeping
            for _ in range(3):  # /props and /metrics look without waking it or resetting its idle time
                entry, _ = await registry.acquire(None, wake=False)
                registry.release(entry, used=False)
            assert engine.calls == ["sleep"]
            entry, _ = await registry.acquire(None)
            assert engine.calls == ["sleep", "wake"] and not registry.only.sleeping
            registry.release(entry)

    asyncio.run(asyncio.wait_for(scenario(), 5))
