"""One token into a llama_batch: what the decode loop, the draft model and the embedding context fill their
batches with; and what llama_decode's failure on a batch means."""

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


def drop_sequence(batch: _internals.LlamaBatch, seq_id: int) -> list[int]:
    """Takes sequence `seq_id`'s tokens out of the batch, the others kept in order: each old index's new one (-1:
    taken out)."""
    raw = batch.batch
    moved: list[int] = []
    kept = 0
    for i in range(raw.n_tokens):
        if raw.seq_id[i][0] == seq_id:
            moved.append(-1)
            continue
        if kept != i:
            raw.token[kept], raw.pos[kept], raw.logits[kept] = raw.token[i], raw.pos[i], raw.logits[i]
            raw.n_seq_id[kept], raw.seq_id[kept][0] = raw.n_seq_id[i], raw.seq_id[i][0]
        moved.append(kept)
        kept += 1
    raw.n_tokens = kept
    return moved


def decode_failure(status: int) -> str:
    """llama_decode's failure in llama-server's words (its clients match them), with the status."""
    if status == 1:  # no KV cells left for the batch: the slots together outgrew the (unified) context
        return f"Context size has been exceeded. (llama_decode status {status}: no free KV cells for the batch)"
    if status == -1:
        return f"Invalid input batch. (llama_decode status {status})"
    return f"Compute error. (llama_decode status {status})"
