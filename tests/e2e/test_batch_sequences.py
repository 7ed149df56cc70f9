"""Requests that run together on slots of their own (-np without -kvu) get slots whose ids follow on, and each step
puts them in the batch in increasing order: llama.cpp reads such sequences in one ubatch only then
(admission._busy_neighbours), and otherwise computes the graph once per run of ids. Watched on the tiny LFM2 in this
process by wrapping llama_cpp.llama_decode, which still runs every batch."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import llama_cpp
import pytest

from kinetic.engine.llama import LlamaEngine
from kinetic.engine.options import EngineConfig, LlamaOptions
from kinetic.engine.types import Finished, GenerationRequest, SamplingParams
from tests.hybrid_model import tiny_model

pytestmark = pytest.mark.e2e

N_SLOTS = 8


@pytest.fixture()
def batches(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The sequence id of each token of each llama_decode from now on."""
    seen: list[list[int]] = []
    real = llama_cpp.llama_decode

    def watched(ctx: Any, batch: Any) -> int:
        seen.append([batch.seq_id[i][0] for i in range(batch.n_tokens)])
        return int(real(ctx, batch))

    monkeypatch.setattr(llama_cpp, "llama_decode", watched)
    return seen


def engine_with(kv_unified: bool) -> LlamaEngine:
    engine = LlamaEngine(tiny_model("lfm2"), EngineConfig(n_ctx=N_SLOTS * 128, n_parallel=N_SLOTS,
                                                          options=LlamaOptions(kv_unified=kv_unified)))
    engine.load()
    return engine


@pytest.fixture()
def engine(model_lock: None) -> Iterator[LlamaEngine]:
    loaded = engine_with(kv_unified=False)
    yield loaded
    loaded.close()


def run(engine: LlamaEngine, requests: list[GenerationRequest]) -> list[int]:
    """Starts `requests` in one step and reads them to the end; the slot each one ran on."""
    async def every() -> list[int]:
        generations = await engine.submit_many(requests)
        slots = []
        for generation in generations:
            async for event in generation.events():
                if isinstance(event, Finished):
                    slots.append(event.id_slot)
        return slots

    return asyncio.run(every())


def request(engine: LlamaEngine, text: str, id_slot: int = -1) -> GenerationRequest:
    return GenerationRequest(prompt_tokens=engine.tokenize(text), max_tokens=3, id_slot=id_slot,
                             sampling=SamplingParams(temperature=0.0))


def runs_of_ids(batch: list[int]) -> int:
    """How many ubatches llama.cpp's sequential split makes of a batch: a new one wherever an id does not follow on."""
    ids = [seq for i, seq in enumerate(batch) if i == 0 or seq != batch[i - 1]]
    return 1 + sum(1 for a, b in zip(ids, ids[1:], strict=False) if b != a + 1)


def test_requests_started_together_take_neighbouring_slots_and_share_each_ubatch(
        engine: LlamaEngine, batches: list[list[int]]) -> None:
    # slots 2, 5 and 7 used last, in that order: the least recently used ones are 0, 1, 3, 4 and 6, which would
    # split four requests into the runs 0-1 and 3-4
    for slot in (2, 5, 7):
        assert run(engine, [request(engine, f"A question for slot {slot}.", id_slot=slot)]) == [slot]
    batches.clear()
    slots = run(engine, [request(engine, f"Student {name} asks about caches.") for name in "ABCD"])
    assert sorted(slots) == list(range(min(slots), min(slots) + 4)), slots
    assert batches, "no decode was watched"
    assert all(runs_of_ids(batch) == 1 for batch in batches), batches


def test_a_slot_that_fills_a_gap_between_running_requests_is_taken_first(
        engine: LlamaEngine, batches: list[list[int]]) -> None:
    long = GenerationRequest(prompt_tokens=engine.tokenize("A long answer, on slot three."), max_tokens=40, id_slot=3,
                             sampling=SamplingParams(temperature=0.0))
    other = GenerationRequest(prompt_tokens=engine.tokenize("Another one, on slot five."), max_tokens=40, id_slot=5,
                              sampling=SamplingParams(temperature=0.0))

    async def both_then_one() -> int:
        running = await engine.submit_many([long, other])
        joined = await engine.submit(request(engine, "A third request, anywhere."))
        slot = -1
        for generation in (*running, joined):
            async for event in generation.events():
                if isinstance(event, Finished) and generation is joined:
                    slot = event.id_slot
        return slot

    assert asyncio.run(both_then_one()) == 4  # between 3 and 5: one run of ids again


def test_a_unified_pool_keeps_the_least_recently_used_slot(model_lock: None) -> None:
    engine = engine_with(kv_unified=True)
    try:
        for slot in (2, 5, 7):
            run(engine, [request(engine, f"A question for slot {slot}.", id_slot=slot)])
        # one cell pool splits by token whatever the ids: the least recently used slots, in order
        assert sorted(run(engine, [request(engine, f"Student {name} asks.") for name in "ABCD"])) == [0, 1, 3, 4]
    finally:
        engine.close()
