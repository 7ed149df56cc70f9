"""OpenAI wire models (requests). https://platform.openai.com/docs/api-reference/chat/create

The message, tool and sampler models are shared with llama-server's native routes and live in
kinetic.protocols.common.types.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from kinetic.protocols.common.types import ChatMessage, SamplingFields, Tool, WireModel


class NamedToolChoiceFunction(WireModel):
    name: str


class NamedToolChoice(WireModel):
    type: Literal["function"]
    function: NamedToolChoiceFunction


class ResponseFormat(WireModel):
    type: str
    json_schema: dict[str, Any] | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    model: str | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | str | None = None
    reasoning_effort: str | None = None
    # llama-server's reasoning budget of this request (-1: the server's --reasoning-budget)
    reasoning_budget_tokens: int | None = None
    thinking_budget_tokens: int | None = None
    reasoning_budget_message: str | None = None
    # llama-server's: arms POST /v1/chat/completions/control (`reasoning_end`) for this completion
    reasoning_control: bool | None = None
    verbose: bool | None = None  # llama-server's: the native result as `__verbose` (default: --verbose)
    metadata: dict[str, Any] | None = None
    store: bool | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    model: str | None = None
    suffix: str | None = None  # fill-in-the-middle is accepted and ignored, as llama-server does
    echo: bool | None = None
    best_of: int | None = None
    logprobs: int | None = None


class EmbeddingRequest(WireModel):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: str | None = "float"
    dimensions: int | None = None
    user: str | None = None


class ControlRequest(WireModel):
    """POST /v1/chat/completions/control (llama-server's): what to do to which running chat completion."""

    id: str = ""
    action: str = ""
    model: str | None = None  # router mode: accepted; a completion is found by its id whatever its model


class TranscriptionRequest(WireModel):
    """POST /v1/audio/transcriptions' form fields besides `file` (the route takes the upload itself), as
    llama-server reads them. https://platform.openai.com/docs/api-reference/audio/createTranscription"""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    response_format: str = "json"
    temperature: float | None = None
    stream: bool | None = None
    max_tokens: int | None = None  # llama-server's (OpenAI's form has none): the answer's token limit
