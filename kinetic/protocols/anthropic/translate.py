"""Anthropic Messages <-> kinetic: requests inward to neutral chat requests, engine events outward
to Anthropic's message JSON and its named SSE events (message_start ... message_stop).

Pure: nothing here touches an engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kinetic.chat.answer import AnswerPiece, parse_answer
from kinetic.chat.types import (
    AnswerFormat,
    ChatRequest,
    GenerationOptions,
    MediaPart,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from kinetic.chat.types import Message as ChatMessage
from kinetic.classroom.outcome import Outcome
from kinetic.engine.types import Event, Finished, PromptProgress, TextDelta
from kinetic.errors import (
    ForbiddenError,
    InvalidRequestError,
    KineticError,
    NotFoundError,
    NotSupportedError,
    PayloadTooLargeError,
    RateLimitError,
    RequestTimeoutError,
    UnauthorizedError,
    UnavailableError,
    field_error,
)
from kinetic.protocols.anthropic.types import (
    Base64Source,
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    Message,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    UrlSource,
)
from kinetic.protocols.common import media
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.answer_encoder import AnswerEncoder
from kinetic.protocols.common.streaming import sse_event

STOP_REASONS = {"eos": "end_turn", "word": "stop_sequence", "limit": "max_tokens", "none": "end_turn"}
# Anthropic's error type for each kind of kinetic error (the first class the error is an instance of).
ERROR_TYPES: tuple[tuple[type[KineticError], str], ...] = (
    (InvalidRequestError, "invalid_request_error"),
    (UnauthorizedError, "authentication_error"),
    (ForbiddenError, "permission_error"),
    (NotFoundError, "not_found_error"),
    (RequestTimeoutError, "timeout_error"),
    (PayloadTooLargeError, "request_too_large"),
    (RateLimitError, "rate_limit_error"),
    (NotSupportedError, "invalid_request_error"),
    (UnavailableError, "overloaded_error"),
)


def error_type(err: KineticError) -> str:
    for kind, name in ERROR_TYPES:
        if isinstance(err, kind):
            return name
    return "api_error"


def error_body(err: KineticError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(err), "message": err.message}}


def message_id() -> str:
    return common.random_id("msg_", 24)


# --------------------------------------------------------------------------------- inward


def _system_text(system: str | list[TextBlock] | None) -> str:
    if system is None:
        return ""
    return system if isinstance(system, str) else "\n".join(block.text for block in system)


def _media(block: ImageBlock | DocumentBlock, param: str) -> TextPart | MediaPart:
    """An image block's file (base64 decoded here, a URL kept for the backend to load). A plain-text document
    is its text; any other document stays a part no model reads, so the chat layer refuses it by name."""
    if isinstance(block, DocumentBlock):
        if block.source.get("type") == "text" and isinstance(block.source.get("data"), str):
            return TextPart(block.source["data"])
        return MediaPart(kind="document", modality="document", param=f"{param}.source")
    source = block.source
    if isinstance(source, Base64Source):
        return media.inline_part(source.data, kind="image", modality="image", param=f"{param}.source.data")
    if isinstance(source, UrlSource):
        return media.media_part(source.url, kind="image", modality="image", param=f"{param}.source.url")
    raise InvalidRequestError("an image source of type 'file' is not supported: kinetic keeps no file store; send "
                              "the image as base64 or a URL", param=f"{param}.source.file_id")


def _tool_turn(block: ToolResultBlock, param: str) -> ChatMessage:
    """A tool result as a `tool` turn: its text parts joined, then its images, which are kept (never dropped,
    as in llama-server) so that a model that cannot read them says so."""
    if isinstance(block.content, str):
        return ChatMessage(role="tool", parts=(TextPart(block.content),), tool_call_id=block.tool_use_id)
    content = block.content or []
    text = "\n".join(part.text for part in content if isinstance(part, TextBlock))
    files = tuple(_media(part, f"{param}.content[{index}]") for index, part in enumerate(content)
                  if not isinstance(part, TextBlock))
    return ChatMessage(role="tool", parts=(TextPart(text), *files), tool_call_id=block.tool_use_id)


def _turns(message: Message, param: str) -> list[ChatMessage]:
    """One Anthropic message (`param`: its place) as neutral turns: tool results become `tool` turns before
    the rest."""
    if isinstance(message.content, str):
        return [ChatMessage(role=message.role, parts=(TextPart(message.content),))]
    parts: list[TextPart | MediaPart] = []
    calls: list[ToolCall] = []
    reasoning: list[str] = []
    tool_turns: list[ChatMessage] = []
    for index, block in enumerate(message.content):
        if block.type == "text":
            parts.append(TextPart(block.text))
        elif block.type == "tool_use":
            calls.append(ToolCall(name=block.name, arguments=block.input, id=block.id))
        elif block.type == "tool_result":
            tool_turns.append(_tool_turn(block, f"{param}.content[{index}]"))
        elif block.type == "thinking":
            reasoning.append(block.thinking)
        elif isinstance(block, (ImageBlock, DocumentBlock)):
            parts.append(_media(block, f"{param}.content[{index}]"))
    turns = list(tool_turns)
    if parts or calls or (reasoning and message.role == "assistant"):
        turns.append(ChatMessage(role=message.role, parts=tuple(parts) or (TextPart(""),), tool_calls=tuple(calls),
                                 reasoning_content="\n".join(reasoning) if reasoning else None))
    return turns


def to_messages(system: str | list[TextBlock] | None, messages: list[Message]) -> tuple[ChatMessage, ...]:
    """Neutral messages; consecutive user or assistant turns are merged, as the API does."""
    result: list[ChatMessage] = []
    if text := _system_text(system):
        result.append(ChatMessage(role="system", parts=(TextPart(text),)))
    for position, message in enumerate(messages):
        for turn in _turns(message, f"messages[{position}]"):
            previous = result[-1] if result else None
            if (previous and previous.role == turn.role and turn.role in ("user", "assistant")
                    and not previous.tool_calls and not turn.tool_calls):
                media = tuple(p for p in (previous.parts or ()) + (turn.parts or ()) if isinstance(p, MediaPart))
                result[-1] = ChatMessage(role=turn.role, parts=(TextPart(f"{previous.text}\n\n{turn.text}"),) + media,
                                         reasoning_content=previous.reasoning_content or turn.reasoning_content)
            else:
                result.append(turn)
    return tuple(result)


def tool_choice(raw: dict[str, Any] | None) -> ToolChoice:
    """auto, any (some tool must be called), tool (that one), none."""
    kind = (raw or {}).get("type", "auto")
    if kind in ("auto", "none"):
        return ToolChoice(kind)
    if kind == "any":
        return ToolChoice("required")
    if kind == "tool":
        name = (raw or {}).get("name")
        if not isinstance(name, str) or not name:
            raise field_error("tool_choice.name", 'a tool choice of type "tool" must name the tool')
        return ToolChoice("required", name)
    raise field_error("tool_choice.type", f"must be one of auto, any, tool, none, but got {kind!r}")


def thinking_kwargs(thinking: dict[str, Any] | None, max_tokens: int | None) -> dict[str, Any]:
    """`thinking` as the template's reasoning switch. Any positive `budget_tokens` is taken, as
    llama-server takes it (Anthropic's API wants >= 1024 and below max_tokens; llama-server's own tests
    send 50 with max_tokens 100); `thinking_budget` makes it the request's reasoning budget."""
    if not thinking:
        return {}
    kind = thinking.get("type")
    if kind not in ("enabled", "disabled", "adaptive"):
        raise field_error("thinking.type", f"must be one of enabled, disabled, adaptive, but got {kind!r}")
    if kind == "enabled":
        budget = thinking.get("budget_tokens", 10000)  # llama-server's default when it is left out
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise field_error("thinking.budget_tokens", f"must be a positive integer, but got {budget!r}")
    return {"enable_thinking": kind != "disabled"}


