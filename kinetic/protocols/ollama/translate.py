"""Ollama -> kinetic: /api/chat, /api/generate and /api/embed requests inward to neutral requests
(and the embedding answers back). Engine events outward are in `replies`, the model's entries for
/api/tags, /api/ps and /api/show in `model_facts`.

Pure: nothing here touches an engine or a file; the routes pass in what the server knows
(`ServedModel`, `ModelFile`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from kinetic.chat import types as neutral
from kinetic.errors import InvalidRequestError, field_error
from kinetic.protocols.common import media
from kinetic.protocols.common import translate as common
from kinetic.protocols.ollama.model_facts import OLLAMA_VERSION as OLLAMA_VERSION
from kinetic.protocols.ollama.model_facts import ServedModel, check_model, timestamp
from kinetic.protocols.ollama.model_facts import model_entry as model_entry
from kinetic.protocols.ollama.model_facts import ps_entry as ps_entry
from kinetic.protocols.ollama.model_facts import show as show
from kinetic.protocols.ollama.model_facts import unloaded_entry as unloaded_entry
from kinetic.protocols.ollama.replies import LineEncoder as LineEncoder
from kinetic.protocols.ollama.replies import error_body as error_body
from kinetic.protocols.ollama.replies import reply_context as reply_context
from kinetic.protocols.ollama.replies import to_response as to_response
from kinetic.protocols.ollama.types import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    Format,
    GenerateRequest,
    KeepAlive,
    Message,
    Options,
    Think,
)

# The `X as X` imports above are re-exports: kinetic.protocols.ollama.routes and kinetic.server.app take the
# model facts and the replies from this module.



# --------------------------------------------------------------------------------- inward


def _in_options(err: InvalidRequestError) -> InvalidRequestError:
    """A sampler error from the shared checks, renamed to where the client wrote the field."""
    if err.param is None:
        return err
    field, quoted = f"options.{err.param}", f"'{err.param}'"
    message = err.message.replace(quoted, f"'{field}'") if quoted in err.message else f"Field '{field}': {err.message}"
    return InvalidRequestError(message, param=field)


def runtime_options(options: Options | None, *, logprobs: bool | None = None, top_logprobs: int | None = None,
                       context: list[int] | None = None) -> neutral.GenerationOptions:
    opts = options or Options()
    try:
        sampling = common.sampling_options(opts)
    except InvalidRequestError as err:
        raise _in_options(err) from err
    if top_logprobs is not None and not 0 <= top_logprobs <= common.MAX_TOP_LOGPROBS:
        raise InvalidRequestError("top_logprobs must be between 0 and 20", param="top_logprobs")
    num_predict = opts.num_predict
    if num_predict is not None and num_predict < -2:
        raise field_error("options.num_predict", f"Value must be >= -2, but got {num_predict}")
    # -1: until the model stops; -2: until the context is full. Both are the engine's -1.
    max_tokens = None if num_predict is None else max(num_predict, -1)
    if opts.num_ctx is not None and opts.num_ctx < 1:
        raise field_error("options.num_ctx", f"Value must be >= 1, but got {opts.num_ctx}")
    return neutral.GenerationOptions(sampling=sampling, max_tokens=max_tokens, stop=common.stop_list(opts.stop),
                                     n_probs=max(top_logprobs or 0, 1) if logprobs else 0,
                                     context_limit=opts.num_ctx, prior_tokens=tuple(context or ()))


def output_constraint(fmt: Format) -> neutral.OutputConstraint:
    """`format`: "json" (any JSON object), a JSON schema, or ""/absent for free text."""
    if fmt is None or fmt == "":
        return neutral.OutputConstraint()
    if fmt == "json":
        # Ollama's JSON grammar has an object at its root
        return neutral.OutputConstraint(schema=common.ANY_OBJECT, param="format")
    if isinstance(fmt, dict):
        return neutral.OutputConstraint(schema=fmt, param="format")
    raise field_error("format", f'must be "json" or a JSON schema object, but got {fmt!r}')


def reasoning(think: Think, served: ServedModel) -> tuple[dict[str, Any], str | None]:
    """Template kwargs and reasoning format for `think`. Absent: the model's default (thoughts, if
    it has them, come back in `thinking`); false: no thinking, everything is content."""
    if think is None:
        return {}, None
    if think is False:
        return {"enable_thinking": False}, "none"
    if not served.thinks:
        raise InvalidRequestError(f'"{served.name}" does not support thinking', param="think")
    kwargs: dict[str, Any] = {"enable_thinking": True}
    if isinstance(think, str):
        kwargs["reasoning_effort"] = think
    return kwargs, "deepseek"


def _images(images: list[str] | None, param: str) -> tuple[neutral.MediaPart, ...]:
    """`images`, bare base64 each (a data: URL is taken too); empty strings are skipped, as before."""
    return tuple(media.inline_part(image, kind="images", modality="image", param=f"{param}[{index}]")
                 for index, image in enumerate(images or ()) if image)


def to_message(message: Message, param: str = "messages[0]") -> neutral.Message:
    calls = tuple(neutral.ToolCall(name=call.function.name, arguments=call.function.arguments, id=call.id)
                  for call in message.tool_calls or ())
    images = _images(message.images, f"{param}.images")
    parts: tuple[neutral.ContentPart, ...] | None = (neutral.TextPart(message.content or ""),) + images
    if message.content is None and calls and not message.images:
        parts = None
    return neutral.Message(role=message.role, parts=parts, tool_calls=calls, tool_call_id=message.tool_call_id,
                           name=message.tool_name, reasoning_content=message.thinking)


def is_load_request(body: ChatRequest | GenerateRequest) -> bool:
    """An empty `messages` (chat) or `prompt` (generate) asks Ollama to load the model."""
    if isinstance(body, ChatRequest):
        return not body.messages
    return not body.prompt and not body.images


def unloads(keep_alive: KeepAlive) -> bool:
    return keep_alive in (0, "0", "0s", "0m")


def load_reply(body: ChatRequest | GenerateRequest, served: ServedModel) -> dict[str, Any]:
    """The one object Ollama answers a load (or, with keep_alive 0, unload) request with, streamed or not.
    kinetic's model stays resident either way."""
    check_model(body.model, served)
    reply: dict[str, Any] = {"model": body.model, "created_at": timestamp()}
    if isinstance(body, ChatRequest):
        reply["message"] = {"role": "assistant", "content": ""}
    else:
        reply["response"] = ""
    return {**reply, "done": True, "done_reason": "unload" if unloads(body.keep_alive) else "load"}


