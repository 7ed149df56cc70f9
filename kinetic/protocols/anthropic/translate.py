"""Anthropic Messages <-> engine: requests inward to GenerationRequest, events outward to
Anthropic's message JSON and its named SSE events (message_start ... message_stop)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from kinetic.engine.reasoning import ReasoningSplitter
from kinetic.engine.types import Finished, GenerationRequest, TextDelta
from kinetic.errors import InvalidRequestError, KineticError, field_error
from kinetic.protocols import sampling
from kinetic.protocols.anthropic.types import CountTokensRequest, Message, MessagesRequest, TextBlock
from kinetic.protocols.openai.translate import ALPHANUMERIC
from kinetic.protocols.openai.types import SamplingFields
from kinetic.service import RenderedChat, Service
from kinetic.streaming import sse_event

STOP_REASONS = {"eos": "end_turn", "word": "stop_sequence", "limit": "max_tokens", "none": "end_turn"}
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error"}


def error_body(err: KineticError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(err.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def message_id() -> str:
    return "msg_" + "".join(secrets.choice(ALPHANUMERIC) for _ in range(24))


def _system_text(system: str | list[TextBlock] | None) -> str:
    if system is None:
        return ""
    return system if isinstance(system, str) else "\n".join(block.text for block in system)


def _turns(message: Message) -> list[dict[str, Any]]:
    """One Anthropic message as chat-template messages: tool results become `tool` messages."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    tool_turns: list[dict[str, Any]] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            calls.append({"id": block.id, "type": "function", "function": {"name": block.name, "arguments": block.input}})
        elif block.type == "tool_result":
            content = block.content if isinstance(block.content, str) else "\n".join(
                part.text for part in block.content or [])
            tool_turns.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        elif block.type == "thinking":
            reasoning.append(block.thinking)
        elif block.type in ("image", "document"):
            raise InvalidRequestError(f"{block.type} blocks are not supported: this model reads text only",
                                      param="messages")
    turns = list(tool_turns)
    if texts or calls or (reasoning and message.role == "assistant"):
        turn: dict[str, Any] = {"role": message.role, "content": "\n".join(texts)}
        if calls:
            turn["tool_calls"] = calls
        if reasoning:
            turn["reasoning_content"] = "\n".join(reasoning)
        turns.append(turn)
    return turns


def template_messages(system: str | list[TextBlock] | None, messages: list[Message]) -> list[dict[str, Any]]:
    """Chat-template messages; consecutive turns of one role are merged, as the API does."""
    result: list[dict[str, Any]] = []
    if text := _system_text(system):
        result.append({"role": "system", "content": text})
    for message in messages:
        for turn in _turns(message):
            previous = result[-1] if result else None
            if (previous and previous["role"] == turn["role"] and turn["role"] in ("user", "assistant")
                    and not previous.get("tool_calls") and not turn.get("tool_calls")):
                previous["content"] = f"{previous['content']}\n\n{turn['content']}"
            else:
                result.append(turn)
    return result


def _render(service: Service, req: MessagesRequest | CountTokensRequest, thinking: dict[str, Any] | None) -> RenderedChat:
    kwargs = dict(req.chat_template_kwargs or {})
    if thinking and thinking.get("type") in ("enabled", "disabled"):
        kwargs.setdefault("enable_thinking", thinking["type"] == "enabled")
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                               "parameters": t.input_schema}} for t in req.tools or []]
    return service.render_chat(template_messages(req.system, req.messages), tools=tools or None,
                               template_kwargs=kwargs)


@dataclass
class MessageContext:
    id: str
    model: str
    input_tokens: int
    splitter: ReasoningSplitter


def to_generation(req: MessagesRequest, service: Service) -> tuple[GenerationRequest, MessageContext]:
    if req.max_tokens < 1:
        raise field_error("max_tokens", f"Value must be >= 1, but got {req.max_tokens}")
    sampling.check_range("temperature", req.temperature, 0.0, 1.0)
    rendered = _render(service, req, req.thinking)
    fields = SamplingFields(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k)
    generation = GenerationRequest(prompt_tokens=rendered.tokens, sampling=sampling.sampling_from(service, fields),
                                   max_tokens=req.max_tokens, stop=sampling.stop_list(req.stop_sequences))
    ctx = MessageContext(id=message_id(), model=req.model, input_tokens=len(rendered.tokens),
                         splitter=ReasoningSplitter(service.settings.reasoning_format,
                                                    starts_inside=rendered.starts_in_reasoning))
    return generation, ctx


def count_tokens(req: CountTokensRequest, service: Service) -> dict[str, int]:
    return {"input_tokens": len(_render(service, req, None).tokens)}


def _usage(finished: Finished) -> dict[str, int]:
    usage = finished.usage
    # Anthropic counts cache reads apart from input_tokens.
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": usage.cached_tokens}


def to_message(deltas: list[TextDelta], finished: Finished, ctx: MessageContext) -> dict[str, Any]:
    reasoning, text = ctx.splitter.push(finished.text)
    tail_reasoning, tail_text = ctx.splitter.flush()
    content: list[dict[str, Any]] = []
    if reasoning + tail_reasoning:
        content.append({"type": "thinking", "thinking": reasoning + tail_reasoning, "signature": ""})
    if text + tail_text:
        content.append({"type": "text", "text": text + tail_text})
    return {"id": ctx.id, "type": "message", "role": "assistant", "model": ctx.model, "content": content,
            "stop_reason": STOP_REASONS[finished.stop_type], "stop_sequence": finished.stopping_word or None,
            "usage": _usage(finished)}


class EventEncoder:
    """Engine events -> Anthropic's named SSE events; a thinking block (if any) comes before the text."""

    def __init__(self, ctx: MessageContext):
        self.ctx = ctx
        self.started = False
        self.index = -1
        self.open_block: str | None = None  # "thinking" or "text"

    def _start(self) -> list[bytes]:
        self.started = True
        message = {"id": self.ctx.id, "type": "message", "role": "assistant", "model": self.ctx.model, "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self.ctx.input_tokens, "output_tokens": 0}}
        return [sse_event("message_start", {"type": "message_start", "message": message})]

    def _close(self) -> list[bytes]:
        frames: list[bytes] = []
        if self.open_block == "thinking":
            frames.append(self._delta({"type": "signature_delta", "signature": ""}))
        if self.open_block is not None:
            frames.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.open_block = None
        return frames

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _text(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        frames: list[bytes] = []
        if self.open_block != kind:
            frames += self._close()
            self.index += 1
            self.open_block = kind
            block = {"type": "thinking", "thinking": ""} if kind == "thinking" else {"type": "text", "text": ""}
            frames.append(sse_event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                            "content_block": block}))
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" else {"type": "text_delta",
                                                                                         "text": text}
        return frames + [self._delta(delta)]

    def encode(self, event: TextDelta | Finished) -> list[bytes]:
        frames = [] if self.started else self._start()
        if isinstance(event, TextDelta):
            reasoning, text = self.ctx.splitter.push(event.text)
            return frames + self._text("thinking", reasoning) + self._text("text", text)
        reasoning, text = self.ctx.splitter.flush()
        frames += self._text("thinking", reasoning) + self._text("text", text) + self._close()
        usage = _usage(event)
        frames.append(sse_event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS[event.stop_type], "stop_sequence": event.stopping_word or None},
            "usage": {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"],
                      "cache_read_input_tokens": usage["cache_read_input_tokens"]}}))
        frames.append(sse_event("message_stop", {"type": "message_stop"}))
        return frames

    def error(self, err: KineticError) -> list[bytes]:
        return [sse_event("error", error_body(err))]
