"""Ollama <-> kinetic: /api/chat, /api/generate and /api/embed requests inward to neutral
requests, engine events outward to Ollama's NDJSON lines and objects, model facts to /api/tags,
/api/show and /api/ps entries.

Pure: nothing here touches an engine or a file; the routes pass in what the server knows
(`ServedModel`, `ModelFile`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Protocol

from kinetic.chat import types as neutral
from kinetic.chat.answer import AnswerPiece, AnswerStream, parse_answer
from kinetic.chat.toolcalls import ParsedCall
from kinetic.engine.types import Finished, GenerationRequest, ModelInfo, TextDelta, TokenLogprob
from kinetic.errors import InvalidRequestError, KineticError, NotFoundError, NotSupportedError, field_error
from kinetic.protocols.common import translate as common
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
from kinetic.streaming import ndjson_line

# What /api/version reports: recent enough that clients gating thinking or structured outputs on
# the version enable them.
OLLAMA_VERSION = "0.12.0"
# kinetic never unloads its model: /api/ps shows a far-future expiry, as Ollama does for keep_alive < 0.
NEVER_EXPIRES = "2099-01-01T00:00:00Z"
# llama.cpp's general.file_type numbers, named as Ollama names them in details.quantization_level.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4"}
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # format "json": Ollama's JSON grammar has an object at its root


def error_body(err: KineticError) -> dict[str, str]:
    return {"error": err.message}


def timestamp(seconds: float | None = None) -> str:
    """RFC 3339 in UTC with a Z, as Ollama writes `created_at` and `modified_at`."""
    moment = datetime.now(timezone.utc) if seconds is None else datetime.fromtimestamp(seconds, timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class ServedModel:
    """What the translation needs to know about the model behind the routes."""

    name: str
    aliases: tuple[str, ...]
    thinks: bool  # the chat template has a reasoning block
    n_ctx: int  # one slot's context, the most a request can use
    embeddings: bool = False
    generates: bool = True  # False: an embedding-only model (router mode)


class ModelFile(Protocol):
    """The served GGUF as /api/tags shows it (kinetic.backends.model_file.ModelFile, read off the event loop)."""

    @property
    def sha256(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def modified(self) -> float: ...  # seconds since the epoch


def check_model(requested: str, served: ServedModel) -> None:
    """The served model, one of its aliases, or either with Ollama's default `:latest` tag."""
    if not requested:
        raise InvalidRequestError("model is required", param="model")
    names = {served.name, *served.aliases}
    if requested in names or requested.removesuffix(":latest") in names or f"{requested}:latest" in names:
        return
    raise NotFoundError(f'model "{requested}" not found', param="model")


def human_number(n: int) -> str:
    """Ollama's parameter_size: 268098176 -> "268.10M", 8030261248 -> "8.0B", 7000000000 -> "7B"."""
    for scale, suffix, digits in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{suffix}" if value == math.floor(value) else f"{value:.{digits}f}{suffix}"
    return f"{n / 1e3:.0f}K" if n >= 1000 else str(n)


def quantization_level(info: ModelInfo) -> str:
    file_type = info.metadata.get("general.file_type", "")
    if file_type.isdigit() and int(file_type) in FILE_TYPES:
        return FILE_TYPES[int(file_type)]
    # llama.cpp's description says "Q4_K - Medium": Ollama writes Q4_K_M
    return info.ftype.replace(" - Medium", "_M").replace(" - Small", "_S").replace(" - Large", "_L").replace(" ", "_")


def details(info: ModelInfo) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
            "parameter_size": human_number(info.n_params), "quantization_level": quantization_level(info)}


def capabilities(served: ServedModel) -> list[str]:
    if not served.generates:
        return ["embedding"]
    found = ["completion", "tools"]
    if served.thinks:
        found.append("thinking")
    if served.embeddings:
        found.append("embedding")
    return found


def model_entry(served: ServedModel, info: ModelInfo, file: ModelFile) -> dict[str, Any]:
    """One model of /api/tags. Open WebUI reads both `name` and `model`."""
    return {"name": served.name, "model": served.name, "modified_at": timestamp(file.modified), "size": file.size,
            "digest": file.sha256, "details": details(info), "capabilities": capabilities(served)}


