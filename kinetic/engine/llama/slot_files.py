"""A slot's KV cache to a file and back (llama-server's POST /slots/{id}?action=save|restore|erase).

Each function runs while the scheduler holds the slot idle and nothing decodes (see
Scheduler.with_idle_slot): llama.cpp's state calls touch the context the decode thread owns.
"""

from __future__ import annotations

import ctypes
import time
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp

from kinetic.engine.types import SlotFileResult
from kinetic.errors import InvalidRequestError, ServerError

if TYPE_CHECKING:
    from kinetic.engine.llama.scheduler import Scheduler, Slot


def save(scheduler: "Scheduler", slot: "Slot", path: Path) -> SlotFileResult:
    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)  # llama-server creates --slot-save-path too
    tokens = (llama_cpp.llama_token * len(slot.tokens))(*slot.tokens)
    written = llama_cpp.llama_state_seq_save_file(scheduler.ctx.ctx, str(path).encode(), slot.id, tokens,
                                                  len(slot.tokens))
    if written == 0:
        raise ServerError("Unable to save slot")
    return SlotFileResult(id_slot=slot.id, n_tokens=len(slot.tokens), n_bytes=int(written),
                          ms=(time.perf_counter() - start) * 1000.0)


def restore(scheduler: "Scheduler", slot: "Slot", path: Path) -> SlotFileResult:
    start = time.perf_counter()
    capacity = scheduler.slot_n_ctx
    tokens = (llama_cpp.llama_token * capacity)()
    n_tokens = ctypes.c_size_t(0)
    llama_cpp.llama_memory_seq_rm(scheduler.ctx.memory, slot.id, -1, -1)
    slot.tokens = []
    read = llama_cpp.llama_state_seq_load_file(scheduler.ctx.ctx, str(path).encode(), slot.id, tokens, capacity,
                                               ctypes.byref(n_tokens))
    if read == 0:
        llama_cpp.llama_memory_seq_rm(scheduler.ctx.memory, slot.id, -1, -1)
        raise InvalidRequestError("Unable to restore slot, no available space in KV cache or invalid slot save file",
                                  param="filename")
    slot.tokens = list(tokens[: n_tokens.value])
    return SlotFileResult(id_slot=slot.id, n_tokens=len(slot.tokens), n_bytes=int(read),
                          ms=(time.perf_counter() - start) * 1000.0)


def erase(scheduler: "Scheduler", slot: "Slot") -> SlotFileResult:
    n_tokens = len(slot.tokens)
    llama_cpp.llama_memory_seq_rm(scheduler.ctx.memory, slot.id, -1, -1)
    slot.tokens = []
    return SlotFileResult(id_slot=slot.id, n_tokens=n_tokens, n_bytes=0, ms=0.0)
