"""A model's multimodal projector (llama.cpp's mtmd, through llama-cpp-python's `llama_cpp.mtmd_cpp`).

It turns a prompt whose text holds one media marker per file into tokens and MediaSpans (kinetic's
stand-ins for each image or clip, keyed by the file's content hash as llama-server keys its bitmaps), and
evaluates one span into a slot's sequence when the scheduler reaches it.

A span takes `n_pos` entries in a prompt's token list, the positions it fills in the sequence, so the
list's length stays the next position on every model (M-RoPE models place an image's embeddings on fewer
positions than it has embeddings). Only the llama engine imports this module.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import secrets
import time
import weakref
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import _internals
from llama_cpp import _logger as llama_logger

from kinetic.engine.llama.devices import devices
from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.llama.slots import HeldMedia
from kinetic.engine.options import ProjectorOptions
from kinetic.engine.types import MediaSpan, Modalities
from kinetic.errors import InvalidRequestError, ModelLoadError

log = logging.getLogger(__name__)

# llama-server's marker: random per process unless LLAMA_MEDIA_MARKER pins it, so that a client's text
# cannot smuggle a marker into a prompt without sending a file (its /props shows it)
MEDIA_MARKER = os.environ.get("LLAMA_MEDIA_MARKER") or f"<__media_{secrets.token_hex(16)}__>"
# stand-in ids live below 0 (never a vocabulary id) and within int32 (slot files, the host cache)
_STAND_IN_RANGE = 2**31 - 2
_CHUNK_TEXT, _CHUNK_IMAGE, _CHUNK_AUDIO = 0, 1, 2
# media_key's form; mtmd's helper names a file the same way (sha256 of its bytes, hex), so a slot file llama-server
# saved names its images as kinetic does. Any other id (none, a video frame's) gets stand-ins of its own
_CONTENT_KEY = re.compile(r"[0-9a-f]{64}")


def media_key(data: bytes) -> str:
    """The content key of a file: equal files are one image to the cache, whatever request sent them."""
    return hashlib.sha256(data).hexdigest()


def stand_ins(key: str, n: int) -> list[int]:
    """`n` negative ids drawn from `key`: two different files part at their first position."""
    base = int(key[:15], 16) if _CONTENT_KEY.fullmatch(key) else int(media_key(key.encode("utf-8"))[:15], 16)
    return [-1 - (base + i) % _STAND_IN_RANGE for i in range(n)]


def _mtmd() -> Any:
    try:
        from llama_cpp import mtmd_cpp
    except OSError as exc:  # the wheel was built with -DLLAVA_BUILD=OFF: no libmtmd.so beside libllama.so
        raise ModelLoadError("this llama-cpp-python has no multimodal library (libmtmd): reinstall it with the "
                             "README's command (`pip cache remove llama_cpp_python` first if pip reuses a wheel "
                             f"built without it): {exc}") from None
    return mtmd_cpp


class OwnedChunk:
    """An mtmd input chunk kinetic owns (a copy out of a tokenize result), freed when no request holds it."""

    def __init__(self, mtmd: Any, chunk: Any):
        self.pointer = mtmd.mtmd_input_chunk_copy(chunk)
        if not self.pointer:
            raise RuntimeError("mtmd could not copy a media chunk")
        weakref.finalize(self, mtmd.mtmd_input_chunk_free, self.pointer)


class Projector:
    """The mtmd context of one loaded model: what it reads, tokenizing with files, evaluating a span."""

    def __init__(self, model: LoadedModel, options: ProjectorOptions, n_threads: int):
        assert options.path is not None
        self.mtmd = _mtmd()
        self.path = Path(options.path)
        if not self.path.is_file():
            raise ModelLoadError(f"cannot load the multimodal projector {self.path}: no such file")
        self.mtmd.mtmd_log_set(llama_logger.llama_log_callback, ctypes.c_void_p(0))
        self.mtmd.mtmd_helper_log_set(llama_logger.llama_log_callback, ctypes.c_void_p(0))
        params = self.mtmd.mtmd_context_params_default()
        params.use_gpu = options.use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        params.media_marker = MEDIA_MARKER.encode("utf-8")
        params.image_min_tokens = options.image_min_tokens
        params.image_max_tokens = options.image_max_tokens
        if options.device is not None:
            params.device = _device(options.device)
        started = time.perf_counter()
        self.ctx = self.mtmd.mtmd_init_from_file(str(self.path).encode("utf-8"), model.model.model, params)
        if not self.ctx:
            raise ModelLoadError(f"cannot load the multimodal projector {self.path}: mtmd rejected it (not an mmproj "
                                 f"GGUF, or made for another model than {model.path.name})")
        weakref.finalize(self, self.mtmd.mtmd_free, self.ctx)
        self.modalities = Modalities(vision=bool(self.mtmd.mtmd_support_vision(self.ctx)),
                                     audio=bool(self.mtmd.mtmd_support_audio(self.ctx)))
        self.uses_mrope = bool(self.mtmd.mtmd_decode_use_mrope(self.ctx))
        log.info("multimodal projector %s loaded in %.2f s (vision: %s, audio: %s)", self.path.name,
                 time.perf_counter() - started, self.modalities.vision, self.modalities.audio)

    # ------------------------------------------------------------ from any thread (mtmd's tokenizer is)

    def tokenize(self, text: str, files: list[bytes], params: list[str]) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """`text`, holding one MEDIA_MARKER per file, as tokens with each file's stand-ins, and its spans.
        `params` name each file's request field, for the 400 of a file that is no image or sound."""
        mtmd = self.mtmd
        if text.count(MEDIA_MARKER) != len(files):
            raise InvalidRequestError(f"the prompt holds {text.count(MEDIA_MARKER)} media markers for {len(files)} "
                                      "files: one marker per file", param=params[0] if params else "prompt")
        bitmaps = [self._bitmap(data, param) for data, param in zip(files, params, strict=True)]
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            encoded = text.encode("utf-8")
            entry = mtmd.mtmd_input_text(encoded, len(encoded), False, True)  # BOS: the chat layer's rule
            array = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            status = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(entry), array, len(bitmaps))
            if status != 0:
                raise InvalidRequestError(f"the media could not be read into the prompt (mtmd_tokenize status "
                                          f"{status})", param=params[0] if params else "prompt")
            return self._spans(chunks)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, data: bytes, param: str) -> Any:
        mtmd = self.mtmd
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, buffer, len(data), False, None)
        if not bitmap:
            kinds = " or ".join(k for k, on in (("an image", self.modalities.vision),
                                                ("audio", self.modalities.audio)) if on)
            raise InvalidRequestError(f"the file is not {kinds} this server can read "
                                      "(PNG, JPEG, GIF, BMP... for images; WAV, MP3, FLAC for audio)", param=param)
        mtmd.mtmd_bitmap_set_id(bitmap, media_key(data).encode("ascii"))
        return bitmap

    def _spans(self, chunks: Any) -> tuple[list[int], tuple[MediaSpan, ...]]:
        mtmd = self.mtmd
        tokens: list[int] = []
        spans: list[MediaSpan] = []
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == _CHUNK_TEXT:
                n = ctypes.c_size_t(0)
                pointer = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens.extend(pointer[i] for i in range(n.value))
                continue
            key = (mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode("ascii")
            n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
            span = MediaSpan(start=len(tokens), n_pos=n_pos, n_tokens=int(mtmd.mtmd_input_chunk_get_n_tokens(chunk)),
                             key=key, modality="audio" if kind == _CHUNK_AUDIO else "image",
                             chunk=OwnedChunk(mtmd, chunk))
            spans.append(span)
            tokens.extend(stand_ins(key, n_pos))
        return tokens, tuple(spans)

    # ------------------------------------------------------------ slot files (the decode thread idle)

    def held(self, spans: list[MediaSpan], upto: int) -> tuple[HeldMedia, ...]:
        """The spans before position `upto` as a slot file records them (mtmd_input_chunk_save). A span mtmd
        cannot record is left out: a save of the slot then says the slot holds media it cannot write."""
        held: list[HeldMedia] = []
        for span in spans:
            if span.end > upto:
                continue
            chunk = span.chunk
            assert isinstance(chunk, OwnedChunk)
            size = ctypes.c_size_t(0)
            if self.mtmd.mtmd_input_chunk_save(chunk.pointer, None, 0, ctypes.byref(size)) != 0 or not size.value:
                log.warning("mtmd could not record the %s at position %d for slot files", span.modality, span.start)
                continue
            buffer = ctypes.create_string_buffer(size.value)
            if self.mtmd.mtmd_input_chunk_save(chunk.pointer, buffer, size.value, None) != 0:
                log.warning("mtmd could not record the %s at position %d for slot files", span.modality, span.start)
                continue
            held.append(HeldMedia(start=span.start, n_pos=span.n_pos, n_tokens=span.n_tokens, key=span.key,
                                  record=buffer.raw))
        return tuple(held)

    def read_record(self, record: bytes) -> tuple[int, int, str]:
        """A slot file's media record (mtmd_input_chunk_load) as (positions, embeddings, content key).
        Raises ValueError with llama-server's reason for a record it would refuse."""
        mtmd = self.mtmd
        chunk = mtmd.mtmd_input_chunk_load(record, len(record))
        if not chunk:
            raise ValueError("Cannot load media chunk from server tokens state")
        try:
            if mtmd.mtmd_input_chunk_get_type(chunk) == _CHUNK_TEXT:
                raise ValueError("Invalid tokens in slot save file")
            n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
            n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            key = (mtmd.mtmd_input_chunk_get_id(chunk) or b"").decode("utf-8", "replace")
        finally:
            mtmd.mtmd_input_chunk_free(chunk)
        if n_pos <= 0 or n_tokens <= 0:
            raise ValueError("Invalid tokens in slot save file")
        return n_pos, n_tokens, key

    # ------------------------------------------------------------ the decode thread

    def evaluate(self, ctx: _internals.LlamaContext, span: MediaSpan, seq_id: int, n_batch: int) -> None:
        """Encodes the span's file and decodes its embeddings into `seq_id` from position `span.start`."""
        chunk = span.chunk
        assert isinstance(chunk, OwnedChunk)
        n_past = llama_cpp.llama_pos(0)
        status = self.mtmd.mtmd_helper_eval_chunk_single(self.ctx, ctx.ctx, chunk.pointer, span.start, seq_id,
                                                          n_batch, False, ctypes.byref(n_past))
        if status != 0:
            raise RuntimeError(f"the projector could not evaluate the {span.modality} (status {status})")
        if n_past.value != span.end:
            raise RuntimeError(f"the {span.modality} took {n_past.value - span.start} positions, not {span.n_pos}")


def _device(name: str) -> Any:
    """-mmdev: the ggml device of that name (settings checked the name against this machine at startup)."""
    found = next((d for d in devices() if d.name == name), None)
    if found is None:
        raise ModelLoadError(f"invalid -mmdev {name!r}: no such device (see --list-devices)")
    return found.handle
