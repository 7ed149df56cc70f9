"""A slot's KV cache to a file and back (llama-server's POST /slots/{id}?action=save|restore|erase).

Each function runs while the scheduler holds the slot idle and nothing decodes (see
Scheduler.with_idle_slot): llama.cpp's state calls touch the context the decode thread owns.

The file is llama-server's, byte for byte in layout: llama.cpp's sequence state file (`llama_state_seq_
save_file`: magic, version, a count of 32-bit "tokens", those, then the KV data), whose token array
holds llama-server's packed prompt (server_tokens::serialize, tools/server/server-common.cpp):
LLAMA_TOKEN_NULL (-1), format version 1, the token count, the tokens, and the count of media chunks
(0: kinetic reads text only). So either server restores the other's files; a plain token list, as older
llama-server versions wrote, restores too.
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

TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: marks the packed format (no real token has that id)
PACKED_VERSION = 1  # llama-server's SERVER_TOKENS_STATE_VERSION
PACKED_OVERHEAD = 4  # marker, version, token count, media count


def pack(tokens: list[int]) -> list[int]:
    """llama-server's packed prompt for a text-only slot, as 32-bit values."""
    return [TOKEN_NULL, PACKED_VERSION, len(tokens), *tokens, 0]


def unpack(packed: list[int]) -> list[int]:
    """The prompt tokens of a packed array, or of a plain token list (older llama-server files).
    Raises ValueError with llama-server's reason for a file it would refuse."""
    if not packed or packed[0] != TOKEN_NULL:
        return list(packed)
    if len(packed) < 3 or packed[1] != PACKED_VERSION:
        raise ValueError("Unsupported server tokens state version")
    n_tokens = packed[2] & 0xFFFFFFFF
    if 3 + n_tokens + 1 > len(packed):
        raise ValueError("Unexpected end of server tokens state")
    if packed[3 + n_tokens] != 0:
        raise ValueError("Cannot restore media tokens without an mmproj")
    if len(packed) > 3 + n_tokens + 1:
        raise ValueError("Trailing data in server tokens state")
    return list(packed[3:3 + n_tokens])


def save(scheduler: Scheduler, slot: Slot, path: Path) -> SlotFileResult:
    start = time.perf_counter()
    if any(token < 0 for token in slot.tokens):
        # llama-server writes the encoded media into the file too; kinetic's stand-ins are no such record
        raise InvalidRequestError("this slot holds an image or audio clip, which a slot file cannot carry: erase "
                                  "the slot, or save it after a text-only request", param="id_slot")
    path.parent.mkdir(parents=True, exist_ok=True)  # llama-server creates --slot-save-path too
    packed = pack(slot.tokens)
    tokens = (llama_cpp.llama_token * len(packed))(*packed)
    written = llama_cpp.llama_state_seq_save_file(scheduler.ctx.ctx, str(path).encode(), slot.id, tokens,
                                                  len(packed))
    if written == 0:
        raise ServerError("Unable to save slot")
    return SlotFileResult(id_slot=slot.id, n_tokens=len(slot.tokens), n_bytes=int(written),
                          ms=(time.perf_counter() - start) * 1000.0)


def restore(scheduler: Scheduler, slot: Slot, path: Path) -> SlotFileResult:
    start = time.perf_counter()
    capacity = scheduler.slot_n_ctx + PACKED_OVERHEAD
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
    try:
        restored = unpack(list(tokens[: n_tokens.value]))
        if len(restored) > scheduler.slot_n_ctx:
            raise ValueError("Restored prompt does not fit in the slot context")
        if not all(scheduler.model.valid_token(t) for t in restored):
            raise ValueError("Invalid tokens in slot save file")
    except ValueError as exc:
        llama_cpp.llama_memory_seq_rm(scheduler.ctx.memory, slot.id, -1, -1)
        raise InvalidRequestError(f"Unable to restore slot: {exc}", param="filename") from None
    slot.tokens = restored
    return SlotFileResult(id_slot=slot.id, n_tokens=len(slot.tokens), n_bytes=int(read),
                          ms=(time.perf_counter() - start) * 1000.0)


def erase(scheduler: Scheduler, slot: Slot) -> SlotFileResult:
    n_tokens = len(slot.tokens)
    llama_cpp.llama_memory_seq_rm(scheduler.ctx.memory, slot.id, -1, -1)
    slot.tokens = []
    return SlotFileResult(id_slot=slot.id, n_tokens=n_tokens, n_bytes=0, ms=0.0)
