"""Media in the chat layer: where each file stands in a message's text, and which files a prompt reads.

A message's media parts become the engine's media marker in its text, in order, so that any template
renders them where the client put them; the engine then tokenizes the rendered prompt with the files
(Engine.tokenize_media). llama-server joins text parts with a newline, but none next to a marker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from kinetic.chat.types import ContentPart, MediaPart, Message, TextPart
from kinetic.engine.types import MediaSpan, Modalities
from kinetic.errors import InvalidRequestError

READABLE = ("image", "audio")


def check_readable(parts: Iterable[ContentPart], modalities: Modalities) -> None:
    """A 400 for the first file the model cannot read (every file, on a model without a projector)."""
    for part in parts:
        if isinstance(part, MediaPart) and not modalities.reads(part.modality):
            hint = ("this model reads text only (start the server with -mm MMPROJ.gguf, or -hf a repo that has an "
                    "mmproj file)" if not (modalities.vision or modalities.audio)
                    else f"this model's projector does not read {part.modality}")
            raise InvalidRequestError(f"{part.kind} input is not supported: {hint}", param=part.param)


def content_with_markers(parts: Sequence[ContentPart], marker: str) -> str:
    """The message's text with `marker` where each file is."""
    text = ""
    for index, part in enumerate(parts):
        if index and isinstance(part, TextPart) and isinstance(parts[index - 1], TextPart):
            text += "\n"
        text += part.text if isinstance(part, TextPart) else marker
    return text


def media_parts(messages: Iterable[Message]) -> list[MediaPart]:
    """Every file of a conversation, in the order its markers stand in the rendered prompt."""
    return [part for message in messages for part in message.parts or () if isinstance(part, MediaPart)]


def file_bytes(parts: Sequence[MediaPart]) -> tuple[list[bytes], list[str]]:
    """The files' bytes and fields; the backend has loaded every URL before the chat layer runs."""
    files = []
    for part in parts:
        if part.data is None:
            raise InvalidRequestError(f"the {part.kind} was not loaded: send it inline (a data: URL or base64)",
                                      param=part.param)
        files.append(part.data)
    return files, [part.param for part in parts]


def shifted(media: tuple[MediaSpan, ...], by: int) -> tuple[MediaSpan, ...]:
    """The spans after `by` tokens were put in front of the prompt (a BOS)."""
    return tuple(replace(span, start=span.start + by) for span in media) if by else media


def media_extra(media: tuple[MediaSpan, ...]) -> int:
    """Embeddings beyond their positions (M-RoPE images): what usage counts besides the token list."""
    return sum(span.extra_tokens for span in media)
