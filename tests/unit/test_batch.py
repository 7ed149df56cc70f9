"""A llama_batch filled a token at a time, and a sequence taken out of it (a request that gives way when the KV
pool is full: engine/llama/full_pool.py); llama.cpp's own batch struct, no model."""

from __future__ import annotations

from llama_cpp import _internals

from kinetic.engine.llama.batch import add_token, drop_sequence


def contents(batch: _internals.LlamaBatch) -> list[tuple[int, int, int, bool]]:
    raw = batch.batch
    return [(raw.token[i], raw.pos[i], raw.seq_id[i][0], bool(raw.logits[i])) for i in range(raw.n_tokens)]


def test_a_sequence_taken_out_leaves_the_others_in_order_and_says_where_each_went() -> None:
    batch = _internals.LlamaBatch(n_tokens=16, embd=0, n_seq_max=1)
    entries = [(11, 5, 0, True), (20, 0, 1, False), (21, 1, 1, False), (22, 2, 1, True), (31, 7, 2, True),
               (32, 8, 2, True)]
    for token, pos, seq, logits in entries:
        add_token(batch, token, pos, seq, logits)
    assert contents(batch) == entries
    assert drop_sequence(batch, 1) == [0, -1, -1, -1, 1, 2]
    assert contents(batch) == [entries[0], entries[4], entries[5]]
    assert drop_sequence(batch, 7) == [0, 1, 2]
    assert drop_sequence(batch, 0) == [-1, 0, 1]
    assert drop_sequence(batch, 2) == [-1, -1]
    assert contents(batch) == []
