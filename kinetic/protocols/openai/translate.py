"""OpenAI <-> engine: requests inward to GenerationRequest, engine events outward to OpenAI JSON."""

from __future__ import annotations

import base64
import json
import secrets
import struct
import string
import time
from dataclasses import dataclass, field
from typing import Any

from kinetic.engine.reasoning import REASONING_FORMATS, ReasoningSplitter
from kinetic.engine.toolcalls import (
    AutoCallStream,
    CallDelta,
    ForcedCallStreamer,
    ParsedCall,
    new_call_id,
    parse_forced_calls,
    parse_tool_calls,
    split_arguments,
)
from kinetic.engine.types import Finished, GenerationRequest, TextDelta, TokenLogprob
from kinetic.errors import InvalidRequestError, KineticError, NotSupportedError, field_error, range_error
from kinetic.protocols import sampling
from kinetic.protocols.openai.constraints import ToolMode, chat_constraints
from kinetic.protocols.openai.types import ChatCompletionRequest, ChatMessage, CompletionRequest, EmbeddingRequest
from kinetic.service import Service
from kinetic.streaming import sse_data, sse_done

ALPHANUMERIC = string.ascii_letters + string.digits


def completion_id() -> str:
    return "chatcmpl-" + "".join(secrets.choice(ALPHANUMERIC) for _ in range(32))


def error_body(err: KineticError) -> dict[str, Any]:
    """OpenAI's envelope; 401 is exactly {"message", "type", "code"} as clients print it."""
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


def logprob_entry(logprob: TokenLogprob, n_top: int) -> dict[str, Any]:
    return {
        "id": logprob.id,
        "token": logprob.token,
        "bytes": logprob.bytes,
        "logprob": logprob.logprob,
        "top_logprobs": [
            {"id": alt.id, "token": alt.token, "bytes": alt.bytes, "logprob": alt.logprob}
            for alt in logprob.top_logprobs[:n_top]
        ],
    }


# --------------------------------------------------------------------------- chat: inward


@dataclass
class ChatContext:
    """What the outward translation needs to know about the request it answers."""

    id: str
    created: int
    model: str
    reasoning_format: str
    starts_in_reasoning: bool
    top_logprobs: int | None  # None: logprobs not requested
    include_usage: bool
    fingerprint: str
    tool_mode: ToolMode = "none"
    tool_names: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.reasoning_format, starts_inside=self.starts_in_reasoning)


def template_message(message: ChatMessage) -> dict[str, Any]:
    """A message as chat templates expect it: text parts joined, tool-call arguments as objects."""
    data = message.model_dump(exclude_none=True)
    if message.role == "developer":
        data["role"] = "system"
    if isinstance(message.content, list):
        texts = []
        for part in message.content:
            if part.type != "text":
                raise InvalidRequestError(f"{part.type} input is not supported: this model reads text only",
                                          param="messages")
            texts.append(part.text)  # type: ignore[union-attr]
        data["content"] = "\n".join(texts)
    if message.tool_calls:
        calls = []
        for call in data["tool_calls"]:
            arguments = call["function"].get("arguments", "")
            if isinstance(arguments, str):
                try:
                    call["function"]["arguments"] = json.loads(arguments) if arguments else {}
                except json.JSONDecodeError:
                    pass
            calls.append(call)
        data["tool_calls"] = calls
    return data


def validate_messages(messages: list[ChatMessage]) -> None:
    if not messages:
        raise field_error("messages", "must contain at least one message, but got an empty list")
    for index, message in enumerate(messages):
        if message.role == "assistant":
            if message.content is None and not message.tool_calls:
                raise InvalidRequestError("Assistant message must contain either 'content' or 'tool_calls'!",
                                          param=f"messages[{index}]")
        elif message.content is None:
            raise InvalidRequestError("All non-assistant messages must contain 'content'",
                                      param=f"messages[{index}].content")


def validate_chat(req: ChatCompletionRequest) -> None:
    validate_messages(req.messages)
    if req.n is not None and req.n != 1:
        raise range_error("n", 1, 1, req.n)
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be set to true", param="top_logprobs")
        sampling.check_range("top_logprobs", req.top_logprobs, 0, sampling.MAX_TOP_LOGPROBS)
    if req.logprobs and req.stream and req.tools and req.tool_choice != "none":
        # streamed calls are assembled from held-back text, which no token's logprob maps onto
        raise InvalidRequestError("logprobs is not supported with tools + stream", param="logprobs")
    if req.reasoning_format is not None and req.reasoning_format not in REASONING_FORMATS:
        raise field_error("reasoning_format", f"must be one of {', '.join(REASONING_FORMATS)}, but got {req.reasoning_format!r}")


