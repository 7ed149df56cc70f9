"""Wire models more than one protocol accepts: OpenAI-style chat messages and tools (llama-server's
native /apply-template and /completion take the same shapes) and the sampler fields that OpenAI's
routes and llama-server's share. https://platform.openai.com/docs/api-reference/chat/create

Requests allow unknown fields: newer SDKs and tools send fields kinetic does not know, and
those must never cause a 4xx.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class WireModel(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class MediaUrl(WireModel):
    """`image_url`'s object (`detail` is accepted: the projector reads every image at its own size), or a
    video's; llama-server also reads a video's file from `data`."""

    url: str | None = None
    data: str | None = None
    detail: str | None = None


class ImageUrlPart(WireModel):
    type: Literal["image_url"]
    image_url: MediaUrl | str | None = None  # a bare string is the URL (older clients send it so)


class InputAudio(WireModel):
    data: str | None = None  # base64 (OpenAI's); llama-server also takes a data: URL or a URL here
    url: str | None = None
    format: str | None = None  # "wav", "mp3": the decoder reads the file's own header, as llama-server does


class InputAudioPart(WireModel):
    type: Literal["input_audio"]
    input_audio: InputAudio | None = None


class VideoPart(WireModel):
    type: Literal["input_video", "video_url"]  # video_url: the OpenAI-style spelling llama-server accepts too
    input_video: MediaUrl | str | None = None
    video_url: MediaUrl | str | None = None


ContentPart = Annotated[TextPart | ImageUrlPart | InputAudioPart | VideoPart, Field(discriminator="type")]


class FunctionCall(WireModel):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCall(WireModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(WireModel):
    include_usage: bool = False


class FunctionDefinition(WireModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(WireModel):
    type: Literal["function"]
    function: FunctionDefinition


class SamplingFields(WireModel):
    """Sampler fields shared by chat and completions (OpenAI's plus llama.cpp's)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repeat_penalty: float | None = None
    repetition_penalty: float | None = None  # SillyTavern's spelling
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, bool | float] | list[list[Any]] | None = None  # bool first: `false` bans
    n: int | None = None
    max_tokens: int | None = None
    n_predict: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    cache_prompt: bool | None = None
    id_slot: int | None = -1
    ignore_eos: bool | None = None
    n_probs: int | None = None
    user: str | None = None
    # llama.cpp's further samplers (validated in common.translate.sampling_options)
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    top_n_sigma: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: Any = None  # checked by hand for llama-server's message
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    adaptive_target: float | None = None
    adaptive_decay: float | None = None
    min_keep: int | None = None
    samplers: list[str] | str | None = None
    lora: Any = None  # llama-server's per-request adapter scales, [{"id": 0, "scale": 0.5}]: checked by lora_request
    n_keep: int | None = None
    n_discard: int | None = None
    post_sampling_probs: bool | None = None
    backend_sampling: bool | None = None  # llama-server's per request (default -bs); shown, sampling stays kinetic's
