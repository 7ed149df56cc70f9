"""Anthropic Messages wire models (requests). https://docs.anthropic.com/en/api/messages

Content blocks are a union discriminated on `type`; unknown request fields are allowed, since
newer SDKs add fields regularly and must never get a 4xx for them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from kinetic.protocols.common.types import WireModel


class TextBlock(WireModel):
    type: Literal["text"]
    text: str


class Base64Source(WireModel):
    type: Literal["base64"]
    media_type: str | None = None  # image/png, image/jpeg...: the decoder reads the file's own header
    data: str | None = None


class UrlSource(WireModel):
    type: Literal["url"]
    url: str | None = None


class FileSource(WireModel):
    type: Literal["file"]
    file_id: str | None = None  # a file uploaded to Anthropic's Files API, which kinetic has not


ImageSource = Annotated[Base64Source | UrlSource | FileSource, Field(discriminator="type")]


class ImageBlock(WireModel):
    type: Literal["image"]
    source: ImageSource


class DocumentBlock(WireModel):
    type: Literal["document"]
    source: dict[str, Any]


class ToolUseBlock(WireModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


ToolResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolResultBlock(WireModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ToolResultPart] | None = None
    is_error: bool | None = None


class ThinkingBlock(WireModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(WireModel):
    type: Literal["redacted_thinking"]
    data: str = ""


ContentBlock = Annotated[
    TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(WireModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(WireModel):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class MessagesRequest(WireModel):
    model: str
    messages: list[Message]
    max_tokens: int
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CountTokensRequest(WireModel):
    model: str | None = None
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
