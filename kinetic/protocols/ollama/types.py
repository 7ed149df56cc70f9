"""Ollama wire models (requests). https://github.com/ollama/ollama/blob/main/docs/api.md

Field names and order follow Ollama's Go types (api.ChatRequest, api.GenerateRequest, ...).
Unknown fields are allowed at every level (Open WebUI and SillyTavern send extras); a known field
of the wrong JSON type is a 400 naming it (`options.top_k`). `model` defaults to "" so that a
missing model gets Ollama's own "model is required" rather than pydantic's wording.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from kinetic.protocols.common.types import WireModel

# A duration in seconds, or Go's duration text ("5m", "1h30m", "0"); negative: keep forever.
KeepAlive = float | str | None
# "json", "" (free text) or a JSON schema object.
Format = str | dict[str, Any] | None
Think = bool | Literal["low", "medium", "high", "max"] | None


class Options(WireModel):
    """Runtime options (api.Options). Load-time keys (num_gpu, num_thread, use_mmap...) are
    accepted and ignored: the model is already loaded."""

    num_keep: int | None = None
    seed: int | None = None
    num_predict: int | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_last_n: int | None = None
    temperature: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: str | list[str] | None = None
    num_ctx: int | None = None


class ToolCallFunction(WireModel):
    name: str
    arguments: dict[str, Any] | str = {}
    index: int | None = None


class ToolCall(WireModel):
    id: str | None = None
    function: ToolCallFunction


class Message(WireModel):
    role: str
    content: str | None = None  # Open WebUI leaves it out of an image-only turn
    thinking: str | None = None
    images: list[str] | None = None  # bare base64
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class ToolFunction(WireModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(WireModel):
    type: str = "function"
    function: ToolFunction


class ChatRequest(WireModel):
    model: str = ""
    messages: list[Message] | None = None
    stream: bool | None = None  # absent means true
    format: Format = None
    keep_alive: KeepAlive = None
    tools: list[Tool] | None = None
    options: Options | None = None
    think: Think = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class GenerateRequest(WireModel):
    model: str = ""
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None  # a Go template: kinetic renders its Jinja chat template instead
    context: list[int] | None = None
    stream: bool | None = None
    raw: bool | None = None
    format: Format = None
    images: list[str] | None = None
    keep_alive: KeepAlive = None
    options: Options | None = None
    think: Think = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class ShowRequest(WireModel):
    model: str | None = None
    name: str | None = None  # the legacy key (Continue sends it)
    verbose: bool | None = None


class EmbedRequest(WireModel):
    model: str = ""
    input: str | list[str] | None = None
    truncate: bool | None = None
    dimensions: int | None = None
    keep_alive: KeepAlive = None
    options: Options | None = None


class EmbeddingsRequest(WireModel):
    model: str = ""
    prompt: str | None = None
    keep_alive: KeepAlive = None
    options: Options | None = None


class PullRequest(WireModel):
    model: str = ""
    name: str | None = None  # the legacy key
    insecure: bool | None = None
    stream: bool | None = None


class CreateRequest(WireModel):
    """api.CreateRequest: kinetic makes a model `from` one it serves; files, adapters and quantize would need
    a model file uploaded or converted, which it does not do."""

    model: str = ""
    name: str | None = None  # the legacy key
    from_: str | None = Field(default=None, alias="from")
    system: str | None = None
    parameters: Options | None = None
    template: str | None = None
    messages: list[Message] | None = None
    license: str | list[str] | None = None
    files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    quantize: str | None = None
    stream: bool | None = None


class CopyRequest(WireModel):
    source: str = ""
    destination: str = ""


class DeleteRequest(WireModel):
    model: str = ""
    name: str | None = None  # the legacy key