def thinking_budget(thinking: dict[str, Any] | None) -> int | None:
    """Enabled thinking's `budget_tokens` (default 10000) as the reasoning budget, as llama-server maps it to
    `thinking_budget_tokens`; None when thinking is not enabled (the server's --reasoning-budget)."""
    if not thinking or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens", 10000)
    return budget if isinstance(budget, int) else None


def _chat_request(req: MessagesRequest | CountTokensRequest, options: GenerationOptions,
                  thinking: dict[str, Any] | None) -> ChatRequest:
    max_tokens = req.max_tokens if isinstance(req, MessagesRequest) else None
    kwargs = {**thinking_kwargs(thinking, max_tokens), **(req.chat_template_kwargs or {})}
    tools = tuple(ToolSpec(name=t.name, description=t.description or "", parameters=t.input_schema)
                  for t in req.tools or [])
    # One forced call at a time: a small model given an array tends to go on listing calls.
    return ChatRequest(messages=to_messages(req.system, req.messages), options=options, tools=tools,
                       tool_choice=tool_choice(req.tool_choice), template_kwargs=kwargs, allow_empty=True,
                       reasoning_budget=thinking_budget(thinking))


def to_chat_request(req: MessagesRequest) -> ChatRequest:
    if req.max_tokens < 1:
        raise field_error("max_tokens", f"Value must be >= 1, but got {req.max_tokens}")
    options = GenerationOptions(sampling=common.sampling_options(req, temperature_max=1.0),
                                max_tokens=req.max_tokens, stop=common.stop_list(req.stop_sequences))
    return _chat_request(req, options, req.thinking)


def count_tokens_request(req: CountTokensRequest) -> ChatRequest:
    return _chat_request(req, GenerationOptions(), req.thinking)


# -------------------------------------------------------------------------------- outward


@dataclass
class MessageContext:
    id: str
    model: str
    answer_format: AnswerFormat
    n_prompt_tokens: int = 0  # message_start's input_tokens, before the answer's usage is known
    outcome: Outcome = field(default_factory=Outcome)

    def __post_init__(self) -> None:
        self.outcome.id, self.outcome.model = self.id, self.model


