"""tests/projector_model.py's files without a model: the projectors' keys, widths and determinism, and
that its PNG and WAV bytes are well formed. (Loading them in mtmd: tests/e2e/test_projector_models.py.)"""

from __future__ import annotations

import io
import struct
import wave
import zlib
from pathlib import Path

import gguf
import pytest

from tests.projector_model import GEMMA_N_EMBD, KINDS, png_image, wav_tone, write_projector

EXPECTED = {  # kind: (clip.projector_type, the modality's key prefix, the text width it projects to)
    "gemma3": ("gemma3", "vision", GEMMA_N_EMBD),
    "qwen3vl": ("qwen3vl_merger", "vision", 64),
    "audio": ("ultravox", "audio", GEMMA_N_EMBD),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_projector_keys_and_determinism(kind: str, tmp_path: Path) -> None:
    first = write_projector(kind, tmp_path / "a.gguf")
    second = write_projector(kind, tmp_path / "b.gguf")
    assert first.read_bytes() == second.read_bytes()  # fixed seed: the same weights every time
    reader = gguf.GGUFReader(str(first))
    projector_type, modality, width = EXPECTED[kind]
    assert reader.fields["general.architecture"].contents() == "clip"
    assert reader.fields["clip.projector_type"].contents() == projector_type
    assert reader.fields[f"clip.has_{modality}_encoder"].contents() is True
    assert reader.fields[f"clip.{modality}.projection_dim"].contents() == width
    assert not any(t.name.startswith("v.deepstack") for t in reader.tensors)  # Qwen3.5 takes none


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert crc == zlib.crc32(kind + body)
        chunks.append((kind, body))
        at += 12 + length
    return chunks


@pytest.mark.parametrize("fill", [7, (255, 0, 0)])
def test_png_is_well_formed(fill: int | tuple[int, int, int]) -> None:
    data = png_image(20, 10, fill)
    chunks = _png_chunks(data)
    assert [kind for kind, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    assert struct.unpack(">IIBBBBB", chunks[0][1]) == (20, 10, 8, 2, 0, 0, 0)
    pixels = zlib.decompress(chunks[1][1])
    assert len(pixels) == 10 * (1 + 3 * 20)
    assert png_image(20, 10, fill) == data


def test_png_seeds_differ() -> None:
    assert png_image(16, 16, 1) != png_image(16, 16, 2)


def test_wav_is_16khz_mono_pcm() -> None:
    with wave.open(io.BytesIO(wav_tone(0.5, 440.0))) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()) == (1, 2, 16000, 8000)
