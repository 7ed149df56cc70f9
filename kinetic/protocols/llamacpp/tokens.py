"""/tokenize and /detokenize, both ways: what the backend is asked to tokenize, and its tokens as
llama-server answers them. Pure: the backend runs the model's tokenizer between the two."""

from __future__ import annotations

from typing import Any

from kinetic.protocols.llamacpp.types import TokenizeRequest


def tokenize_parts(body: TokenizeRequest) -> list[str | int]:
    """`content` as text and token ids mixed, in order (nothing sent: nothing to tokenize)."""
    if body.content is None:
        return []
    return [body.content] if isinstance(body.content, str) else list(body.content)


def piece_text(raw: bytes) -> Any:
    """A token's piece as text, or its bytes when they are not valid UTF-8 (part of a character)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def tokenize_answer(tokens: list[int], pieces: list[bytes] | None) -> dict[str, Any]:
    """/tokenize's answer: the ids, or with `with_pieces` each id and its piece."""
    if pieces is None:
        return {"tokens": tokens}
    return {"tokens": [{"id": token, "piece": piece_text(raw)} for token, raw in zip(tokens, pieces, strict=True)]}
