"""OpenAI Responses wire models (requests). https://platform.openai.com/docs/api-reference/responses/create

`input` items are told apart as llama-server tells them apart (server-chat.cpp): by `type`, and an
item without one is a message (the SDK's "easy input message" `{"role", "content"}`). Unknown
request fields are allowed, and llama-server passes the chat route's own fields through (`stop`,
`top_k`, `grammar`...), so the request takes the shared sampler fields too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter

from kinetic.protocols.common.types import InputAudio as AudioData
from kinetic.protocols.common.types import SamplingFields, WireModel


class InputText(WireModel):
    type: Literal["input_text"]
    text: str


class OutputText(WireModel):
    type: Literal["output_text"]
    text: str


class Refusal(WireModel):
    type: Literal["refusal"]
    refusal: str


class InputImage(WireModel):
    type: Literal["input_image"]
    image_url: str | None = None  # a data: URL or an http(s):// one
    file_id: str | None = None  # a file uploaded to OpenAI's file store, which kinetic has not
    detail: str | None = None


class InputFile(WireModel):
    type: Literal["input_file"]


class InputAudio(WireModel):
    type: Literal["input_audio"]
    input_audio: AudioData | None = None


ContentPart = Annotated[InputText | OutputText | Refusal | InputImage | InputFile | InputAudio,
                        Field(discriminator="type")]


class MessageItem(WireModel):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: list[ContentPart] | str


class FunctionCallItem(WireModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(WireModel):
    type: Literal["function_call_output"]
    call_id: str
    output: list[ContentPart] | str


class ReasoningText(WireModel):
    type: str = "reasoning_text"
    text: str


class ReasoningItem(WireModel):
    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[ReasoningText] | None = None


ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def item_kind(item: Any) -> str | None:
    """The item's type; a typeless item is a message. None (an unknown type) fails validation."""
    kind = item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    return kind if kind in ITEM_TYPES else None


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(item_kind, custom_error_type="invalid_item",
                  custom_error_message="Cannot determine the type of the item: expected one of "
                                       + ", ".join(ITEM_TYPES)),
]


InputItemModel = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
INPUT_ITEMS: TypeAdapter[list[InputItemModel]] = TypeAdapter(list[InputItem])  # a stored conversation read back


class FunctionTool(WireModel):
    """A tool as Responses sends it: flat (`name` beside `type`), not nested under `function`.
    Other tool types (web_search, file_search...) have no local equivalent and are skipped."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceObject(WireModel):
    type: str
    name: str | None = None


class TextFormat(WireModel):
    type: str
    name: str | None = None
    schema_: Any = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(WireModel):
    format: TextFormat | None = None


class ResponsesRequest(SamplingFields):
    # the list first: a bad item is then what the 400 names, not "Input should be a valid string"
    input: list[InputItem] | str
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceObject | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: dict[str, Any] | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    background: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None
    # llama-server's, on a stream: the timings so far on each token's events, and prompt_progress while the
    # prompt is read (on response.in_progress events)
    timings_per_token: bool | None = False
    return_progress: bool | None = False


class InputTokensRequest(ResponsesRequest):
    """POST /v1/responses/input_tokens: the same body, nothing generated."""


class ConversationRequest(WireModel):
    """POST /v1/conversations."""

    items: list[InputItem] | None = None
    metadata: dict[str, Any] | None = None


class ConversationUpdate(WireModel):
    """POST /v1/conversations/{conversation_id}."""

    metadata: dict[str, Any]


class ItemsRequest(WireModel):
    """POST /v1/conversations/{conversation_id}/items."""

    items: list[InputItem]