def to_generation(req: ChatCompletionRequest, service: Service) -> tuple[GenerationRequest, ChatContext]:
    validate_chat(req)
    max_tokens = sampling.max_tokens_from(service, [
        ("n_predict", req.n_predict), ("max_completion_tokens", req.max_completion_tokens),
        ("max_tokens", req.max_tokens)])
    messages = [template_message(m) for m in req.messages]
    constraints = chat_constraints(req)
    rendered = service.render_chat(messages, tools=constraints.tools, template_kwargs=req.chat_template_kwargs,
                                   add_generation_prompt=req.add_generation_prompt is not False)
    top_logprobs = (req.top_logprobs if req.top_logprobs is not None else 0) if req.logprobs else None
    generation = GenerationRequest(
        prompt_tokens=rendered.tokens,
        sampling=sampling.sampling_from(service, req, grammar=constraints.grammar),
        max_tokens=max_tokens,
        stop=sampling.stop_list(req.stop),
        n_probs=max(top_logprobs or 0, 1) if req.logprobs else 0,
        cache_prompt=req.cache_prompt is not False,
        id_slot=req.id_slot if req.id_slot is not None else -1,
    )
    context = ChatContext(
        id=completion_id(),
        created=int(time.time()),
        model=service.model_name,
        reasoning_format=req.reasoning_format or service.settings.reasoning_format,
        starts_in_reasoning=rendered.starts_in_reasoning,
        top_logprobs=top_logprobs,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        fingerprint=service.system_fingerprint,
        tool_mode=constraints.tool_mode,
        tool_names=constraints.tool_names,
    )
    return generation, context


# -------------------------------------------------------------------------- chat: outward


def answer_calls(content: str, ctx: ChatContext) -> tuple[str | None, list[ParsedCall]]:
    """The answer's text and its tool calls; text is null when the answer is only calls (OpenAI)."""
    if ctx.tool_mode == "forced":
        calls = parse_forced_calls(content)
        if calls is None:  # cut short by the token limit: what was generated is returned as text
            return content, []
        return None, calls
    if ctx.tool_mode == "auto":
        reply = parse_tool_calls(content, ctx.tool_names)
        if reply.calls:
            return reply.content or None, reply.calls
    return content, []


def finish_reason(finished: Finished, has_calls: bool) -> str:
    return "tool_calls" if has_calls and finished.finish_reason == "stop" else finished.finish_reason


