"""llama-server native request bodies. https://github.com/ggml-org/llama.cpp/tree/master/tools/server"""

from __future__ import annotations

from typing import Any, Union

from kinetic.protocols.common.types import ChatMessage, SamplingFields, Tool, WireModel


class CompletionRequest(SamplingFields):
    prompt: Union[str, list[Union[int, str]], list[list[int]]]
    max_completion_tokens: int | None = None
    return_tokens: bool | None = False
    n_probs: int | None = None


class TokenizeRequest(WireModel):
    content: Union[str, list[Union[int, str]], None] = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(WireModel):
    tokens: list[int] = []


class ApplyTemplateRequest(WireModel):
    messages: list[ChatMessage]
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class ModelActionRequest(WireModel):
    """POST /models/load and /models/unload (router mode)."""

    model: str
