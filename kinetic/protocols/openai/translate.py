"""OpenAI <-> kinetic: wire requests inward to neutral requests, engine results outward to OpenAI JSON.

Pure: nothing here touches an engine. Rendering, tokenizing and grammar compilation happen in
the chat layer (kinetic.chat.prepare), between `to_chat_request` and the engine.
"""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kinetic.chat.answer import AnswerPiece, parse_answer
from kinetic.chat.reasoning import REASONING_FORMATS
from kinetic.chat.toolcalls import CallDelta, new_call_id
from kinetic.chat.types import (
    AnswerFormat,
    ChatRequest,
    OutputConstraint,
    PreparedRequest,
    PromptInput,
    PromptRequest,
    ToolChoice,
)
from kinetic.classroom.outcome import Outcome
from kinetic.engine.types import Event, Finished, PromptProgress, TextDelta
from kinetic.errors import InvalidRequestError, KineticError, field_error, range_error
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.answer_encoder import AnswerEncoder
from kinetic.protocols.common.native import generation_settings, native_result
from kinetic.protocols.common.streaming import sse_data, sse_done
from kinetic.protocols.openai.types import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, ResponseFormat


def completion_id() -> str:
    return common.random_id("chatcmpl-", 32)


def error_body(err: KineticError) -> dict[str, Any]:
    """OpenAI's envelope, which llama-server also uses; the type is the error class's `kind`
    (llama-server's table). 401 is exactly {"message", "type", "code"} as clients print it."""
    body: dict[str, Any] = {"message": err.message, "type": err.kind}
    if err.param is not None:
        body["param"] = err.param
    body["code"] = err.status
    body.update(err.extra)
    return {"error": body}


