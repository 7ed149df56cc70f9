"""llama-server native request bodies. https://github.com/ggml-org/llama.cpp/tree/master/tools/server"""

from __future__ import annotations

from typing import Any

from kinetic.protocols.common.types import ChatMessage, SamplingFields, Tool, WireModel


class CompletionRequest(SamplingFields):
    prompt: Any  # text, token ids, mixed, or a list of those: checked by translate.prompt_inputs
    max_completion_tokens: int | None = None
    return_tokens: bool | None = False
    n_probs: int | None = None
    logprobs: Any = None  # llama-server's alias of n_probs (a number)
    n_cmpl: int | None = None  # completions per prompt; `n` is its alias here, as in llama-server
    timings_per_token: bool | None = False
    return_progress: bool | None = False


class InfillRequest(SamplingFields):
    """/infill: llama-server's own checks and messages, so the shapes are checked by hand."""

    input_prefix: Any = None
    input_suffix: Any = None
    input_extra: Any = None
    prompt: Any = None
    max_completion_tokens: int | None = None
    return_tokens: bool | None = False
    timings_per_token: bool | None = False
    return_progress: bool | None = False


class EmbeddingRequest(WireModel):
    """/embedding: `content` (or `input`) is text, token ids, mixed, or a list of those."""

    content: Any = None
    input: Any = None
    embd_normalize: int | None = None  # None: the server's --embd-normalize


class SlotActionRequest(WireModel):
    filename: str | None = None


class TokenizeRequest(WireModel):
    content: str | list[int | str] | None = None
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
    continue_final_message: bool | str | None = None


class ModelActionRequest(WireModel):
    """POST /models/load and /models/unload (router mode)."""

    model: str


class DrainRequest(WireModel):
    """POST /models/drain and /models/undrain: one server of an upstream pool, by its URL."""

    model: str
    upstream: str
    wait: bool = False  # drain: answer once the requests it had are done
