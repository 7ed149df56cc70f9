"""A slot's KV cache to a file and back (llama-server's POST /slots/{id}?action=save|restore|erase).

Each function runs while the scheduler holds the slot idle and nothing decodes (see
Scheduler.with_idle_slot): llama.cpp's state calls touch the context the decode thread owns.

The file is llama-server's, byte for byte in layout: llama.cpp's sequence state file (`llama_state_seq_
save_file`: magic, version, a count of 32-bit "tokens", those, then the KV data), whose token array
holds llama-server's packed prompt (server_tokens::serialize, tools/server/server-common.cpp), read as
bytes in the machine's order: LLAMA_TOKEN_NULL (-1), format version 1, the token count, the tokens (an image
or clip as LLAMA_TOKEN_NULL once per embedding), the count of media, each one's index in that token list,
then each one's record (a byte count, mtmd_input_chunk_save's bytes), zero-padded to a whole 32-bit value.
So either server restores the other's files, images included (both name an image by the sha256 of its file,
so the next request with the same image reuses the restored cells); a plain token list, as older
llama-server versions wrote, restores too.

kinetic's own token list holds `n_pos` stand-ins per image (media.stand_ins), not `n_tokens` nulls: the two
differ on M-RoPE models, and are converted here both ways.
"""

from __future__ import annotations

import ctypes
import struct
import time
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp

from kinetic.engine.llama.media import stand_ins
from kinetic.engine.llama.slots import HeldMedia
from kinetic.engine.types import SlotFileResult
from kinetic.errors import InvalidRequestError, ServerError

if TYPE_CHECKING:
    from kinetic.engine.llama.scheduler import Scheduler
    from kinetic.engine.llama.slots import Slot

TOKEN_NULL = -1  # LLAMA_TOKEN_NULL: marks the packed format, and an image's embeddings (no real token has that id)
PACKED_VERSION = 1  # llama-server's SERVER_TOKENS_STATE_VERSION
WORD = 4  # bytes of a llama_token, the unit of the file's token array

ReadRecord = Callable[[bytes], tuple[int, int, str]]  # Projector.read_record: (n_pos, n_tokens, key)


def pack(tokens: list[int], media: Iterable[HeldMedia] = ()) -> list[int]:
    """llama-server's packed prompt for the slot's `tokens` and the media among them, as 32-bit values."""
    server_tokens: list[int] = []
    starts: list[int] = []
    here = 0
    for held in sorted(media, key=lambda m: m.start):
        server_tokens += tokens[here:held.start]
        starts.append(len(server_tokens))
        server_tokens += [TOKEN_NULL] * held.n_tokens
        here = held.end
    server_tokens += tokens[here:]
    data = bytearray(struct.pack("=iII", TOKEN_NULL, PACKED_VERSION, len(server_tokens)))
    data += array("i", server_tokens).tobytes()
    data += struct.pack(f"={1 + len(starts)}I", len(starts), *starts)
    for held in sorted(media, key=lambda m: m.start):
        data += struct.pack("=I", len(held.record)) + held.record
    data += bytes(-len(data) % WORD)
    return array("i", bytes(data)).tolist()


class _Reader:
    """llama-server's reader of the packed bytes (server_tokens_state_reader), with its reasons."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def u32(self) -> int:
        if self.remaining() < WORD:
            raise ValueError("Unexpected end of server tokens state")
        (value,) = struct.unpack_from("=I", self.data, self.pos)
        self.pos += WORD
        return int(value)

    def block(self, item_size: int) -> bytes:
        """A counted vector: its count, then that many items (refused before reading past the end)."""
        n = self.u32()
        if n > self.remaining() // item_size:
            raise ValueError("Unexpected end of server tokens state")
        block = self.data[self.pos:self.pos + n * item_size]
        self.pos += n * item_size
        return block


def unpack(packed: list[int], read_record: ReadRecord | None = None) -> tuple[list[int], tuple[HeldMedia, ...]]:
    """kinetic's token list (media as stand-ins) and the media of a packed array, or of a plain token list
    (older llama-server files). `read_record` reads a media record (None: the server has no projector).
    Raises ValueError with llama-server's reason for a file it would refuse."""
    at: dict[int, tuple[bytes, int, int, str]] = {}  # each image's index in server_tokens: its record, read
    if not packed or packed[0] != TOKEN_NULL:
        server_tokens = list(packed)
    else:
        reader = _Reader(array("i", packed).tobytes())
        reader.u32()  # the format mark
        if reader.u32() != PACKED_VERSION:
            raise ValueError("Unsupported server tokens state version")
        server_tokens = array("i", reader.block(WORD)).tolist()
        starts = array("I", reader.block(WORD)).tolist()
        if starts and read_record is None:
            raise ValueError("Cannot restore media tokens without an mmproj")
        for start in starts:
            record = reader.block(1)
            if not record:
                raise ValueError("Cannot load media chunk from server tokens state")
            assert read_record is not None
            n_pos, n_tokens, key = read_record(record)
            at[int(start)] = (record, n_pos, n_tokens, key)
        if reader.remaining() >= WORD:
            raise ValueError("Trailing data in server tokens state")
    tokens: list[int] = []
    media: list[HeldMedia] = []
    i = 0
    while i < len(server_tokens):
        if i in at:
            record, n_pos, n_tokens, key = at[i]
            if server_tokens[i:i + n_tokens] != [TOKEN_NULL] * n_tokens:
                raise ValueError("Invalid tokens in slot save file")
            media.append(HeldMedia(start=len(tokens), n_pos=n_pos, n_tokens=n_tokens, key=key, record=record))
            tokens += stand_ins(key, n_pos)
            i += n_tokens
            continue
        if server_tokens[i] < 0:  # a null outside any image, or no token at all
            raise ValueError("Invalid tokens in slot save file")
        tokens.append(server_tokens[i])
        i += 1
    if len(media) != len(at):  # an index inside another image, or past the end
        raise ValueError("Invalid tokens in slot save file")
    return tokens, tuple(media)