def usage_dict(finished: Finished) -> dict[str, Any]:
    usage = finished.usage
    return {
        "completion_tokens": usage.completion_tokens,
        "prompt_tokens": usage.prompt_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


# --------------------------------------------------------------------------- chat: inward


def validate_chat(req: ChatCompletionRequest) -> None:
    if req.n is not None and req.n != 1:
        raise range_error("n", 1, 1, req.n)
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be set to true", param="top_logprobs")
        common.check_range("top_logprobs", req.top_logprobs, 0, common.MAX_TOP_LOGPROBS)
    if req.logprobs and req.stream and req.tools and req.tool_choice != "none":
        # streamed calls are assembled from held-back text, which no token's logprob maps onto
        raise InvalidRequestError("logprobs is not supported with tools + stream", param="logprobs")
    if req.reasoning_format is not None and req.reasoning_format not in REASONING_FORMATS:
        raise field_error("reasoning_format",
                          f"must be one of {', '.join(REASONING_FORMATS)}, but got {req.reasoning_format!r}")


def output_constraint(req: ChatCompletionRequest) -> OutputConstraint:
    """The constraint `response_format`, `json_schema` and `grammar` ask for.

    `response_format` wins over the top-level `json_schema`, except that a schema-less json_object
    keeps the top-level schema (llama-server's rule). json_object without any schema allows any
    JSON value, as llama.cpp does (seed 000)."""
    fmt: ResponseFormat | None = req.response_format
    grammar = req.grammar
    if fmt is None or fmt.type == "text":
        if req.json_schema is not None:
            return OutputConstraint(grammar=grammar, schema=req.json_schema, param="json_schema")
        return OutputConstraint(grammar=grammar, param="grammar" if grammar is not None else "")
    if fmt.type == "json_object":
        if fmt.schema_ is not None:
            return OutputConstraint(grammar=grammar, schema=fmt.schema_, param="response_format.schema")
        if req.json_schema is not None:
            return OutputConstraint(grammar=grammar, schema=req.json_schema, param="json_schema")
        return OutputConstraint(grammar=grammar, any_json=True, param="response_format")
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None:  # some clients put the schema at the top of response_format
            schema = fmt.schema_ if fmt.schema_ is not None else common.ANY_OBJECT
            return OutputConstraint(grammar=grammar, schema=schema, param="response_format.schema")
        if not isinstance(spec, dict):
            raise field_error("response_format.json_schema", "must be an object")
        schema = spec.get("schema", common.ANY_OBJECT)
        if not isinstance(schema, dict):
            raise field_error("response_format.json_schema.schema",
                              f"invalid JSON schema: must be an object, but got {type(schema).__name__}")
        return OutputConstraint(grammar=grammar, schema=schema, param="response_format.json_schema.schema")
    names = ", ".join(f'"{t}"' for t in common.FORMAT_TYPES)
    raise InvalidRequestError(f"response_format type must be one of {names}, but got: {fmt.type}",
                              param="response_format.type")


def tool_choice(req: ChatCompletionRequest) -> ToolChoice:
    choice = req.tool_choice
    if choice is None:
        return ToolChoice("auto")
    if isinstance(choice, str):
        return ToolChoice(choice)
    return ToolChoice("required", choice.function.name)


def to_chat_request(req: ChatCompletionRequest) -> ChatRequest:
    validate_chat(req)
    messages = common.to_messages(req.messages)
    max_tokens = common.max_tokens_from([("n_predict", req.n_predict),
                                         ("max_completion_tokens", req.max_completion_tokens),
                                         ("max_tokens", req.max_tokens)])
    top_logprobs = req.top_logprobs or 0
    return ChatRequest(
        messages=messages,
        options=common.generation_options(req, max_tokens=max_tokens,
                                          n_probs=max(top_logprobs, 1) if req.logprobs else 0),
        tools=common.to_tools(req.tools),
        tool_choice=tool_choice(req),
        parallel_tool_calls=req.parallel_tool_calls is True,
        template_kwargs=template_kwargs(req),
        add_generation_prompt=req.add_generation_prompt is not False,
        reasoning_format=req.reasoning_format,
        reasoning_budget=reasoning_budget(req),
        reasoning_budget_message=req.reasoning_budget_message,
        reasoning_control=req.reasoning_control is True,
        output=output_constraint(req),
        continue_final_message=common.continuation(req.continue_final_message),
    )


def reasoning_budget(req: ChatCompletionRequest) -> int | None:
    """`reasoning_budget_tokens`, else `thinking_budget_tokens` (llama-server reads both; -1: the server's)."""
    for name in ("reasoning_budget_tokens", "thinking_budget_tokens"):
        value = getattr(req, name)
        if value is not None:
            common.check_range(name, value, -1, common.INT_MAX)
            return value
    return None


def template_kwargs(req: ChatCompletionRequest) -> dict[str, Any]:
    """`chat_template_kwargs`, with `reasoning_effort` as llama-server passes it: "none" turns thinking off,
    another level reaches the template as `reasoning_effort`."""
    kwargs = dict(req.chat_template_kwargs or {})
    if req.reasoning_effort == "none":
        kwargs["enable_thinking"] = False
        kwargs.pop("reasoning_effort", None)
    elif req.reasoning_effort:
        kwargs["reasoning_effort"] = req.reasoning_effort
    return kwargs


@dataclass
class ChatContext:
    """What the outward translation needs to know about the request it answers."""

    id: str
    created: int
    model: str
    answer_format: AnswerFormat
    top_logprobs: int | None  # None: logprobs not requested
    include_usage: bool
    fingerprint: str
    verbose_settings: dict[str, Any] | None = None  # generation_settings for `__verbose`; None: not asked
    verbose_prompt: str = ""  # the prompt's text for `__verbose` (as the model read it, special tokens written)
    outcome: Outcome = field(default_factory=Outcome)

    def __post_init__(self) -> None:
        self.outcome.id, self.outcome.model = self.id, self.model


def chat_context(req: ChatCompletionRequest, answer_format: AnswerFormat, *, model: str, fingerprint: str,
                 generation: PreparedRequest | None = None, verbose: bool = False,
                 speculative: tuple[str, ...] = (), prompt_text: Callable[[], str] = str) -> ChatContext:
    """`verbose` is the server's --verbose; the request's `verbose` field overrides it. `prompt_text` gives
    the prompt's text, asked only for `__verbose`."""
    wants_verbose = (req.verbose if req.verbose is not None else verbose) and generation is not None
    return ChatContext(
        id=completion_id(),
        created=int(time.time()),
        model=model,
        answer_format=answer_format,
        top_logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        fingerprint=fingerprint,
        verbose_settings=generation_settings(generation, stream=bool(req.stream), speculative=speculative)
        if wants_verbose and generation is not None else None,
        verbose_prompt=prompt_text() if wants_verbose else "",
    )


def verbose_body(finished: Finished, ctx: ChatContext) -> dict[str, Any]:
    """llama-server's `__verbose`: the native /completion result of this request, its prompt text included."""
    assert ctx.verbose_settings is not None
    return native_result(finished, model=ctx.model, prompt=ctx.verbose_prompt, settings=ctx.verbose_settings,
                         content=finished.text, tokens=[])


# -------------------------------------------------------------------------- chat: outward


def finish_reason(finished: Finished, has_calls: bool) -> str:
    return "tool_calls" if has_calls and finished.finish_reason == "stop" else finished.finish_reason


def to_chat_completion(deltas: list[TextDelta], finished: Finished, ctx: ChatContext) -> dict[str, Any]:
    answer = parse_answer(finished.text, ctx.answer_format, finished.calls)
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    reason = finish_reason(finished, bool(answer.calls))
    ctx.outcome.finished(finished, reason, answer=answer.content)
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    if answer.calls:
        message["tool_calls"] = []
        for call in answer.calls:
            call_id = call.id or new_call_id()
            ctx.outcome.call(call_id, call.name)
            message["tool_calls"].append({"type": "function", "id": call_id,
                                          "function": {"name": call.name, "arguments": call.arguments}})
    choice: dict[str, Any] = {"finish_reason": reason, "index": 0, "message": message}
    if ctx.top_logprobs is not None:
        choice["logprobs"] = {"content": [common.logprob_entry(d.logprob, ctx.top_logprobs)
                                          for d in deltas if d.logprob]}
    body = {
        "choices": [choice],
        "created": ctx.created,
        "model": ctx.model,
        "system_fingerprint": ctx.fingerprint,
        "object": "chat.completion",
        "usage": usage_dict(finished),
        "id": ctx.id,
        "timings": finished.timings.to_dict(),
    }
    if ctx.verbose_settings is not None:
        body["__verbose"] = verbose_body(finished, ctx)
    return body


def call_delta(delta: CallDelta) -> dict[str, Any]:
    """OpenAI's streamed tool-call piece: the first names the call, later ones add argument text."""
    if delta.id is not None:
        return {"index": delta.index, "id": delta.id, "type": "function",
                "function": {"name": delta.name, "arguments": delta.arguments}}
    return {"index": delta.index, "function": {"arguments": delta.arguments}}


@dataclass
class ChunkEncoder(AnswerEncoder[ChatContext]):
    """Engine events -> `data: {chat.completion.chunk}` frames, ending with `data: [DONE]`."""

    started: bool = False

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse_data({"choices": choices, "created": self.ctx.created, "id": self.ctx.id,
                         "model": self.ctx.model, "system_fingerprint": self.ctx.fingerprint,
                         "object": "chat.completion.chunk", **extra})

    def _delta(self, delta: dict[str, Any], logprobs: dict[str, Any] | None = None) -> bytes:
        choice: dict[str, Any] = {"finish_reason": None, "index": 0, "delta": delta}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        return self._chunk([choice])

    def _frames(self, piece: AnswerPiece, logprobs: dict[str, Any] | None = None) -> list[bytes]:
        frames = []
        if piece.reasoning:
            frames.append(self._delta({"reasoning_content": piece.reasoning}))
        if piece.content or (logprobs and not piece.reasoning):
            frames.append(self._delta({"content": piece.content}, logprobs))
            self.outcome.chunk(piece.content)
        for call in piece.calls:
            if call.id is not None:
                self.outcome.call(call.id, call.name or "")
            frames.append(self._delta({"tool_calls": [call_delta(call)]}))
        return frames

    def encode(self, event: Event) -> list[bytes]:
        if isinstance(event, PromptProgress):  # asked for by llama.cpp's /completion only: nothing to send here
            return []
        frames: list[bytes] = []
        if not self.started:
            self.started = True
            frames.append(self._delta({"role": "assistant", "content": None}))
        if isinstance(event, Finished):
            return frames + self._finish(event)
        logprobs = None
        if event.logprob is not None and self.ctx.top_logprobs is not None:
            logprobs = {"content": [common.logprob_entry(event.logprob, self.ctx.top_logprobs)]}
        return frames + self._frames(self.answer.push(event.text), logprobs)

    def _finish(self, finished: Finished) -> list[bytes]:
        frames = [frame for piece in self.answer.finish(finished.calls) for frame in self._frames(piece)]
        timings = finished.timings.to_dict()
        reason = finish_reason(finished, self.answer.n_calls > 0)
        self.outcome.finished(finished, reason)
        finish_choice = {"finish_reason": reason, "index": 0, "delta": {}}
        # llama-server puts `__verbose` on the first chunk of the final result
        verbose = {"__verbose": verbose_body(finished, self.ctx)} if self.ctx.verbose_settings is not None else {}
        if self.ctx.include_usage:
            frames.append(self._chunk([finish_choice], **verbose))
            frames.append(self._chunk([], usage=usage_dict(finished), timings=timings))
        else:
            frames.append(self._chunk([finish_choice], timings=timings, **verbose))
        frames.append(sse_done())
        return frames

    def error(self, err: KineticError) -> list[bytes]:
        """A failure after the headers went out: the error in-band, then the stream still ends as
        OpenAI streams end, so clients waiting for [DONE] do not hang or crash."""
        return [sse_data(error_body(err)), sse_done()]


# ----------------------------------------------------------------------- legacy completions


@dataclass
class CompletionContext:
    id: str
    created: int
    model: str
    n_probs: int
    fingerprint: str
    outcome: Outcome = field(default_factory=Outcome)

    def __post_init__(self) -> None:
        self.outcome.id, self.outcome.model = self.id, self.model


def to_prompt_request(req: CompletionRequest) -> PromptRequest:
    if req.n is not None and req.n != 1:
        raise range_error("n", 1, 1, req.n)
    n_probs = req.n_probs if req.n_probs is not None else (req.logprobs or 0)
    common.check_range("logprobs", n_probs, 0, common.MAX_TOP_LOGPROBS)
    max_tokens = common.max_tokens_from([("n_predict", req.n_predict), ("max_tokens", req.max_tokens)])
    output = OutputConstraint(grammar=req.grammar, schema=req.json_schema,
                              param="json_schema" if req.json_schema is not None else "grammar")
    return PromptRequest(prompt=common.prompt_input(req.prompt),
                         options=common.generation_options(req, max_tokens=max_tokens, n_probs=n_probs),
                         output=output)


def completion_context(req: CompletionRequest, *, model: str, fingerprint: str) -> CompletionContext:
    n_probs = req.n_probs if req.n_probs is not None else (req.logprobs or 0)
    return CompletionContext(id=completion_id(), created=int(time.time()), model=model, n_probs=n_probs,
                             fingerprint=fingerprint)


def _completion_logprobs(deltas: list[TextDelta], ctx: CompletionContext) -> dict[str, Any] | None:
    if not ctx.n_probs:
        return None
    return {"content": [common.logprob_entry(d.logprob, ctx.n_probs) for d in deltas if d.logprob]}


def _completion_envelope(ctx: CompletionContext, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"choices": choices, "created": ctx.created, "model": ctx.model, "system_fingerprint": ctx.fingerprint,
            "object": "text_completion", "id": ctx.id, **extra}


def to_completion(deltas: list[TextDelta], finished: Finished, ctx: CompletionContext) -> dict[str, Any]:
    choice = {"text": finished.text, "index": 0, "logprobs": _completion_logprobs(deltas, ctx),
              "finish_reason": finished.finish_reason}
    ctx.outcome.finished(finished, finished.finish_reason, answer=finished.text)
    return _completion_envelope(ctx, [choice], usage=usage_dict(finished), timings=finished.timings.to_dict())


class CompletionChunkEncoder:
    """Engine events -> `data: {text_completion}` frames; the last carries usage and timings."""

    def __init__(self, ctx: CompletionContext):
        self.ctx = ctx

    @property
    def outcome(self) -> Outcome:
        return self.ctx.outcome

    def encode(self, event: Event) -> list[bytes]:
        if isinstance(event, PromptProgress):  # asked for by llama.cpp's /completion only: nothing to send here
            return []
        if isinstance(event, Finished):
            self.outcome.finished(event, event.finish_reason)
            choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": event.finish_reason}
            return [sse_data(_completion_envelope(self.ctx, [choice], usage=usage_dict(event),
                                                  timings=event.timings.to_dict())), sse_done()]
        if not event.text and event.logprob is None:
            return []
        logprobs = _completion_logprobs([event], self.ctx)
        self.outcome.chunk(event.text)
        choice = {"text": event.text, "index": 0, "logprobs": logprobs, "finish_reason": None}
        return [sse_data(_completion_envelope(self.ctx, [choice]))]

    def error(self, err: KineticError) -> list[bytes]:
        return [sse_data(error_body(err)), sse_done()]


# ------------------------------------------------------------------------------- embeddings


def embedding_inputs(req: EmbeddingRequest) -> tuple[list[PromptInput], list[str]]:
    """What to embed (texts or token-id lists) and the field each came from, validated."""
    raw = req.input
    if isinstance(raw, list) and not raw:
        raise InvalidRequestError('"input" must not be empty', param="input")
    if req.encoding_format not in (None, "float", "base64"):
        raise InvalidRequestError("The format to return the embeddings in. Can be either float or base64",
                                  param="encoding_format")
    if isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(t, int) for t in raw)):
        items: list[PromptInput] = [raw]  # type: ignore[list-item]  # one text, or one prompt of token ids
    else:
        items = list(raw)  # type: ignore[arg-type]  # a list of texts or of token-id lists
    params = ["input"] if len(items) == 1 else [f"input[{i}]" for i in range(len(items))]
    return items, params


def check_dimensions(req: EmbeddingRequest, n_embd: int) -> None:
    if req.dimensions is not None and req.dimensions != n_embd:
        # the pooled vector has the model's width; truncating it would silently change its meaning
        raise field_error("dimensions", f"this model's embeddings have {n_embd} dimensions, but got {req.dimensions}")


def to_embeddings(req: EmbeddingRequest, n_tokens: int, vectors: list[list[float]], model: str) -> dict[str, Any]:
    data = []
    for index, vector in enumerate(vectors):
        item: dict[str, Any] = {"index": index, "object": "embedding"}
        if req.encoding_format == "base64":
            # little-endian float32, what the openai SDK decodes by default
            item["embedding"] = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
            item["encoding_format"] = "base64"
        else:
            item["embedding"] = vector
        data.append(item)
    return {"model": model, "object": "list", "data": data,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}

