"""The tiny projectors of tests/projector_model.py load in llama.cpp's mtmd and steer their text models.

Through mtmd_cpp's ctypes bindings, as an engine would call them: the text model loaded, mtmd initialised
from the projector against it, a bitmap made from the media's bytes, a "<__media__>describe" prompt
tokenized into chunks and evaluated into a llama context. Each case checks the media chunk's token and
position counts and the marker text mtmd puts around it, that the same media twice gives the very same
logits, and that different media give different ones.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.projector_model import png_image, tiny_projector, wav_tone

pytestmark = pytest.mark.e2e

N_CTX = 512


@dataclass(frozen=True)
class Chunk:
    kind: int  # MTMD_INPUT_CHUNK_TYPE_*
    n_tokens: int
    n_pos: int
    tokens: tuple[int, ...]  # text chunks only
    media_id: bytes | None
    grid: tuple[int, int] | None  # image chunks: tokens across and down


class Multimodal:
    """A text model, a llama context on it, and an mtmd context from one projector."""

    def __init__(self, text_model: Path, projector: Path) -> None:
        import llama_cpp
        from llama_cpp import mtmd_cpp as mtmd

        self.llama, self.mtmd = llama_cpp, mtmd
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        model_params.use_extra_bufts = False  # AMX CPUs: ggml's AMX buffer type crashes the first decode
        self.model = llama_cpp.llama_model_load_from_file(str(text_model).encode(), model_params)
        assert self.model, text_model
        context_params = llama_cpp.llama_context_default_params()
        context_params.n_ctx = context_params.n_batch = context_params.n_ubatch = N_CTX
        context_params.n_threads = context_params.n_threads_batch = 2
        self.ctx = llama_cpp.llama_init_from_model(self.model, context_params)
        assert self.ctx
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = False
        params.n_threads = 2
        params.print_timings = False
        self.mctx = mtmd.mtmd_init_from_file(str(projector).encode(), self.model, params)
        assert self.mctx, projector

    def close(self) -> None:
        self.mtmd.mtmd_free(self.mctx)
        self.llama.llama_free(self.ctx)
        self.llama.llama_model_free(self.model)

    def piece(self, token: int) -> str:
        buf = ctypes.create_string_buffer(64)
        n = self.llama.llama_token_to_piece(self.llama.llama_model_get_vocab(self.model), token, buf, 64, 0, True)
        return buf.raw[:n].decode("utf-8", "replace")

    def tokenize(self, media: bytes, media_id: bytes, prompt: str = "describe") -> Any:
        """The chunks of `<__media__>prompt` (the caller frees them with mtmd_input_chunks_free)."""
        mtmd = self.mtmd
        buf = (ctypes.c_uint8 * len(media)).from_buffer_copy(media)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.mctx, buf, len(media), False)
        assert bitmap, "mtmd could not decode the media"
        mtmd.mtmd_bitmap_set_id(bitmap, media_id)
        text = mtmd.mtmd_default_marker() + prompt.encode()
        inp = mtmd.mtmd_input_text(text=text, text_len=len(text), add_special=True, parse_special=True)
        chunks = mtmd.mtmd_input_chunks_init()
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        try:
            assert mtmd.mtmd_tokenize(self.mctx, chunks, ctypes.byref(inp), bitmaps, 1) == 0
        finally:
            mtmd.mtmd_bitmap_free(bitmap)  # the chunks hold the preprocessed media, not the bitmap
        return chunks

    def chunks(self, media: bytes, media_id: bytes) -> list[Chunk]:
        mtmd = self.mtmd
        chunks = self.tokenize(media, media_id)
        out = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            tokens: tuple[int, ...] = ()
            grid = None
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t()
                ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens = tuple(ids[j] for j in range(n.value))
            elif kind == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                image = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
                grid = (mtmd.mtmd_image_tokens_get_nx(image), mtmd.mtmd_image_tokens_get_ny(image))
            out.append(Chunk(kind, mtmd.mtmd_input_chunk_get_n_tokens(chunk), mtmd.mtmd_input_chunk_get_n_pos(chunk),
                             tokens, mtmd.mtmd_input_chunk_get_id(chunk), grid))
        mtmd.mtmd_input_chunks_free(chunks)
        return out

    def logits(self, media: bytes, media_id: bytes) -> np.ndarray:
        """The next-token logits after `<__media__>describe`, evaluated from an empty memory."""
        self.llama.llama_memory_clear(self.llama.llama_get_memory(self.ctx), True)
        chunks = self.tokenize(media, media_id)
        n_past = self.llama.llama_pos(0)
        try:
            assert self.mtmd.mtmd_helper_eval_chunks(self.mctx, self.ctx, chunks, 0, 0, N_CTX, True,
                                                     ctypes.byref(n_past)) == 0
            assert n_past.value == self.mtmd.mtmd_helper_get_n_pos(chunks)
        finally:
            self.mtmd.mtmd_input_chunks_free(chunks)
        return np.ctypeslib.as_array(self.llama.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)).copy()


@dataclass(frozen=True)
class Case:
    text_model: Callable[[], Path]
    media: tuple[bytes, bytes]  # two different media of the same size
    chunk_kind: int
    n_tokens: int
    n_pos: int
    before: str  # the text mtmd puts right before the media ("" for none)
    after: str


def _bundled() -> Path:
    from kinetic.backends.bundled import gemma_model_path

    return gemma_model_path()


def _qwen35() -> Path:
    from tests.hybrid_model import tiny_model

    return tiny_model("qwen35")


IMAGES = (png_image(64, 64, 1), png_image(64, 64, 2))
CASES = {
    # 64x64 resized to 64x64, 8x8 patches, pooled 2x2: 16 tokens, one position each, non-causal decode
    "gemma3": Case(_bundled, IMAGES, 1, 16, 16, "<start_of_image>", "<end_of_image>"),
    # 64x64 kept, 8x8 patches merged 2x2: a 4x4 grid, 16 tokens over max(4, 4) = 4 M-RoPE positions
    "qwen3vl": Case(_qwen35, IMAGES, 1, 16, 4, "<|vision_start|>", "<|vision_end|>"),
    # a 1 s clip padded to one 30 s window of 3000 mel frames: 3000 / 100 / 2 = 15 tokens, no markers
    "audio": Case(_bundled, (wav_tone(1.0, 440.0), wav_tone(1.0, 1500.0)), 2, 15, 15, "", ""),
}


@pytest.fixture(scope="module", params=list(CASES))
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def loaded(kind: str, model_lock: None) -> Iterator[Multimodal]:
    mm = Multimodal(CASES[kind].text_model(), tiny_projector(kind))
    try:
        yield mm
    finally:
        mm.close()


def test_media_chunk_counts_and_markers(kind: str, loaded: Multimodal) -> None:
    case = CASES[kind]
    chunks = loaded.chunks(case.media[0], b"first")
    kinds = [c.kind for c in chunks]
    assert kinds == [0, case.chunk_kind, 0], chunks
    media = chunks[1]
    assert (media.n_tokens, media.n_pos, media.media_id) == (case.n_tokens, case.n_pos, b"first")
    before = "".join(loaded.piece(t) for t in chunks[0].tokens)
    after = "".join(loaded.piece(t) for t in chunks[2].tokens)
    assert before.endswith(case.before) and after == case.after + "describe", (before, after)


@pytest.mark.parametrize("kind", ["qwen3vl"], indirect=True)  # the others resize every image to one size
def test_qwen3vl_image_grid_follows_the_image(loaded: Multimodal) -> None:
    """Qwen's projector keeps an image's size (to multiples of 16 pixels): 96x48 is a 6x3 grid, 18 tokens
    over max(6, 3) = 6 positions."""
    image = loaded.chunks(png_image(96, 48, 3), b"wide")[1]
    assert (image.grid, image.n_tokens, image.n_pos) == ((6, 3), 18, 6)


def test_same_media_same_logits_other_media_other_logits(kind: str, loaded: Multimodal) -> None:
    first, second = CASES[kind].media
    a = loaded.logits(first, b"a")
    again = loaded.logits(first, b"a-again")
    b = loaded.logits(second, b"b")
    assert np.array_equal(a, again)
    assert np.abs(a - b).max() > 0.5, "the media barely moved the logits"
