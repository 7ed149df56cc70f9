"""The slot file's token section: llama-server's packed prompt (server_tokens::serialize), and the plain
token list older llama-server versions wrote."""

from __future__ import annotations

import pytest

from kinetic.engine.llama.slot_files import pack, unpack


def test_pack_is_llama_servers_layout() -> None:
    assert pack([2, 818, 5866]) == [-1, 1, 3, 2, 818, 5866, 0]
    assert pack([]) == [-1, 1, 0, 0]


@pytest.mark.parametrize("tokens", [[], [2], [2, 818, 5866, 563]])
def test_unpack_reads_packed_and_plain_lists(tokens: list[int]) -> None:
    assert unpack(pack(tokens)) == tokens
    assert unpack(tokens) == tokens  # a plain list: an older llama-server's file


@pytest.mark.parametrize("packed, reason", [
    ([-1, 2, 1, 5, 0], "Unsupported server tokens state version"),
    ([-1, 1, 5, 7, 0], "Unexpected end of server tokens state"),
    ([-1, 1, 1, 7, 1], "Cannot restore media tokens without an mmproj"),
    ([-1, 1, 1, 7, 0, 9], "Trailing data in server tokens state"),
])
def test_unpack_refuses_what_llama_server_refuses(packed: list[int], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        unpack(packed)