def tags(served: ServedModel, info: ModelInfo, file: ModelFile) -> dict[str, Any]:
    return {"models": [model_entry(served, info, file)]}


def no_model_file(name: str, route: str) -> NotSupportedError:
    """/api/show of a remote model: kinetic never sees its file, so has nothing to show."""
    return NotSupportedError(f"model '{name}' cannot serve {route}: it is served by another server, whose model "
                             "file kinetic does not read")


def unloaded_entry(name: str) -> dict[str, Any]:
    """A router's model that is not loaded: /api/tags lists it by name (its facts come with loading)."""
    return {"name": name, "model": name, "modified_at": timestamp(0), "size": 0, "digest": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [], "parameter_size": "",
                        "quantization_level": ""}, "capabilities": []}


def ps_entry(served: ServedModel, info: ModelInfo, file: ModelFile) -> dict[str, Any]:
    entry = {key: value for key, value in model_entry(served, info, file).items()
             if key not in ("modified_at", "capabilities")}
    return {**entry, "expires_at": NEVER_EXPIRES, "size_vram": 0, "context_length": served.n_ctx}


def ps(served: ServedModel, info: ModelInfo, file: ModelFile) -> dict[str, Any]:
    return {"models": [ps_entry(served, info, file)]}


def _metadata_value(text: str) -> Any:
    """GGUF metadata arrives as text: numbers become numbers again, as Ollama's model_info has them."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def show(served: ServedModel, info: ModelInfo, file: ModelFile, *, template: str, stop: tuple[str, ...],
         temperature: float) -> dict[str, Any]:
    model_info = {key: _metadata_value(value) for key, value in sorted(info.metadata.items())
                  if key != "tokenizer.chat_template"}
    arch = info.architecture
    model_info.update({"general.architecture": arch, "general.parameter_count": info.n_params,
                       f"{arch}.context_length": info.n_ctx_train, f"{arch}.embedding_length": info.n_embd})
    # Continue reads num_ctx and JSON-decodes each stop value: "key   value" lines, stops quoted.
    lines = [f"{'num_ctx':<30} {served.n_ctx}", f"{'temperature':<30} {temperature:g}"]
    lines += [f"{'stop':<30} {json.dumps(s, ensure_ascii=False)}" for s in stop if s]
    parameters = "\n".join(lines)
    modelfile = (f"# Modelfile generated by kinetic\nFROM {info.path}\n"
                 + "".join(f"PARAMETER {line}\n" for line in lines))
    return {"license": info.metadata.get("general.license", ""), "modelfile": modelfile, "parameters": parameters,
            "template": template, "details": details(info), "model_info": model_info,
            "capabilities": capabilities(served), "modified_at": timestamp(file.modified)}


# --------------------------------------------------------------------------------- inward


def _in_options(err: InvalidRequestError) -> InvalidRequestError:
    """A sampler error from the shared checks, renamed to where the client wrote the field."""
    if err.param is None:
        return err
    field, quoted = f"options.{err.param}", f"'{err.param}'"
    message = err.message.replace(quoted, f"'{field}'") if quoted in err.message else f"Field '{field}': {err.message}"
    return InvalidRequestError(message, param=field)


def generation_options(options: Options | None, *, logprobs: bool | None = None, top_logprobs: int | None = None,
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
        return neutral.OutputConstraint(schema=ANY_OBJECT, param="format")
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


def _images(images: list[str] | None) -> tuple[neutral.MediaPart, ...]:
    # The chat layer refuses media for a text-only model, naming the field.
    return tuple(neutral.MediaPart("image") for image in images or () if image)


def to_message(message: Message) -> neutral.Message:
    calls = tuple(neutral.ToolCall(name=call.function.name, arguments=call.function.arguments, id=call.id)
                  for call in message.tool_calls or ())
    parts: tuple[neutral.ContentPart, ...] | None = (neutral.TextPart(message.content or ""),) + _images(message.images)
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
        messages=tuple(to_message(m) for m in body.messages or ()),
        options=generation_options(body.options, logprobs=body.logprobs, top_logprobs=body.top_logprobs),
        tools=tools, template_kwargs=kwargs, reasoning_format=reasoning_format,
        output=output_constraint(body.format))


def check_generate(body: GenerateRequest, served: ServedModel) -> None:
    check_model(body.model, served)
    if body.suffix:
        raise InvalidRequestError(f"{served.name} does not support insert", param="suffix")
    if body.raw and (body.system or body.template or body.context):
        raise InvalidRequestError("raw mode does not support template, system, or context", param="raw")
    if body.raw and _images(body.images):
        raise InvalidRequestError("image input is not supported: this model reads text only", param="images")


def to_generate_chat(body: GenerateRequest, served: ServedModel) -> neutral.ChatRequest:
    """A templated /api/generate: `system` and `prompt` as a two-turn chat."""
    check_generate(body, served)
    kwargs, reasoning_format = reasoning(body.think, served)
    messages: list[neutral.Message] = []
    if body.system:
        messages.append(neutral.Message(role="system", parts=(neutral.TextPart(body.system),)))
    messages.append(neutral.Message(role="user", parts=(neutral.TextPart(body.prompt or ""),) + _images(body.images)))
    return neutral.ChatRequest(
        messages=tuple(messages),
        options=generation_options(body.options, logprobs=body.logprobs, top_logprobs=body.top_logprobs,
                                   context=body.context),
        template_kwargs=kwargs, reasoning_format=reasoning_format, output=output_constraint(body.format))


def to_prompt_request(body: GenerateRequest, served: ServedModel) -> neutral.PromptRequest:
    """A raw /api/generate: the prompt goes to the model verbatim."""
    check_generate(body, served)
    if body.think:
        raise InvalidRequestError("raw mode does not support think", param="think")
    return neutral.PromptRequest(
        prompt=body.prompt or "",
        options=generation_options(body.options, logprobs=body.logprobs, top_logprobs=body.top_logprobs),
        output=output_constraint(body.format))


def raw_prepared(generation: GenerationRequest) -> neutral.PreparedChat:
    """A raw prompt seen as a chat with no template: every generated character is the response."""
    return neutral.PreparedChat(prompt="", prompt_tokens=len(generation.prompt_tokens), starts_in_reasoning=False,
                                reasoning_format="none", tool_mode="none", tool_names=())


# -------------------------------------------------------------------------------- outward


@dataclass
class ReplyContext:
    """What the outward translation needs to know about the request it answers."""

    model: str  # as the client wrote it: Ollama echoes the requested name
    prepared: neutral.PreparedChat
    started_ns: int  # time.monotonic_ns() when the request arrived
    kind: Literal["chat", "generate"] = "chat"  # `message` objects, or `response` text
    n_probs: int = 0
    context: list[int] | None = None  # /api/generate's prompt tokens, returned with the output's


def reply_context(body: ChatRequest | GenerateRequest, prepared: neutral.PreparedChat, *, started_ns: int,
                  prompt_tokens: list[int] | None = None) -> ReplyContext:
    n_probs = max(body.top_logprobs or 0, 1) if body.logprobs else 0
    if isinstance(body, ChatRequest):
        return ReplyContext(model=body.model, prepared=prepared, started_ns=started_ns, n_probs=n_probs)
    return ReplyContext(model=body.model, prepared=prepared, started_ns=started_ns, kind="generate",
                        n_probs=n_probs, context=None if body.raw else list(prompt_tokens or []))


def metrics(finished: Finished, ctx: ReplyContext) -> dict[str, Any]:
    """The final object's counts and durations, in integer nanoseconds."""
    return {"done_reason": finished.finish_reason,
            "total_duration": time.monotonic_ns() - ctx.started_ns,
            "load_duration": 0,  # the model is resident
            "prompt_eval_count": finished.usage.prompt_tokens,
            "prompt_eval_duration": int(finished.timings.prompt_ms * 1e6),
            "eval_count": finished.usage.completion_tokens,
            "eval_duration": int(finished.timings.predicted_ms * 1e6)}


