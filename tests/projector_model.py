"""Tiny random-weight multimodal projectors (mmproj GGUFs) written at test time, and media to feed them.

llama.cpp's mtmd library turns an image (or a sound) into embeddings for a text model with a projector
file: a small vision (or audio) encoder followed by a projection to the text model's width. No real
projector may be downloaded in the tests and none ships in a package, so these are written with the
`gguf` package, with random weights from a fixed seed: the same file, hence the same embeddings, on
every run. Their "descriptions" are nonsense, but two different images give different embeddings (and
so different logits), the same image gives the same, which is what the media tests need.

- `gemma3`: Gemma 3's SigLIP projector (clip.projector_type "gemma3") for the bundled Gemma 3 270M (640
  wide). A 64x64 image is cut into 8x8 patches, one ViT layer 32 wide runs over the 64 patches, 2x2
  average pooling leaves 16 tokens, projected to 640. mtmd wraps them in <start_of_image> ...
  <end_of_image> and decodes the image tokens with non-causal attention.
- `qwen3vl`: Qwen3-VL's merger projector (clip.projector_type "qwen3vl_merger", which the converter
  also writes for Qwen3.5's vision tower) for `tests.hybrid_model.tiny_model("qwen35")` (64 wide). Any
  image is resized to multiples of 16 pixels (patch 8, 2x2 merge), 8 to 4096 tokens; a 64x64 one gives
  4x4 = 16 tokens over 4 M-RoPE positions. No deepstack layers: Qwen3.5's text model takes plain
  64-wide embeddings. mtmd wraps them in the text <|vision_start|> ... <|vision_end|>.
- `audio`: Ultravox's projector (whisper encoder, clip.projector_type "ultravox") for the bundled Gemma.
  Audio is cut into 30 s windows of 3000 mel frames (a short clip is padded to one); each window gives
  3000 / 100 (stack factor) / 2 = 15 tokens. mtmd inserts no marker text around them.

Weights are scaled like an init (by fan-in) so that the embeddings reach the text model with about the
magnitude of its own token embeddings (Gemma's are scaled by sqrt(640) to a root mean square near 1;
the tiny Qwen3.5's are 0.1): the gemma3 images at 2, the qwen3vl ones at 0.15, the audio at 1. Large
enough to move the logits (different images give different greedy text), not so large that they swamp
the prompt.

`png_image` and `wav_tone` make the media in pure Python (zlib, struct, wave): no image library needed.
"""

from __future__ import annotations

import io
import random
import struct
import wave
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.hybrid_model import N_EMBD as QWEN35_N_EMBD
from tests.hybrid_model import cache_dir, write_gguf

GEMMA_N_EMBD = 640  # the bundled Gemma 3 270M's embedding width
SEED = 31
# the gemma3 image embeddings' root mean square: twice that of Gemma's own scaled token embeddings (about 1).
# At 1, some pairs of different test images still gave Gemma the same greedy text; at 2 none did
GEMMA3_OUTPUT_RMS = 2.0
FORMAT_VERSION = 1  # bump when the weights or the layout change: the cached files are rebuilt

