"""The slot file's token section: llama-server's packed prompt (server_tokens::serialize), with its media
records, and the plain token list older llama-server versions wrote."""

from __future__ import annotations

import struct
from array import array

import pytest

from kinetic.engine.llama.media import media_key, stand_ins
from kinetic.engine.llama.slot_files import counted, pack, unpack
from kinetic.engine.llama.slots import HeldMedia

KEY = media_key(b"a picture")


def read_record(record: bytes) -> tuple[int, int, str]:
    """A stand-in for Projector.read_record: these tests' records are `n_pos n_tokens key` in text."""
    n_pos, n_tokens, key = record.decode().split()
    return int(n_pos), int(n_tokens), key


def held(start: int, n_pos: int, n_tokens: int, key: str = KEY) -> HeldMedia:
    return HeldMedia(start=start, n_pos=n_pos, n_tokens=n_tokens, key=key,
                     record=f"{n_pos} {n_tokens} {key}".encode())


def test_pack_is_llama_servers_layout() -> None:
    assert pack([2, 818, 5866]) == [-1, 1, 3, 2, 818, 5866, 0]
    assert pack([]) == [-1, 1, 0, 0]


def test_an_image_is_its_embeddings_as_nulls_its_index_and_its_record() -> None:
    image = held(start=1, n_pos=4, n_tokens=16)
    tokens = [2, *stand_ins(KEY, 4), 107]
    packed = pack(tokens, [image])
    data = array("i", packed).tobytes()
    assert packed[:3] == [-1, 1, 18] and packed[3:21] == [2, *[-1] * 16, 107]
    assert packed[21:23] == [1, 1]  # one image, at index 1 of llama-server's token list
    (size,) = struct.unpack_from("=I", data, 23 * 4)
    assert data[24 * 4:24 * 4 + size] == image.record and len(data) % 4 == 0
    assert unpack(packed, read_record) == (tokens, (image,))
    assert counted(tokens, [image]) == 18  # n_saved as llama-server counts it


def test_two_images_restore_where_they_were() -> None:
    other = media_key(b"another picture")
    first, second = held(start=1, n_pos=3, n_tokens=3), held(start=5, n_pos=3, n_tokens=3, key=other)
    tokens = [2, *stand_ins(KEY, 3), 9, *stand_ins(other, 3)]
    assert unpack(pack(tokens, [second, first]), read_record) == (tokens, (first, second))


@pytest.mark.parametrize("tokens", [[], [2], [2, 818, 5866, 563]])
def test_unpack_reads_packed_and_plain_lists(tokens: list[int]) -> None:
    assert unpack(pack(tokens)) == (tokens, ())
    assert unpack(tokens) == (tokens, ())  # a plain list: an older llama-server's file


@pytest.mark.parametrize("packed, reason", [
    ([-1, 2, 1, 5, 0], "Unsupported server tokens state version"),
    ([-1, 1, 5, 7, 0], "Unexpected end of server tokens state"),
    ([-1, 1, 1, 7, 1], "Unexpected end of server tokens state"),
    ([-1, 1, 1, -1, 1, 0, 4, 0x20202020], "Cannot restore media tokens without an mmproj"),
    ([-1, 1, 1, 7, 0, 9], "Trailing data in server tokens state"),
    ([-1, 1, 2, 7, -1, 0], "Invalid tokens in slot save file"),  # a null that is no image
    ([2, -5], "Invalid tokens in slot save file"),
])
def test_unpack_refuses_what_llama_server_refuses(packed: list[int], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        unpack(packed)


def test_an_image_index_that_is_no_run_of_nulls_is_refused() -> None:
    packed = pack([2, *stand_ins(KEY, 2)], [held(start=1, n_pos=2, n_tokens=2)])
    packed[4] = 7  # the image's first null overwritten
    with pytest.raises(ValueError, match="Invalid tokens in slot save file"):
        unpack(packed, read_record)
