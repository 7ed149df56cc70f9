"""Long conversations: llama-server's context shift (--context-shift, --keep) and cache reuse (--cache-reuse).

Context shift: a slot whose cache is full keeps its first n_keep tokens, drops the n_discard after them
(half of the rest) and moves the others down (llama_memory seq_rm + seq_add), so generation goes on
instead of stopping with `length` (llama-server's pre_decode). A prompt longer than the slot is still
refused, as llama-server refuses it (it no longer truncates prompts).

Cache reuse: after the common prefix of the cached tokens and a new prompt, chunks of at least
`cache_reuse` cached tokens that the prompt continues with are moved to their new positions instead of
being evaluated again (llama-server's n_cache_reuse). Like llama-server's, the search only skips cached
tokens: it finds text that was removed from the middle of a conversation, not text that was changed.

Both move cells along the position axis. Where llama.cpp cannot move them (llama_memory_can_shift false:
Qwen3.5, whose M-RoPE positions do not shift) both are turned off at load with a warning, as llama-server
does. On other hybrid and recurrent memories (LFM2, Mamba) a context shift moves the attention cells and
leaves the recurrent state as it is, as in llama-server; cache reuse is off there (see `allowed`). In a
unified cache, cells copied from another slot are shared with it, and moving them would move
the other slot's too; a slot whose moved range reaches its shared prefix stops (context shift) or reuses
nothing more (cache reuse) instead.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Protocol

import llama_cpp

from kinetic.engine.llama.slots import Slot
from kinetic.engine.options import LongContext

log = logging.getLogger(__name__)


def allowed(wanted: LongContext, *, can_shift: bool, exact_states: bool) -> LongContext:
    """What a memory allows of `wanted`, warning as llama-server does when it turns one off: neither when its
    cells cannot move (llama_memory_can_shift: Qwen3.5's M-RoPE positions), and no cache reuse on a memory
    with a recurrent state (it still holds the removed middle; llama-server then falls back to a checkpoint
    or evaluates the prompt again, kinetic reuses states whole)."""
    context_shift, cache_reuse = wanted.context_shift, wanted.cache_reuse
    if context_shift and not can_shift:
        log.warning("ctx_shift is not supported by this context, it will be disabled")
        context_shift = False
    if cache_reuse and (exact_states or not can_shift):
        log.warning("cache_reuse is not supported by this context, it will be disabled")
        cache_reuse = 0
    return replace(wanted, context_shift=context_shift, cache_reuse=cache_reuse)


class CellMover(Protocol):
    """The two llama_memory calls that move a sequence's cells (a fake one in unit tests)."""

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool: ...

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None: ...


class MemoryCells:
    """CellMover over a llama.cpp context's memory."""

    def __init__(self, memory: llama_cpp.llama_memory_t):
        self.memory = memory

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        return bool(llama_cpp.llama_memory_seq_rm(self.memory, seq_id, p0, p1))

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        llama_cpp.llama_memory_seq_add(self.memory, seq_id, p0, p1, delta)


def shift_span(n_tokens: int, n_keep: int, n_prompt: int, *, add_bos: bool, n_ctx: int,
               n_discard: int = 0) -> tuple[int, int]:
    """(n_keep, n_discard) for a full slot holding `n_tokens`, as llama-server computes them: n_keep -1 keeps
    the whole prompt, the BOS is kept beside n_keep, at most n_ctx - 4 are kept, and `n_discard` (0: half the
    rest) goes, never all the rest."""
    keep = n_prompt if n_keep < 0 else n_keep
    if add_bos:
        keep += 1
    keep = min(n_ctx - 4, keep)
    n_left = n_tokens - keep
    wanted = n_discard if n_discard else n_left // 2
    return keep, min(max(wanted, 0), max(0, n_left - 1))


def shift(cells: CellMover, seq_id: int, tokens: list[int], n_keep: int, n_discard: int) -> list[int]:
    """Drops `n_discard` cells after the first `n_keep` and moves the rest down; the tokens the slot then holds."""
    cells.seq_rm(seq_id, n_keep, n_keep + n_discard)
    cells.seq_add(seq_id, n_keep + n_discard, len(tokens), -n_discard)
    return tokens[:n_keep] + tokens[n_keep + n_discard:]


def reuse_chunks(cells: CellMover, seq_id: int, cached: list[int], prompt: list[int], n_past: int, *,
                 min_chunk: int, limit: int, movable_from: int = 0) -> list[int]:
    """llama-server's cache reuse: after the first `n_past` tokens (the common prefix), each run of at least
    `min_chunk` cached tokens that the prompt goes on with is moved to where the prompt has it. Returns the
    prompt tokens the slot's cells then hold (a prefix of `prompt`, at most `limit` long); the caller removes
    the cells past them. Cells before `movable_from` (shared with another slot) are never moved."""
    head_c = head_p = n_past
    held = list(prompt[:n_past])
    while head_c < len(cached) and head_p < limit:
        n_match = 0
        while (head_c + n_match < len(cached) and head_p + n_match < limit
               and cached[head_c + n_match] == prompt[head_p + n_match]):
            n_match += 1
        if n_match >= min_chunk and head_c >= movable_from:
            cells.seq_rm(seq_id, head_p, head_c)
            cells.seq_add(seq_id, head_c, head_c + n_match, head_p - head_c)
            held += prompt[head_p:head_p + n_match]
            head_c += n_match
            head_p += n_match
        else:
            head_c += 1
    return held


def shift_slot(cells: CellMover, slot: Slot, *, enabled: bool, add_bos: bool, n_ctx: int) -> bool:
    """--context-shift on a full slot: its cells and tokens shifted; False when off or its shared cells would move."""
    assert slot.job is not None
    request = slot.job.request
    n_keep, n_discard = shift_span(len(slot.tokens), request.n_keep, len(slot.prompt), n_discard=request.n_discard,
                                   add_bos=add_bos, n_ctx=n_ctx)
    if not enabled or n_discard <= 0 or n_keep + n_discard < slot.shared:
        return False
    slot.tokens, slot.shifted = shift(cells, slot.id, slot.tokens, n_keep, n_discard), True
    return True
