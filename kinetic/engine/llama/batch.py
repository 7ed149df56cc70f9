"""One token into a llama_batch: what the decode loop, the draft model and the embedding context fill their
batches with."""

from __future__ import annotations

from llama_cpp import _internals


def add_token(batch: _internals.LlamaBatch, token: int, pos: int, seq_id: int, logits: bool) -> None:
    """Appends `token` at position `pos` of sequence `seq_id`, with its logits kept when `logits`."""
    raw = batch.batch
    i = raw.n_tokens
    raw.token[i] = token
    raw.pos[i] = pos
    raw.n_seq_id[i] = 1
    raw.seq_id[i][0] = seq_id
    raw.logits[i] = logits
    raw.n_tokens = i + 1
