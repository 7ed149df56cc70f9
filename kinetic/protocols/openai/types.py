"""OpenAI wire models (requests). https://platform.openai.com/docs/api-reference/chat/create

Requests allow unknown fields: newer SDKs and tools send fields kinetic does not know, and
those must never cause a 4xx.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


class WireModel(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class TextPart(WireModel):
    type: Literal["text"]
    text: str


class ImagePart(WireModel):
    type: Literal["image_url", "input_audio", "input_video", "video_url"]


ContentPart = Union[TextPart, ImagePart]


class FunctionCall(WireModel):
    name: str
    arguments: Union[str, dict[str, Any]] = ""


class ToolCall(WireModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[ContentPart], None] = None
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


class NamedToolChoiceFunction(WireModel):
    name: str


class NamedToolChoice(WireModel):
    type: Literal["function"]
    function: NamedToolChoiceFunction


class ResponseFormat(WireModel):
    type: str
    json_schema: dict[str, Any] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


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
    stop: Union[str, list[str], None] = None
    logit_bias: Union[dict[str, float], list[list[Any]], None] = None
    n: int | None = None
    max_tokens: int | None = None
    n_predict: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    cache_prompt: bool | None = True
    id_slot: int | None = -1
    ignore_eos: bool | None = False
    n_probs: int | None = None
    user: str | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    model: str | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None
    add_generation_prompt: bool | None = True
    metadata: dict[str, Any] | None = None
    store: bool | None = None


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    model: str | None = None
    suffix: str | None = None  # fill-in-the-middle is accepted and ignored, as llama-server does
    echo: bool | None = None
    best_of: int | None = None
    logprobs: int | None = None


class EmbeddingRequest(WireModel):
    input: Union[str, list[str], list[int], list[list[int]]]
    model: str | None = None
    encoding_format: str | None = "float"
    dimensions: int | None = None
    user: str | None = None