def tool_call(call: ParsedCall, index: int) -> dict[str, Any]:
    """Ollama's call: `arguments` is an object, never JSON text (ollama-python rejects a string)."""
    try:
        arguments = json.loads(call.arguments) if call.arguments else {}
    except json.JSONDecodeError:
        arguments = {}
    if not isinstance(arguments, dict):
        arguments = {"value": arguments}
    entry: dict[str, Any] = {"function": {"index": index, "name": call.name, "arguments": arguments}}
    if call.id:
        entry["id"] = call.id
    return entry


def logprob_entry(logprob: TokenLogprob, n_top: int) -> dict[str, Any]:
    return {"token": logprob.token, "logprob": logprob.logprob, "bytes": logprob.bytes,
            "top_logprobs": [{"token": alt.token, "logprob": alt.logprob, "bytes": alt.bytes}
                             for alt in logprob.top_logprobs[:n_top]]}


def _body(ctx: ReplyContext, *, content: str, thinking: str = "", calls: list[dict[str, Any]] | None = None,
          done: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": ctx.model, "created_at": timestamp()}
    if ctx.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        body["message"] = message
    else:
        body["response"] = content
        if thinking:
            body["thinking"] = thinking
    body["done"] = done
    return body


def _final(body: dict[str, Any], finished: Finished, ctx: ReplyContext) -> dict[str, Any]:
    body.update(metrics(finished, ctx))
    if ctx.context is not None:
        body["context"] = ctx.context + list(finished.tokens)
    return body


def to_response(deltas: list[TextDelta], finished: Finished, ctx: ReplyContext) -> dict[str, Any]:
    """The whole answer as one object (`stream: false`)."""
    answer = parse_answer(finished.text, ctx.prepared, finished.calls)
    calls = [tool_call(call, index) for index, call in enumerate(answer.calls)]
    body = _body(ctx, content=answer.content or "", thinking=answer.reasoning, calls=calls, done=True)
    if ctx.n_probs:
        body["logprobs"] = [logprob_entry(d.logprob, ctx.n_probs) for d in deltas if d.logprob]
    return _final(body, finished, ctx)


@dataclass
class _PendingCall:
    id: str | None
    name: str
    arguments: str = ""


@dataclass
class LineEncoder:
    """Engine events -> NDJSON lines: one per piece of thinking or content, the tool calls whole in
    one line once the answer is complete (Ollama sends parsed calls, not argument fragments), then
    the final `done: true` line with the metrics."""

    ctx: ReplyContext
    answer: AnswerStream = field(init=False)
    calls: dict[int, _PendingCall] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.answer = AnswerStream(self.ctx.prepared)

    def _lines(self, piece: AnswerPiece, logprob: TokenLogprob | None = None) -> list[bytes]:
        for delta in piece.calls:
            if delta.index not in self.calls:
                self.calls[delta.index] = _PendingCall(id=delta.id, name=delta.name or "")
            self.calls[delta.index].arguments += delta.arguments
        if not (piece.content or piece.reasoning or logprob):
            return []
        body = _body(self.ctx, content=piece.content, thinking=piece.reasoning, done=False)
        if logprob is not None:
            body["logprobs"] = [logprob_entry(logprob, self.ctx.n_probs)]
        return [ndjson_line(body)]

    def encode(self, event: TextDelta | Finished) -> list[bytes]:
        if isinstance(event, TextDelta):
            logprob = event.logprob if self.ctx.n_probs else None
            return self._lines(self.answer.push(event.text), logprob)
        lines = [line for piece in self.answer.finish(event.calls) for line in self._lines(piece)]
        if self.calls:
            calls = [tool_call(ParsedCall(name=c.name, arguments=c.arguments, id=c.id), index)
                     for index, c in sorted(self.calls.items())]
            lines.append(ndjson_line(_body(self.ctx, content="", calls=calls, done=False)))
        return lines + [ndjson_line(_final(_body(self.ctx, content="", done=True), event, self.ctx))]

    def error(self, err: KineticError) -> list[bytes]:
        """A failure after the stream started: a last `{"error": ...}` line (ollama-python raises it)."""
        return [ndjson_line(error_body(err))]


# ----------------------------------------------------------------------------- embeddings


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
