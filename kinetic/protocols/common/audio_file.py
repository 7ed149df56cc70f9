"""Audio files known by their first bytes: whether a file is audio at all, and how long it plays.

`is_audio` knows the containers llama.cpp's projector decodes (mtmd-helper's `is_audio_file`: WAV, MP3,
FLAC), so a route that only takes audio refuses an image or a text file with a 400 naming its field,
where the projector would read an image as a picture. `seconds` reads a clip's length from the header
where the container states it (WAV, FLAC); an MP3 states none (its frames would have to be walked).
Pure: bytes in, facts out.
"""

from __future__ import annotations

import struct

_WAV_CHUNK = struct.Struct("<4sI")  # a RIFF chunk's id and size
_FLAC_STREAMINFO = 0  # the metadata block type that holds the sample rate and the sample count


def is_audio(data: bytes) -> bool:
    """A WAV (RIFF/WAVE), an MP3 (an ID3 tag or an MPEG frame sync) or a FLAC file, as mtmd decides."""
    if len(data) < 12:
        return False
    wav = data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    mp3 = data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0)
    return wav or mp3 or data[:4] == b"fLaC"


def seconds(data: bytes) -> float | None:
    """How long the clip plays, from its header; None where the container does not say (MP3) or the
    header is cut short."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return _wav_seconds(data)
    if data[:4] == b"fLaC":
        return _flac_seconds(data)
    return None


def _wav_seconds(data: bytes) -> float | None:
    byte_rate = 0
    offset = 12
    while offset + _WAV_CHUNK.size <= len(data):
        chunk, size = _WAV_CHUNK.unpack_from(data, offset)
        body = offset + _WAV_CHUNK.size
        if chunk == b"fmt " and size >= 12 and body + 12 <= len(data):
            byte_rate = struct.unpack_from("<I", data, body + 8)[0]
        elif chunk == b"data":
            # a writer that streamed the file may leave the size unset (0 or 0xFFFFFFFF): the rest is data
            stated = size if 0 < size <= len(data) - body else len(data) - body
            return stated / byte_rate if byte_rate else None
        offset = body + size + (size & 1)  # chunks are padded to an even size
    return None


def _flac_seconds(data: bytes) -> float | None:
    # the first metadata block is STREAMINFO: 4 header bytes, then 10 bytes of block and frame sizes, then
    # 20 bits of sample rate, 3 of channels, 5 of bits per sample and 36 of total samples
    if len(data) < 4 + 4 + 18 or data[4] & 0x7F != _FLAC_STREAMINFO:
        return None
    info = data[8:8 + 18]
    packed = int.from_bytes(info[10:18], "big")
    rate = packed >> 44
    total = packed & ((1 << 36) - 1)
    return total / rate if rate and total else None