def message_context(req: MessagesRequest, answer_format: AnswerFormat, n_prompt_tokens: int = 0) -> MessageContext:
    return MessageContext(id=message_id(), model=req.model, answer_format=answer_format,
                          n_prompt_tokens=n_prompt_tokens)


def _usage(finished: Finished) -> dict[str, int]:
    usage = finished.usage
    # Anthropic counts cache reads apart from input_tokens.
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": usage.cached_tokens}


def stop_reason(finished: Finished, has_calls: bool) -> str:
    return "tool_use" if has_calls and finished.finish_reason == "stop" else STOP_REASONS[finished.stop_type]


def tool_use_id(call_id: str | None) -> str:
    return "toolu_" + (call_id or common.random_id("", 24))


def _input(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return {}


def to_message(deltas: list[TextDelta], finished: Finished, ctx: MessageContext) -> dict[str, Any]:
    answer = parse_answer(finished.text, ctx.answer_format, finished.calls)
    content: list[dict[str, Any]] = []
    if answer.reasoning:
        content.append({"type": "thinking", "thinking": answer.reasoning, "signature": ""})
    if answer.content:
        content.append({"type": "text", "text": answer.content})
    for call in answer.calls:
        block_id = tool_use_id(call.id)
        ctx.outcome.call(block_id, call.name)
        content.append({"type": "tool_use", "id": block_id, "name": call.name, "input": _input(call.arguments)})
    reason = stop_reason(finished, bool(answer.calls))
    ctx.outcome.finished(finished, reason, answer=answer.content)
    return {"id": ctx.id, "type": "message", "role": "assistant", "model": ctx.model, "content": content,
            "stop_reason": reason,
            "stop_sequence": finished.stopping_word or None, "usage": _usage(finished)}


@dataclass
class _Block:
    kind: str  # "thinking", "text" or "tool_use"
    call_index: int = -1


@dataclass
class EventEncoder(AnswerEncoder[MessageContext]):
    """Engine events -> Anthropic's named SSE events: a thinking block (if any), text, then one
    tool_use block per call with its input streamed as input_json_delta; a ping after the start,
    as Anthropic sends one."""

    started: bool = False
    index: int = -1
    open_block: _Block | None = None

    def _start(self) -> list[bytes]:
        self.started = True
        message: dict[str, Any] = {"id": self.ctx.id, "type": "message", "role": "assistant",
                                   "model": self.ctx.model, "content": [], "stop_reason": None, "stop_sequence": None,
                                   "usage": {"input_tokens": self.ctx.n_prompt_tokens, "output_tokens": 0}}
        return [sse_event("message_start", {"type": "message_start", "message": message}),
                sse_event("ping", {"type": "ping"})]

    def _close(self) -> list[bytes]:
        frames: list[bytes] = []
        if self.open_block is not None and self.open_block.kind == "thinking":
            frames.append(self._delta({"type": "signature_delta", "signature": ""}))
        if self.open_block is not None:
            frames.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.open_block = None
        return frames

    def _open(self, block: _Block, content_block: dict[str, Any]) -> list[bytes]:
        frames = self._close()
        self.index += 1
        self.open_block = block
        frames.append(sse_event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                        "content_block": content_block}))
        return frames

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _text(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        frames: list[bytes] = []
        if self.open_block is None or self.open_block.kind != kind:
            block = {"type": "thinking", "thinking": ""} if kind == "thinking" else {"type": "text", "text": ""}
            frames += self._open(_Block(kind), block)
        delta = ({"type": "thinking_delta", "thinking": text} if kind == "thinking"
                 else {"type": "text_delta", "text": text})
        if kind == "text":
            self.outcome.chunk(text)
        return frames + [self._delta(delta)]

    def _frames(self, piece: AnswerPiece) -> list[bytes]:
        frames = self._text("thinking", piece.reasoning) + self._text("text", piece.content)
        for call in piece.calls:
            if self.open_block is None or self.open_block.call_index != call.index:
                block_id = tool_use_id(call.id)
                self.outcome.call(block_id, call.name or "")
                frames += self._open(_Block("tool_use", call.index), {
                    "type": "tool_use", "id": block_id, "name": call.name, "input": {}})
            if call.arguments:
                frames.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
        return frames

    def encode(self, event: Event) -> list[bytes]:
        if isinstance(event, PromptProgress):  # asked for by llama.cpp's /completion only: nothing to send here
            return []
        frames = [] if self.started else self._start()
        if isinstance(event, TextDelta):
            return frames + self._frames(self.answer.push(event.text))
        for piece in self.answer.finish(event.calls):
            frames += self._frames(piece)
        frames += self._close()
        usage = _usage(event)
        reason = stop_reason(event, self.answer.n_calls > 0)
        self.outcome.finished(event, reason)
        frames.append(sse_event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": reason,
                      "stop_sequence": event.stopping_word or None},
            "usage": {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"],
                      "cache_read_input_tokens": usage["cache_read_input_tokens"]}}))
        frames.append(sse_event("message_stop", {"type": "message_stop"}))
        return frames

    def error(self, err: KineticError) -> list[bytes]:
        """Anthropic ends a failed stream with an `error` event, which the SDK raises."""
        return [sse_event("error", error_body(err))]
