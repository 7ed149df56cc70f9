"""Every llama.cpp computation of the process runs on one thread, on the real models in this process: the load's
warm-up, the projector's loading (mtmd warms up with an encode), generation, embeddings and reranking, for every
model loaded. A decode on any other thread leaves libgomp with more OpenMP threads than CPUs, and every later decode
slows down (compute_thread.py). The decodes are watched by wrapping llama_cpp.llama_decode, which still runs them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from kinetic.backends.bundled import gemma_model_path
from kinetic.engine.llama import LlamaEngine, media
from kinetic.engine.options import EngineConfig, ProjectorOptions
from kinetic.engine.types import Finished, GenerationRequest, SamplingParams, TextDelta
from kinetic.errors import UnavailableError
from tests.embedding_model import embedding_gguf
from tests.projector_model import tiny_projector

pytestmark = pytest.mark.e2e


@pytest.fixture()
def decoding_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of each llama_decode from now on."""
    names: list[str] = []
    real = llama_cpp.llama_decode

    def watched(ctx: Any, batch: Any) -> int:
        names.append(threading.current_thread().name)
        return int(real(ctx, batch))

    monkeypatch.setattr(llama_cpp, "llama_decode", watched)
    return names


@pytest.fixture()
def projector_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each projector was loaded on."""
    names: list[str] = []

    class Watched(media.Projector):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            names.append(threading.current_thread().name)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr("kinetic.engine.llama.engine.Projector", Watched)
    return names


@pytest.fixture()
def engine(model_lock: None, decoding_threads: list[str], projector_threads: list[str]) -> Iterator[LlamaEngine]:
    config = EngineConfig(n_ctx=1024, n_parallel=2, embeddings=True,
                          projector=ProjectorOptions(path=str(tiny_projector("gemma3"))))
    loaded = LlamaEngine(gemma_model_path(), config)
    loaded.load()
    yield loaded
    loaded.close()


def generate(engine: LlamaEngine, max_tokens: int) -> Finished:
    async def run() -> Finished:
        request = GenerationRequest(prompt_tokens=engine.tokenize("Once upon a time"), max_tokens=max_tokens)
        async for event in (await engine.submit(request)).events():
            if isinstance(event, Finished):
                return event
        raise AssertionError("the generation ended without its Finished event")

    return asyncio.run(run())


def test_the_warm_up_projector_generation_and_embeddings_run_on_the_decode_thread(
        engine: LlamaEngine, decoding_threads: list[str], projector_threads: list[str]) -> None:
    assert decoding_threads == ["kinetic-decode"]  # the load's warm-up
    assert projector_threads == ["kinetic-decode"]
    assert generate(engine, 4).usage.completion_tokens == 4
    vectors = engine.embed([engine.tokenize("a lighthouse"), engine.tokenize("the sea")])  # called from this thread
    assert len(vectors) == 2 and len(vectors[0]) == engine.require_ready().n_embd
    assert len(decoding_threads) >= 1 + 4 + 2
    assert set(decoding_threads) == {"kinetic-decode"}


def test_a_stream_goes_on_while_an_embedding_of_many_inputs_runs(engine: LlamaEngine) -> None:
    """Each input is a call of its own, and with streams running calls and steps alternate: a request of many
    inputs once held every stream still until its last input (a 12.6 s gap for 32 inputs on this model)."""
    inputs = [engine.tokenize("The lighthouse keeper wrote in his log about the sea and the ships. " * 4)] * 6

    async def run() -> tuple[list[float], float, float]:
        request = GenerationRequest(prompt_tokens=engine.tokenize("Once upon a time"), max_tokens=400,
                                    sampling=SamplingParams(ignore_eos=True))
        generation = await engine.submit(request)
        stamps: list[float] = []
        window: list[float] = []

        async def embed_after_a_few_tokens() -> None:
            while len(stamps) < 3:
                await asyncio.sleep(0.01)
            window.append(time.perf_counter())
            vectors = await asyncio.to_thread(engine.embed, inputs)
            window.append(time.perf_counter())
            assert len(vectors) == len(inputs)

        embedding = asyncio.create_task(embed_after_a_few_tokens())
        async for event in generation.events():
            if isinstance(event, TextDelta):
                stamps.append(time.perf_counter())
            if embedding.done():  # a cancelled generation sends nothing more: stop reading it
                generation.cancel()
                break
        await embedding
        return stamps, window[0], window[1]

    stamps, started, ended = asyncio.run(run())
    during = [t for t in stamps if started < t < ended]
    assert len(during) >= len(inputs) - 1, (len(during), ended - started)


def test_work_handed_to_the_decode_thread_gives_back_its_result_or_its_error(engine: LlamaEngine) -> None:
    scheduler = engine._scheduler
    assert scheduler is not None
    assert scheduler.call(lambda: threading.current_thread().name) == "kinetic-decode"
    with pytest.raises(ZeroDivisionError):
        scheduler.call(lambda: 1 // 0)
    assert generate(engine, 2).usage.completion_tokens == 2  # the decode thread went on
    engine.close()
    with pytest.raises(UnavailableError):
        scheduler.call(lambda: None)


def test_an_embedding_only_model_computes_on_the_compute_thread(model_lock: None,
                                                                decoding_threads: list[str]) -> None:
    path = embedding_gguf()
    if path is None:
        pytest.skip("the embedding model's weights package is not installed")
    engine = LlamaEngine(Path(path), EngineConfig(n_ctx=512))
    engine.load()
    try:
        assert not engine.can_generate
        for text in ("a lighthouse", "the sea", "a ship"):  # each call from a worker thread of its own
            worker = threading.Thread(target=engine.embed, args=([engine.tokenize(text)],))
            worker.start()
            worker.join()
        assert decoding_threads == ["kinetic-decode"] * 3
    finally:
        engine.close()
    with pytest.raises(UnavailableError):
        engine.embed([[1, 2, 3]])


def test_every_model_of_a_process_computes_on_one_thread_and_one_unload_leaves_the_others(
        engine: LlamaEngine, decoding_threads: list[str]) -> None:
    """A router's models: a second chat model and an embedding-only model loaded beside the first share its thread
    (a thread of their own would slow every model's decodes down); unloading one stops none of the others."""
    path = embedding_gguf()
    if path is None:
        pytest.skip("the embedding model's weights package is not installed")
    second = LlamaEngine(gemma_model_path(), EngineConfig(n_ctx=512, n_parallel=1))
    encoder = LlamaEngine(Path(path), EngineConfig(n_ctx=512))
    second.load()
    encoder.load()
    try:
        assert generate(second, 3).usage.completion_tokens == 3
        assert len(encoder.embed([encoder.tokenize("a lighthouse")])) == 1
        second.close()
        assert generate(engine, 3).usage.completion_tokens == 3
        assert len(encoder.embed([encoder.tokenize("the sea")])) == 1
        encoder.close()
        assert generate(engine, 2).usage.completion_tokens == 2
        assert set(decoding_threads) == {"kinetic-decode"}
        assert [t.name for t in threading.enumerate()].count("kinetic-decode") == 1
    finally:
        second.close()
        encoder.close()