def to_chat_request(body: ChatRequest, served: ServedModel) -> neutral.ChatRequest:
    check_model(body.model, served)
    kwargs, reasoning_format = reasoning(body.think, served)
    tools = tuple(neutral.ToolSpec(name=t.function.name, description=t.function.description,
                                   parameters=t.function.parameters) for t in body.tools or ())
    # Ollama has no tool_choice: with tools the model may call one, never must (an empty list is no tools).
    return neutral.ChatRequest(
        messages=tuple(to_message(m, f"messages[{i}]") for i, m in enumerate(body.messages or ())),
        options=runtime_options(body.options, logprobs=body.logprobs, top_logprobs=body.top_logprobs),
        tools=tools, template_kwargs=kwargs, reasoning_format=reasoning_format,
        output=output_constraint(body.format))


def check_generate(body: GenerateRequest, served: ServedModel) -> None:
    check_model(body.model, served)
    if body.suffix:
        raise InvalidRequestError(f"{served.name} does not support insert", param="suffix")
    if body.raw and (body.system or body.template or body.context):
        raise InvalidRequestError("raw mode does not support template, system, or context", param="raw")


def to_generate_chat(body: GenerateRequest, served: ServedModel) -> neutral.ChatRequest:
    """A templated /api/generate: `system` and `prompt` as a two-turn chat."""
    check_generate(body, served)
    kwargs, reasoning_format = reasoning(body.think, served)
    messages: list[neutral.Message] = []
    if body.system:
        messages.append(neutral.Message(role="system", parts=(neutral.TextPart(body.system),)))
    images = _images(body.images, "images")
    messages.append(neutral.Message(role="user", parts=(neutral.TextPart(body.prompt or ""),) + images))
    return neutral.ChatRequest(
        messages=tuple(messages),
        options=runtime_options(body.options, logprobs=body.logprobs, top_logprobs=body.top_logprobs,
                                   context=body.context),
        template_kwargs=kwargs, reasoning_format=reasoning_format, output=output_constraint(body.format))


def to_prompt_request(body: GenerateRequest, served: ServedModel) -> neutral.PromptRequest:
    """A raw /api/generate: the prompt goes to the model verbatim. Its `images` travel as the request's media
    with the prompt untouched: a prompt that holds no media marker gets one per image before it, from the chat
    layer, which knows the model's marker (a translator does not)."""
    check_generate(body, served)
    if body.think:
        raise InvalidRequestError("raw mode does not support think", param="think")
    return neutral.PromptRequest(
        prompt=body.prompt or "",
        options=runtime_options(body.options, logprobs=body.logprobs, top_logprobs=body.top_logprobs),
        output=output_constraint(body.format), media=_images(body.images, "images"))


def embed_inputs(body: EmbedRequest, served: ServedModel) -> tuple[list[neutral.PromptInput], list[str]]:
    """Texts to embed and the field each came from; an empty input (a load request) is none."""
    check_model(body.model, served)
    if body.input is None or body.input == "":
        return [], []
    items = [body.input] if isinstance(body.input, str) else list(body.input)
    params = ["input"] if isinstance(body.input, str) else [f"input[{i}]" for i in range(len(items))]
    return list(items), params


def check_dimensions(dimensions: int | None, n_embd: int) -> None:
    if dimensions is not None and not 1 <= dimensions <= n_embd:
        raise field_error("dimensions", f"must be between 1 and {n_embd} (this model's width), but got {dimensions}")


def shorten(vector: list[float], dimensions: int | None) -> list[float]:
    """The first `dimensions` values, normalised again to unit length (Matryoshka-style)."""
    if dimensions is None or dimensions >= len(vector):
        return vector
    head = vector[:dimensions]
    norm = math.sqrt(sum(v * v for v in head))
    return [v / norm for v in head] if norm > 0 else head


def to_embed_response(body: EmbedRequest, n_tokens: int, vectors: list[list[float]],
                      started_ns: int) -> dict[str, Any]:
    return {"model": body.model, "embeddings": [shorten(v, body.dimensions) for v in vectors],
            "total_duration": time.monotonic_ns() - started_ns, "load_duration": 0,
            "prompt_eval_count": n_tokens}


def embeddings_input(body: EmbeddingsRequest, served: ServedModel) -> list[neutral.PromptInput]:
    check_model(body.model, served)
    return [body.prompt] if body.prompt else []


def to_embeddings_response(vectors: list[list[float]]) -> dict[str, Any]:
    return {"embedding": vectors[0] if vectors else []}
