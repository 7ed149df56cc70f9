"""The llama engine's faults, on the real bundled model in this process: close() fails running and
waiting requests at once and gives back their counts; the decode thread survives a failure while it
starts a request or decodes a step; the /metrics rate baseline, the waiting count's lock, and a load
whose embedding context fails. A failure is injected by replacing one scheduler method on the real
engine: a real model cannot be made to fail on demand."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kinetic.backends.bundled import gemma_model_path
from kinetic.engine.llama import LlamaEngine
from kinetic.engine.llama.compute_thread import COMPUTE_THREAD
from kinetic.engine.llama.scheduler import Scheduler
from kinetic.engine.options import EngineConfig
from kinetic.engine.types import EngineStats, GenerationRequest, TextDelta
from kinetic.errors import KineticError, ServerError, UnavailableError
from kinetic.scheduling.inflight import InFlight

pytestmark = pytest.mark.e2e


@pytest.fixture()
def engine(model_lock: None) -> Iterator[LlamaEngine]:
    in_flight = InFlight(0)
    loaded = LlamaEngine(gemma_model_path(), EngineConfig(n_ctx=1024, n_parallel=2), in_flight=in_flight)
    loaded.load()
    yield loaded
    loaded.close()


def request(engine: LlamaEngine, client: str, max_tokens: int = 400) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=engine.tokenize("Once upon a time, in a lighthouse,"),
                             max_tokens=max_tokens, client=client)


async def first_text(generation: Any) -> Any:
    events = generation.events()
    while not isinstance(await events.__anext__(), TextDelta):
        pass
    return events


async def outcome(events: Any) -> str | KineticError:
    try:
        async for _ in events:
            pass
    except KineticError as err:
        return err
    return "finished"


def scheduler_of(engine: LlamaEngine) -> Scheduler:
    scheduler = engine._scheduler
    assert scheduler is not None
    return scheduler


def test_close_fails_running_and_waiting_requests_at_once_and_gives_back_their_counts(engine: LlamaEngine) -> None:
    in_flight = engine.in_flight
    assert in_flight is not None

    async def run() -> None:
        late = request(engine, "dave")  # tokenized while the model is there: it races the unload
        running = [await engine.submit(request(engine, name)) for name in ("alice", "bob")]
        waiting = await engine.submit(request(engine, "carol"))  # two slots: this one waits
        streams = [await first_text(g) for g in running]
        assert scheduler_of(engine).n_deferred == 1 and in_flight.counts() == {"alice": 1, "bob": 1, "carol": 1}
        closed = time.monotonic()
        await asyncio.to_thread(engine.close, UnavailableError("the model was unloaded"))
        results = await asyncio.gather(*(outcome(s) for s in streams), outcome(waiting.events()))
        took = time.monotonic() - closed
        assert all(isinstance(r, UnavailableError) and "unloaded" in r.message for r in results), results
        assert in_flight.counts() == {}
        print(f"engine closed: its 2 running and 1 waiting requests failed in {took:.2f} s")
        assert took < 1.0
        with pytest.raises(UnavailableError, match="unloaded"):  # not "is an embedding model"
            await engine.submit(late)

    asyncio.run(run())


def test_the_decode_thread_survives_a_failure_starting_a_request(engine: LlamaEngine,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = scheduler_of(engine)
    real_start = scheduler._start
    failures = iter([RuntimeError("host cache copy failed")])

    def start_once_failing(slot: Any, job: Any) -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        real_start(slot, job)

    monkeypatch.setattr(scheduler, "_start", start_once_failing)

    async def run() -> None:
        failed = await outcome((await engine.submit(request(engine, "alice", 4))).events())
        assert isinstance(failed, ServerError) and "host cache copy failed" in failed.message
        assert await outcome((await engine.submit(request(engine, "alice", 4))).events()) == "finished"
        assert engine.in_flight is not None and engine.in_flight.counts() == {}

    asyncio.run(run())
    assert COMPUTE_THREAD.is_alive()


def test_the_decode_thread_survives_a_failing_step(engine: LlamaEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = scheduler_of(engine)
    real_step = scheduler._step
    failures = iter([RuntimeError("llama_decode blew up")])

    def step_once_failing() -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        real_step()

    monkeypatch.setattr(scheduler, "_step", step_once_failing)

    async def run() -> None:
        failed = await outcome((await engine.submit(request(engine, "alice", 4))).events())
        assert isinstance(failed, ServerError) and "blew up" in failed.message
        assert await outcome((await engine.submit(request(engine, "alice", 4))).events()) == "finished"

    asyncio.run(run())
    assert COMPUTE_THREAD.is_alive()


def test_only_a_metrics_scrape_moves_the_rate_baseline(engine: LlamaEngine) -> None:
    async def generate() -> None:
        assert await outcome((await engine.submit(request(engine, "alice", 8))).events()) == "finished"

    asyncio.run(generate())
    for _ in range(3):  # the dashboard, the router's room-making, the digest: readers, not scrapes
        engine.stats()
    scraped: EngineStats = engine.stats(scrape=True)
    assert scraped.gauges["predicted_tokens_seconds"] > 0 and scraped.gauges["prompt_tokens_seconds"] > 0
    assert engine.stats(scrape=True).gauges["predicted_tokens_seconds"] == 0  # nothing since that scrape


def test_the_waiting_count_is_read_under_the_lock(engine: LlamaEngine) -> None:
    scheduler = scheduler_of(engine)
    read = threading.Event()
    with scheduler._cv:  # the decode thread holds the queue
        reader = threading.Thread(target=lambda: (scheduler.n_deferred, read.set()), daemon=True)
        reader.start()
        assert not read.wait(0.3)
    assert read.wait(5)


def test_a_failed_embedding_context_takes_the_scheduler_with_it(model_lock: None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def no_embeddings(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("llama.cpp could not create the embedding context")

    monkeypatch.setattr("kinetic.engine.llama.engine.EmbeddingContext", no_embeddings)
    before = sum(1 for t in threading.enumerate() if t.name == "kinetic-decode")
    engine = LlamaEngine(gemma_model_path(), EngineConfig(n_ctx=512, n_parallel=1, embeddings=True))
    with pytest.raises(RuntimeError, match="embedding context"):
        engine.load()
    assert sum(1 for t in threading.enumerate() if t.name == "kinetic-decode") == before  # no thread left behind