# the shapes, for tests that compute token counts
GEMMA3_IMAGE_SIZE, GEMMA3_PATCH, GEMMA3_POOL = 64, 8, 2
GEMMA3_IMAGE_TOKENS = (GEMMA3_IMAGE_SIZE // GEMMA3_PATCH // GEMMA3_POOL) ** 2  # 16 for every image
QWEN3VL_PATCH, QWEN3VL_MERGE = 8, 2  # an image of w x h pixels: (w // 16) * (h // 16) tokens, max(w, h) // 16 positions
AUDIO_STACK_FACTOR = 100
AUDIO_TOKENS_PER_WINDOW = 3000 // AUDIO_STACK_FACTOR // 2  # 15 for each 30 s window
AUDIO_SAMPLE_RATE = 16000


def _random(rng: np.random.Generator, *shape: int, scale: float | None = None) -> np.ndarray:
    """Weights for a matrix whose numpy shape is (out, in...): scaled by its fan-in unless told otherwise."""
    std = scale if scale is not None else 1.0 / np.sqrt(np.prod(shape[1:]))
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _norm(writer: Any, name: str, width: int, *, bias: bool = True) -> None:
    writer.add_tensor(f"{name}.weight", np.ones(width, dtype=np.float32))
    if bias:
        writer.add_tensor(f"{name}.bias", np.zeros(width, dtype=np.float32))


def _linear(writer: Any, rng: np.random.Generator, name: str, n_out: int, n_in: int, *,
            bias: bool = True, scale: float | None = None) -> None:
    writer.add_tensor(f"{name}.weight", _random(rng, n_out, n_in, scale=scale))
    if bias:
        writer.add_tensor(f"{name}.bias", np.zeros(n_out, dtype=np.float32))


def _encoder_block(writer: Any, rng: np.random.Generator, block: str, n_embd: int, n_ff: int, *,
                   fused_qkv: bool = False, k_bias: bool = True) -> None:
    """One pre-norm transformer layer under clip.cpp's names (ln1, attention, ln2, up/down MLP)."""
    _norm(writer, f"{block}.ln1", n_embd)
    _norm(writer, f"{block}.ln2", n_embd)
    if fused_qkv:
        _linear(writer, rng, f"{block}.attn_qkv", 3 * n_embd, n_embd)
    else:
        _linear(writer, rng, f"{block}.attn_q", n_embd, n_embd)
        _linear(writer, rng, f"{block}.attn_k", n_embd, n_embd, bias=k_bias)
        _linear(writer, rng, f"{block}.attn_v", n_embd, n_embd)
    _linear(writer, rng, f"{block}.attn_out", n_embd, n_embd)
    # n_ff != n_embd: clip.cpp swaps a gemma3 layer's up and down when ffn_down's input width is n_embd
    _linear(writer, rng, f"{block}.ffn_up", n_ff, n_embd)
    _linear(writer, rng, f"{block}.ffn_down", n_embd, n_ff)


def _vision_keys(writer: Any, projector_type: str, *, image_size: int, patch_size: int, n_embd: int,
                 n_ff: int, n_head: int, n_layer: int, projection_dim: int, eps: float) -> None:
    """The clip.* keys clip.cpp's loader requires of a vision projector (names from tools/mtmd/clip-impl.h)."""
    writer.add_string("clip.projector_type", projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", patch_size)
    writer.add_uint32("clip.vision.embedding_length", n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", n_ff)
    writer.add_uint32("clip.vision.attention.head_count", n_head)
    writer.add_uint32("clip.vision.block_count", n_layer)
    writer.add_uint32("clip.vision.projection_dim", projection_dim)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", eps)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])


def _patch_kernel(rng: np.random.Generator, n_embd: int, patch: int) -> np.ndarray:
    """A conv2d patch embedding, (out, in channels, kh, kw), in F16 as the converters store conv kernels."""
    return _random(rng, n_embd, 3, patch, patch).astype(np.float16)


def _write_gemma3(writer: Any, rng: np.random.Generator) -> None:
    """SigLIP ViT, 2x2 average pooling, RMS norm, projection to the bundled Gemma's 640."""
    n_embd, n_ff, n_head, n_layer = 32, 64, 2, 1
    n_patches = (GEMMA3_IMAGE_SIZE // GEMMA3_PATCH) ** 2
    _vision_keys(writer, "gemma3", image_size=GEMMA3_IMAGE_SIZE, patch_size=GEMMA3_PATCH, n_embd=n_embd,
                 n_ff=n_ff, n_head=n_head, n_layer=n_layer, projection_dim=GEMMA_N_EMBD, eps=1e-6)
    writer.add_uint32("clip.vision.projector.scale_factor", GEMMA3_POOL)  # Gemma 3's own pools 4x4
    writer.add_tensor("v.patch_embd.weight", _patch_kernel(rng, n_embd, GEMMA3_PATCH))
    writer.add_tensor("v.patch_embd.bias", np.zeros(n_embd, dtype=np.float32))
    writer.add_tensor("v.position_embd.weight", _random(rng, n_patches, n_embd, scale=0.02))
    for i in range(n_layer):
        _encoder_block(writer, rng, f"v.blk.{i}", n_embd, n_ff)
    _norm(writer, "v.post_ln", n_embd)
    # the projection is applied as x @ W: its numpy shape is (vision width, text width). After the RMS norm
    # each pooled patch has a root mean square of 1, which a fan-in scale would keep on the text side
    writer.add_tensor("mm.soft_emb_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("mm.input_projection.weight",
                      _random(rng, n_embd, GEMMA_N_EMBD, scale=GEMMA3_OUTPUT_RMS / np.sqrt(n_embd)))


def _write_qwen3vl(writer: Any, rng: np.random.Generator) -> None:
    """Qwen3-VL's ViT (two-frame patch conv, learned positions, 2D M-RoPE) and its 2x2 patch merger."""
    n_embd, n_ff, n_head, n_layer = 32, 64, 2, 1  # head dim 16: four M-RoPE sections of 4
    image_size = 64  # only sizes the learned position table (8x8, interpolated to each image's grid)
    n_patches = (image_size // QWEN3VL_PATCH) ** 2
    merged = n_embd * QWEN3VL_MERGE**2
    _vision_keys(writer, "qwen3vl_merger", image_size=image_size, patch_size=QWEN3VL_PATCH, n_embd=n_embd,
                 n_ff=n_ff, n_head=n_head, n_layer=n_layer, projection_dim=QWEN35_N_EMBD, eps=1e-6)
    writer.add_uint32("clip.vision.spatial_merge_size", QWEN3VL_MERGE)
    # the converter splits Qwen's Conv3D (temporal patch 2) into two 2D kernels; a still image uses both
    writer.add_tensor("v.patch_embd.weight", _patch_kernel(rng, n_embd, QWEN3VL_PATCH))
    writer.add_tensor("v.patch_embd.weight.1", _patch_kernel(rng, n_embd, QWEN3VL_PATCH))
    writer.add_tensor("v.patch_embd.bias", np.zeros(n_embd, dtype=np.float32))
    writer.add_tensor("v.position_embd.weight", _random(rng, n_patches, n_embd, scale=0.02))
    for i in range(n_layer):
        _encoder_block(writer, rng, f"v.blk.{i}", n_embd, n_ff, fused_qkv=True)
    _norm(writer, "v.post_ln", n_embd)  # the merger's norm, before the 2x2 patches are concatenated
    _linear(writer, rng, "mm.0", merged, merged)
    # GELU of a unit-variance input has a root mean square near 0.6; this lands the output near 0.15,
    # beside the tiny Qwen3.5's token embeddings (0.1)
    _linear(writer, rng, "mm.2", QWEN35_N_EMBD, merged, scale=0.25 / np.sqrt(merged))


def _write_audio(writer: Any, rng: np.random.Generator) -> None:
    """Ultravox: a whisper encoder (two convolutions, learned positions), frames stacked, SwiGLU MLP to 640."""
    n_embd, n_ff, n_head, n_layer, n_mel, hidden = 16, 32, 2, 1, 32, 64
    n_positions = 1500  # a 3000-frame window after the stride-2 convolution
    writer.add_string("clip.projector_type", "ultravox")
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_uint32("clip.audio.embedding_length", n_embd)
    writer.add_uint32("clip.audio.feed_forward_length", n_ff)
    writer.add_uint32("clip.audio.attention.head_count", n_head)
    writer.add_uint32("clip.audio.block_count", n_layer)
    writer.add_uint32("clip.audio.projection_dim", GEMMA_N_EMBD)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    writer.add_uint32("clip.audio.num_mel_bins", n_mel)
    writer.add_uint32("clip.audio.projector.stack_factor", AUDIO_STACK_FACTOR)
    # conv1d kernels (out, in, k) in F16, their biases (out, 1) so they broadcast over the frames
    writer.add_tensor("a.conv1d.1.weight", _random(rng, n_embd, n_mel, 3).astype(np.float16))
    writer.add_tensor("a.conv1d.1.bias", np.zeros((n_embd, 1), dtype=np.float32))
    writer.add_tensor("a.conv1d.2.weight", _random(rng, n_embd, n_embd, 3).astype(np.float16))
    writer.add_tensor("a.conv1d.2.bias", np.zeros((n_embd, 1), dtype=np.float32))
    writer.add_tensor("a.position_embd.weight", _random(rng, n_positions, n_embd, scale=0.02))
    for i in range(n_layer):
        _encoder_block(writer, rng, f"a.blk.{i}", n_embd, n_ff, k_bias=False)  # whisper's key has no bias
    _norm(writer, "a.post_ln", n_embd)
    stacked = n_embd * AUDIO_STACK_FACTOR
    writer.add_tensor("mm.a.norm_pre.weight", np.ones(stacked, dtype=np.float32))
    _linear(writer, rng, "mm.a.mlp.1", 2 * hidden, stacked, bias=False)
    writer.add_tensor("mm.a.norm_mid.weight", np.ones(hidden, dtype=np.float32))
    _linear(writer, rng, "mm.a.mlp.2", GEMMA_N_EMBD, hidden, bias=False)  # after the RMS norm: output RMS near 1


KINDS: dict[str, Callable[[Any, np.random.Generator], None]] = {
    "gemma3": _write_gemma3,
    "qwen3vl": _write_qwen3vl,
    "audio": _write_audio,
}


def write_projector(kind: str, target: Path) -> Path:
    return write_gguf(target, "clip", f"kinetic-test-mmproj-{kind}",
                      lambda writer: KINDS[kind](writer, np.random.default_rng([SEED, list(KINDS).index(kind)])))


def tiny_projector(kind: str) -> Path:
    """The cached tiny projector of `kind` ("gemma3", "qwen3vl" or "audio"), written on first use."""
    if kind not in KINDS:
        raise ValueError(f"unknown projector kind {kind!r}: one of {', '.join(KINDS)}")
    target = cache_dir() / f"kinetic-test-mmproj-{kind}-v{FORMAT_VERSION}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_projector(kind, target)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_image(width: int, height: int, seed_or_color: int | tuple[int, int, int]) -> bytes:
    """An 8-bit RGB PNG: one flat colour for an (r, g, b) tuple; for an int, a pattern that seed fixes
    (a 4x4 grid of random colours with a gradient over it, so resizing keeps images apart)."""
    if isinstance(seed_or_color, tuple):
        pixel = bytes(seed_or_color)
        rows = [b"\x00" + pixel * width] * height  # filter byte 0 (None), then the row
    else:
        rng = random.Random(seed_or_color)
        cells = [[bytes(rng.randrange(256) for _ in range(3)) for _ in range(4)] for _ in range(4)]
        tilt = rng.randrange(1, 4)
        rows = []
        for y in range(height):
            row = bytearray(b"\x00")
            for x in range(width):
                r, g, b = cells[y * 4 // height][x * 4 // width]
                shade = (x + y) * tilt * 255 // max(1, 4 * (width + height))
                row += bytes(((r + shade) % 256, g, (b + 255 - shade) % 256))
            rows.append(bytes(row))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # depth 8, colour type 2 (RGB)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(b"".join(rows), 9)) + _png_chunk(b"IEND", b""))


def wav_tone(seconds: float, frequency: float, *, sample_rate: int = AUDIO_SAMPLE_RATE) -> bytes:
    """A mono 16-bit PCM WAV of a sine at `frequency` Hz (half amplitude)."""
    n = int(seconds * sample_rate)
    samples = (0.5 * np.sin(2 * np.pi * frequency * np.arange(n) / sample_rate) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(samples.tobytes())
    return out.getvalue()