def to_chat_completion(deltas: list[TextDelta], finished: Finished, ctx: ChatContext) -> dict[str, Any]:
    splitter = ctx.splitter()
    reasoning, content = splitter.push(finished.text)
    tail_reasoning, tail_content = splitter.flush()
    text, calls = answer_calls(content + tail_content, ctx)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning + tail_reasoning:
        message["reasoning_content"] = reasoning + tail_reasoning
    if calls:
        message["tool_calls"] = [
            {"type": "function", "id": call.id or new_call_id(),
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls]
    choice: dict[str, Any] = {"finish_reason": finish_reason(finished, bool(calls)), "index": 0, "message": message}
    if ctx.top_logprobs is not None:
        choice["logprobs"] = {"content": [logprob_entry(d.logprob, ctx.top_logprobs) for d in deltas if d.logprob]}
    return {
        "choices": [choice],
        "created": ctx.created,
        "model": ctx.model,
        "system_fingerprint": ctx.fingerprint,
        "object": "chat.completion",
        "usage": usage_dict(finished),
        "id": ctx.id,
        "timings": finished.timings.to_dict(),
    }


class ChunkEncoder:
    """Engine events -> `data: {chat.completion.chunk}` frames, ending with `data: [DONE]`."""

    def __init__(self, ctx: ChatContext):
        self.ctx = ctx
        self.splitter = ctx.splitter()
        self.started = False
        self.forced = ForcedCallStreamer() if ctx.tool_mode == "forced" else None
        self.forced_text = ""  # forced output, returned as text if it never became a call
        self.auto = AutoCallStream(ctx.tool_names) if ctx.tool_mode == "auto" else None
        self.n_calls = 0

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse_data({"choices": choices, "created": self.ctx.created, "id": self.ctx.id,
                         "model": self.ctx.model, "system_fingerprint": self.ctx.fingerprint,
                         "object": "chat.completion.chunk", **extra})

    def _delta(self, delta: dict[str, Any], logprobs: dict[str, Any] | None = None) -> bytes:
        choice: dict[str, Any] = {"finish_reason": None, "index": 0, "delta": delta}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        return self._chunk([choice])

    def encode(self, event: TextDelta | Finished) -> list[bytes]:
        frames: list[bytes] = []
        if not self.started:
            self.started = True
            frames.append(self._delta({"role": "assistant", "content": None}))
        if isinstance(event, Finished):
            return frames + self._finish(event)
        reasoning, content = self.splitter.push(event.text)
        frames += self._text_frames(reasoning, content, event)
        return frames

    def _text_frames(self, reasoning: str, content: str, event: TextDelta | None) -> list[bytes]:
        if self.ctx.reasoning_format == "deepseek-legacy":
            reasoning = ""  # legacy streams keep the thoughts inside content
        logprobs = None
        if event is not None and event.logprob is not None and self.ctx.top_logprobs is not None:
            logprobs = {"content": [logprob_entry(event.logprob, self.ctx.top_logprobs)]}
        frames = []
        if reasoning:
            frames.append(self._delta({"reasoning_content": reasoning}))
        if self.forced is not None:
            self.forced_text += content
            return frames + self._call_frames(self.forced.feed(content))
        if self.auto is not None:
            content = self.auto.push(content)
        if content or (logprobs and not reasoning):
            frames.append(self._delta({"content": content}, logprobs))
        return frames

    def _call_frames(self, deltas: list[CallDelta]) -> list[bytes]:
        self.n_calls = max([self.n_calls] + [d.index + 1 for d in deltas])
        return [self._delta({"tool_calls": [d.to_dict()]}) for d in deltas]

    def _held_back(self) -> list[bytes]:
        """At the end: what tool handling kept back, as content and/or whole calls."""
        if self.forced is not None:
            if self.n_calls == 0 and self.forced_text:
                return [self._delta({"content": self.forced_text})]
            return []
        if self.auto is None:
            return []
        content, calls = self.auto.finish()
        frames = [self._delta({"content": content})] if content else []
        for index, call in enumerate(calls):
            pieces = split_arguments(call.arguments)
            deltas = [CallDelta(index=index, arguments=pieces[0], id=call.id or new_call_id(), name=call.name)]
            deltas += [CallDelta(index=index, arguments=piece) for piece in pieces[1:]]
            frames += self._call_frames(deltas)
        return frames

    def _finish(self, finished: Finished) -> list[bytes]:
        frames = self._text_frames(*self.splitter.flush(), None) + self._held_back()
        timings = finished.timings.to_dict()
        finish_choice = {"finish_reason": finish_reason(finished, self.n_calls > 0), "index": 0, "delta": {}}
        if self.ctx.include_usage:
            frames.append(self._chunk([finish_choice]))
            frames.append(self._chunk([], usage=usage_dict(finished), timings=timings))
        else:
            frames.append(self._chunk([finish_choice], timings=timings))
        frames.append(sse_done())
        return frames

    def error(self, err: KineticError) -> list[bytes]:
        return [sse_data(error_body(err))]


# ----------------------------------------------------------------------- legacy completions


@dataclass
class CompletionContext:
    id: str
    created: int
    model: str
    n_probs: int
    fingerprint: str


def prompt_tokens(prompt: Any, service: Service, field_name: str = "prompt") -> list[int]:
    """A prompt given as text, token ids, or a one-element list of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return service.tokenize_prompt(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        invalid = [t for t in prompt if not service.engine.valid_token(t)]
        if invalid:
            raise InvalidRequestError("Prompt contains invalid tokens", param=field_name)
        return list(prompt)
    if isinstance(prompt, list) and not prompt:
        raise field_error(field_name, "must not be empty")
    raise field_error(field_name, "must be a string or a list of token ids (one prompt per request)")


def to_completion_generation(req: CompletionRequest, service: Service) -> tuple[GenerationRequest, CompletionContext]:
    if req.n is not None and req.n != 1:
        raise range_error("n", 1, 1, req.n)
    n_probs = req.n_probs if req.n_probs is not None else (req.logprobs or 0)
    sampling.check_range("logprobs", n_probs, 0, sampling.MAX_TOP_LOGPROBS)
    generation = GenerationRequest(
        prompt_tokens=prompt_tokens(req.prompt, service),
        sampling=sampling.sampling_from(service, req, grammar=req.grammar),
        max_tokens=sampling.max_tokens_from(service, [("n_predict", req.n_predict), ("max_tokens", req.max_tokens)]),
        stop=sampling.stop_list(req.stop),
        n_probs=n_probs,
        cache_prompt=req.cache_prompt is not False,
        id_slot=req.id_slot if req.id_slot is not None else -1,
    )
    ctx = CompletionContext(id=completion_id(), created=int(time.time()), model=service.model_name,
                            n_probs=n_probs, fingerprint=service.system_fingerprint)
    return generation, ctx


def _completion_logprobs(deltas: list[TextDelta], ctx: CompletionContext) -> dict[str, Any] | None:
    if not ctx.n_probs:
        return None
    return {"content": [logprob_entry(d.logprob, ctx.n_probs) for d in deltas if d.logprob]}


def _completion_envelope(ctx: CompletionContext, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"choices": choices, "created": ctx.created, "model": ctx.model, "system_fingerprint": ctx.fingerprint,
            "object": "text_completion", "id": ctx.id, **extra}


def to_completion(deltas: list[TextDelta], finished: Finished, ctx: CompletionContext) -> dict[str, Any]:
    choice = {"text": finished.text, "index": 0, "logprobs": _completion_logprobs(deltas, ctx),
              "finish_reason": finished.finish_reason}
    return _completion_envelope(ctx, [choice], usage=usage_dict(finished), timings=finished.timings.to_dict())


class CompletionChunkEncoder:
    """Engine events -> `data: {text_completion}` frames; the last carries usage and timings."""

    def __init__(self, ctx: CompletionContext):
        self.ctx = ctx

    def encode(self, event: TextDelta | Finished) -> list[bytes]:
        if isinstance(event, Finished):
            choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": event.finish_reason}
            return [sse_data(_completion_envelope(self.ctx, [choice], usage=usage_dict(event),
                                                  timings=event.timings.to_dict())), sse_done()]
        if not event.text and event.logprob is None:
            return []
        logprobs = _completion_logprobs([event], self.ctx)
        choice = {"text": event.text, "index": 0, "logprobs": logprobs, "finish_reason": None}
        return [sse_data(_completion_envelope(self.ctx, [choice]))]

    def error(self, err: KineticError) -> list[bytes]:
        return [sse_data(error_body(err))]


# ------------------------------------------------------------------------------- embeddings


def embedding_inputs(req: EmbeddingRequest, service: Service) -> list[list[int]]:
    """Token lists to embed: `input` as a string, strings, token ids, or lists of token ids."""
    if not service.settings.embeddings:
        raise NotSupportedError("This server does not support embeddings. Start it with `--embeddings`")
    raw = req.input
    if isinstance(raw, list) and not raw:
        raise InvalidRequestError('"input" must not be empty', param="input")
    if isinstance(raw, str) or (isinstance(raw, list) and all(isinstance(t, int) for t in raw)):
        items: list[Any] = [raw]  # one text, or one prompt of token ids
    else:
        items = list(raw)
    limit = service.engine.embedding_n_ctx
    token_lists = []
    for index, item in enumerate(items):
        param = "input" if len(items) == 1 else f"input[{index}]"
        if isinstance(item, str):
            tokens = service.engine.tokenize(item, add_special=True, parse_special=True)
        else:
            tokens = list(item)
            if any(not service.engine.valid_token(t) for t in tokens):
                raise InvalidRequestError("Input contains invalid tokens", param=param)
        if not tokens:
            raise InvalidRequestError("Input content cannot be empty", param=param)
        if len(tokens) > limit:
            raise InvalidRequestError(f"input ({len(tokens)} tokens) is too large to process: the embedding "
                                      f"context holds {limit} tokens", param=param)
        token_lists.append(tokens)
    return token_lists


def check_embedding_request(req: EmbeddingRequest, n_embd: int) -> None:
    if req.encoding_format not in (None, "float", "base64"):
        raise InvalidRequestError("The format to return the embeddings in. Can be either float or base64",
                                  param="encoding_format")
    if req.dimensions is not None and req.dimensions != n_embd:
        # the pooled vector has the model's width; truncating it would silently change its meaning
        raise field_error("dimensions", f"this model's embeddings have {n_embd} dimensions, but got {req.dimensions}")


def to_embeddings(req: EmbeddingRequest, inputs: list[list[int]], vectors: list[list[float]],
                  service: Service) -> dict[str, Any]:
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
    n_tokens = sum(len(tokens) for tokens in inputs)
    return {"model": service.model_name, "object": "list", "data": data,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}