def counted(tokens: list[int], media: Iterable[HeldMedia]) -> int:
    """The slot's size as llama-server counts it (n_saved, n_restored): an image counts its embeddings."""
    return len(tokens) + sum(held.n_tokens - held.n_pos for held in media)


def held_media(slot: Slot) -> list[HeldMedia]:
    """The slot's media records that its tokens still hold (a later job's shorter prompt may have cut them)."""
    return [held for held in slot.held_media
            if held.end <= len(slot.tokens) and slot.tokens[held.start:held.end] == stand_ins(held.key, held.n_pos)]


def save(scheduler: Scheduler, slot: Slot, path: Path) -> SlotFileResult:
    start = time.perf_counter()
    media = held_media(slot)
    covered = {i for held in media for i in range(held.start, held.end)}
    if any(token < 0 and i not in covered for i, token in enumerate(slot.tokens)):
        # mtmd could not record one of the slot's images (Projector.held logged which): nothing to write it as
        raise ServerError("Cannot serialize media chunk in server tokens")
    path.parent.mkdir(parents=True, exist_ok=True)  # llama-server creates --slot-save-path too
    packed = pack(slot.tokens, media)
    tokens = (llama_cpp.llama_token * len(packed))(*packed)
    written = llama_cpp.llama_state_seq_save_file(scheduler.ctx.ctx, str(path).encode(), slot.id, tokens,
                                                  len(packed))
    if written == 0:
        raise ServerError("Unable to save slot")
    return SlotFileResult(id_slot=slot.id, n_tokens=counted(slot.tokens, media), n_bytes=int(written),
                          ms=(time.perf_counter() - start) * 1000.0)


def restore(scheduler: Scheduler, slot: Slot, path: Path) -> SlotFileResult:
    start = time.perf_counter()
    memory = scheduler.ctx.memory
    llama_cpp.llama_memory_seq_rm(memory, slot.id, -1, -1)
    slot.tokens, slot.held_media = [], ()
    # the token array's length first (a file with images holds more values than the slot has positions)
    n_packed = ctypes.c_size_t(0)
    packed = (llama_cpp.llama_token * 1)()
    read = llama_cpp.llama_state_seq_load_file(scheduler.ctx.ctx, str(path).encode(), slot.id, None, 0,
                                               ctypes.byref(n_packed))
    if read:
        packed = (llama_cpp.llama_token * max(1, n_packed.value))()
        read = llama_cpp.llama_state_seq_load_file(scheduler.ctx.ctx, str(path).encode(), slot.id, packed,
                                                   len(packed), ctypes.byref(n_packed))
    try:
        if read == 0:
            raise ValueError("No available space in KV cache or invalid slot save file")
        read_record = scheduler.projector.read_record if scheduler.projector is not None else None
        tokens, media = unpack(list(packed[:n_packed.value]), read_record)
        if len(tokens) > scheduler.slot_n_ctx:
            raise ValueError("Restored prompt does not fit in the slot context")
        if not all(scheduler.model.valid_token(t) for t in tokens if t >= 0):
            raise ValueError("Invalid tokens in slot save file")
    except ValueError as exc:
        llama_cpp.llama_memory_seq_rm(memory, slot.id, -1, -1)
        raise InvalidRequestError(f"Unable to restore slot: {exc}", param="filename") from None
    slot.tokens, slot.held_media = tokens, media
    return SlotFileResult(id_slot=slot.id, n_tokens=counted(tokens, media), n_bytes=int(read),
                          ms=(time.perf_counter() - start) * 1000.0)


def erase(scheduler: Scheduler, slot: Slot) -> SlotFileResult:
    n_tokens = counted(slot.tokens, held_media(slot))
    llama_cpp.llama_memory_seq_rm(scheduler.ctx.memory, slot.id, -1, -1)
    slot.tokens, slot.held_media = [], ()
    return SlotFileResult(id_slot=slot.id, n_tokens=n_tokens, n_bytes=0, ms=0.0)
