"""Context shift and cache reuse (kinetic.engine.llama.context_shift) as llama-server computes them, on a
fake memory that records the cell moves; the flags that set them."""

from __future__ import annotations

import logging

import pytest

from kinetic.cli import parse_serve_args
from kinetic.engine.llama.context_shift import allowed, reuse_chunks, shift, shift_span
from kinetic.engine.options import LongContext
from kinetic.errors import InvalidRequestError
from kinetic.protocols.common.translate import generation_options
from kinetic.protocols.common.types import SamplingFields


class RecordingCells:
    """The cells of sequences as {position: token}, moved the way llama_memory_seq_rm/seq_add move them."""

    def __init__(self, tokens: list[int]):
        self.cells = dict(enumerate(tokens))
        self.calls: list[tuple[str, int, int, int]] = []

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        self.calls.append(("rm", p0, p1, 0))
        end = p1 if p1 >= 0 else max(self.cells, default=-1) + 1
        for pos in range(p0, end):
            self.cells.pop(pos, None)
        return True

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.calls.append(("add", p0, p1, delta))
        moved = {pos: token for pos, token in self.cells.items() if p0 <= pos < p1}
        for pos in moved:
            del self.cells[pos]
        self.cells.update({pos + delta: token for pos, token in moved.items()})

    def held(self) -> list[int]:
        assert sorted(self.cells) == list(range(len(self.cells))), "the positions must stay contiguous"
        return [self.cells[pos] for pos in sorted(self.cells)]


def test_shift_span_is_llama_servers() -> None:
    # a full 256-token slot, n_keep 0 but BOS kept: half of the other 255 tokens go
    assert shift_span(255, 0, 20, add_bos=True, n_ctx=256) == (1, 127)
    assert shift_span(255, 8, 20, add_bos=False, n_ctx=256) == (8, 123)
    assert shift_span(255, -1, 20, add_bos=True, n_ctx=256) == (21, 117)  # -1: the whole prompt
    assert shift_span(255, 1000, 20, add_bos=True, n_ctx=256) == (252, 1)  # at most n_ctx - 4 kept
    # a request's n_discard instead of half, never all of what follows n_keep
    assert shift_span(255, 8, 20, add_bos=False, n_ctx=256, n_discard=10) == (8, 10)
    assert shift_span(255, 8, 20, add_bos=False, n_ctx=256, n_discard=500) == (8, 246)


def test_shift_drops_the_tokens_after_n_keep_and_moves_the_rest_down() -> None:
    tokens = list(range(100, 110))
    cells = RecordingCells(tokens)
    held = shift(cells, 0, tokens, 2, 4)
    assert held == [100, 101, 106, 107, 108, 109] == cells.held()
    assert cells.calls == [("rm", 2, 6, 0), ("add", 6, 10, -4)]


def reuse(cached: list[int], prompt: list[int], n_past: int, *, min_chunk: int = 3,
          movable_from: int = 0) -> tuple[list[int], RecordingCells]:
    cells = RecordingCells(cached)
    held = reuse_chunks(cells, 0, cached, prompt, n_past, min_chunk=min_chunk, limit=len(prompt) - 1,
                        movable_from=movable_from)
    cells.seq_rm(0, len(held), -1)  # what the scheduler does next
    return held, cells


HEAD, MIDDLE, TAIL = [1, 2, 3], [50, 51, 52, 53], [7, 8, 9, 10, 11]


def test_a_removed_middle_lets_the_tail_move_down() -> None:
    held, cells = reuse(HEAD + MIDDLE + TAIL + [99], HEAD + TAIL + [12], 3)
    assert held == HEAD + TAIL == cells.held()


def test_a_changed_middle_reuses_nothing_as_in_llama_server() -> None:
    """The search only skips cached tokens: the prompt's replacement text never matches."""
    held, cells = reuse(HEAD + MIDDLE + TAIL, HEAD + [60, 61] + TAIL + [12], 3)
    assert held == HEAD == cells.held()


def test_chunks_below_the_minimum_and_shared_cells_stay() -> None:
    assert reuse(HEAD + MIDDLE + TAIL, HEAD + TAIL + [12], 3, min_chunk=6)[0] == HEAD
    assert reuse(HEAD + MIDDLE + TAIL, HEAD + TAIL + [12], 3, movable_from=len(HEAD + MIDDLE) + 1)[0] == HEAD


def test_the_last_prompt_token_is_never_taken_from_the_cache() -> None:
    held, _ = reuse(HEAD + MIDDLE + TAIL, HEAD + TAIL, 3)
    assert held == HEAD + TAIL[:-1]


def test_memories_that_cannot_shift_turn_both_off_with_llama_servers_warnings(
        caplog: pytest.LogCaptureFixture) -> None:
    wanted = LongContext(context_shift=True, cache_reuse=64, slot_limit=128)
    assert allowed(wanted, can_shift=True, exact_states=False) == wanted
    with caplog.at_level(logging.WARNING):
        assert allowed(wanted, can_shift=False, exact_states=True) == LongContext(slot_limit=128)
    assert "ctx_shift is not supported by this context" in caplog.text
    assert "cache_reuse is not supported by this context" in caplog.text
    # LFM2, Mamba: their cells move, but a recurrent state cannot lose a middle
    assert allowed(wanted, can_shift=True, exact_states=True) == LongContext(context_shift=True, slot_limit=128)


def test_n_keep_and_n_discard_are_request_fields() -> None:
    options = generation_options(SamplingFields(n_keep=-1, n_discard=12), max_tokens=None)
    assert (options.n_keep, options.n_discard) == (-1, 12)
    assert generation_options(SamplingFields(), max_tokens=None).n_keep is None  # the server's --keep
    with pytest.raises(InvalidRequestError, match="n_discard"):
        generation_options(SamplingFields(n_discard=-1), max_tokens=None)


def test_the_flags_set_the_engine_and_the_request_default() -> None:
    settings = parse_serve_args(["--context-shift", "--keep", "-1", "--cache-reuse", "256",
                                 "--kv-unified-per-slot", "4096"], environ={})
    assert settings.long_context() == LongContext(context_shift=True, cache_reuse=256, slot_limit=4096)
    assert settings.keep == -1
    assert parse_serve_args([], environ={"LLAMA_ARG_CONTEXT_SHIFT": "1", "LLAMA_ARG_CACHE_REUSE": "32"},
                            ).long_context() == LongContext(context_shift=True, cache_reuse=32)
    assert parse_serve_args(["--no-context-shift"], environ={}).context_shift is False
