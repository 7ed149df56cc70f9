"""OpenAI Responses <-> kinetic: `POST /v1/responses` inward to a neutral chat request, engine
events outward to a response object and its typed SSE events (response.created ...
response.completed), as the vendored llama-server serves them (server-chat.cpp, server-task.cpp).

Where llama-server's events leave out what OpenAI sends (`sequence_number`, `output_index`,
`content_index`, the `*.done` events of each item), kinetic sends them: the openai SDK's
`responses.stream()` helper needs them. Forced tool calls are grammar-constrained here, where
llama-server leaves them to the model.

Pure: nothing here touches an engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kinetic.chat.answer import AnswerPiece, parse_answer
from kinetic.chat.reasoning import REASONING_FORMATS
from kinetic.chat.toolcalls import CallDelta, new_call_id
from kinetic.chat.types import (
    AnswerFormat,
    ChatRequest,
    MediaPart,
    Message,
    OutputConstraint,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from kinetic.classroom.outcome import Outcome
from kinetic.engine.types import Event, Finished, PromptProgress, TextDelta
from kinetic.errors import InvalidRequestError, KineticError, field_error, range_error
from kinetic.protocols.common import media
from kinetic.protocols.common import translate as common
from kinetic.protocols.common.answer_encoder import AnswerEncoder
from kinetic.protocols.common.streaming import sse_event
from kinetic.protocols.responses.items import conversation_id, input_items
from kinetic.protocols.responses.types import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputAudio,
    InputFile,
    InputImage,
    InputItemModel,
    InputText,
    MessageItem,
    OutputText,
    ReasoningItem,
    Refusal,
    ResponsesRequest,
    TextFormat,
)


def response_id() -> str:
    return common.random_id("resp_", 32)


# --------------------------------------------------------------------------------- inward


def _parts(content: str | list[ContentPart], param: str) -> tuple[TextPart | MediaPart, ...]:
    """Content as neutral parts. Text of every kind is text (a refusal the client sends back is
    what the assistant said); images and audio become media parts, which the chat layer refuses for a
    model whose projector cannot read them."""
    if isinstance(content, str):
        return (TextPart(content),)
    parts: list[TextPart | MediaPart] = []
    for index, part in enumerate(content):
        if isinstance(part, (InputText, OutputText)):
            parts.append(TextPart(part.text))
        elif isinstance(part, Refusal):
            parts.append(TextPart(part.refusal))
        elif isinstance(part, InputFile):
            raise InvalidRequestError("'input_file' is not supported: kinetic reads no documents (send the text, "
                                      "or images as 'input_image')", param=f"{param}[{index}].type")
        else:
            parts.append(_media(part, f"{param}[{index}]"))
    return tuple(parts)


def _media(part: InputImage | InputAudio, param: str) -> MediaPart:
    if isinstance(part, InputAudio):
        audio = part.input_audio
        return media.media_part(audio.data if audio else None, kind=part.type, modality="audio",
                                param=f"{param}.input_audio.data")
    if part.image_url is None and part.file_id is not None:
        raise InvalidRequestError("'file_id' is not supported: kinetic keeps no file store; send the image as "
                                  "'image_url' (a data: URL or an http(s):// URL)", param=f"{param}.file_id")
    return media.media_part(part.image_url, kind=part.type, modality="image", param=f"{param}.image_url")


def _arguments(text: str) -> Any:
    """Call arguments as an object, as templates read them (text that does not parse stays text)."""
    try:
        return json.loads(text) if text else {}
    except json.JSONDecodeError:
        return text


def to_messages(req: ResponsesRequest, history: list[InputItemModel] | None = None) -> tuple[Message, ...]:
    """`instructions` as a system turn, then the stored turns `previous_response_id` names (without their
    instructions, as OpenAI reads them), then `input`. Assistant items that follow an assistant turn (its
    text, calls, reasoning) join that turn, as in llama-server."""
    messages: list[Message] = []
    if req.instructions is not None:
        messages.append(Message(role="system", parts=(TextPart(req.instructions),)))
    items = [("previous_response_id", item) for item in history or ()]
    items += [(f"input[{index}]", item) for index, item in enumerate(input_items(req))]
    if isinstance(req.input, str):
        items[-1] = ("input", items[-1][1])
    for param, item in items:
        previous = messages[-1] if messages and messages[-1].role == "assistant" else None
        if isinstance(item, MessageItem):
            parts = _parts(item.content, f"{param}.content")
            if item.role != "assistant":
                messages.append(Message(role="system" if item.role == "developer" else item.role, parts=parts))
            elif previous is not None:
                messages[-1] = replace(previous, parts=(previous.parts or ()) + parts)
            else:
                messages.append(Message(role="assistant", parts=parts))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(name=item.name, arguments=_arguments(item.arguments), id=item.call_id)
            if previous is not None:
                messages[-1] = replace(previous, tool_calls=previous.tool_calls + (call,))
            else:
                messages.append(Message(role="assistant", tool_calls=(call,)))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(Message(role="tool", parts=_parts(item.output, f"{param}.output"),
                                    tool_call_id=item.call_id))
        elif isinstance(item, ReasoningItem):
            text = "\n".join(part.text for part in item.content or ())
            if previous is not None:
                messages[-1] = replace(previous, reasoning_content=text)
            else:
                messages.append(Message(role="assistant", parts=(TextPart(""),), reasoning_content=text))
    return tuple(messages)


def to_tools(req: ResponsesRequest) -> tuple[ToolSpec, ...]:
    """Function tools; other types have no local equivalent and are skipped, as llama-server does."""
    tools = []
    for index, tool in enumerate(req.tools or ()):
        if tool.type != "function":
            continue
        if not tool.name:
            raise field_error(f"tools[{index}].name", "a function tool must have a name")
        tools.append(ToolSpec(name=tool.name, description=tool.description, parameters=tool.parameters,
                              extra={"strict": tool.strict} if tool.strict is not None else {}))
    return tuple(tools)


def tool_choice(req: ResponsesRequest) -> ToolChoice:
    """`auto`, `none`, `required`, or `{"type": "function", "name": ...}` (that function)."""
    choice = req.tool_choice
    if choice is None:
        return ToolChoice("auto")
    if isinstance(choice, str):
        return ToolChoice(choice)
    if choice.type != "function":
        raise field_error("tool_choice.type", f"must be \"function\" (or tool_choice one of auto, none, required), "
                                              f"but got {choice.type!r}")
    if not choice.name:
        raise field_error("tool_choice.name", "a function tool choice must name the function")
    return ToolChoice("required", choice.name)


def output_constraint(req: ResponsesRequest) -> OutputConstraint:
    """`text.format` as a constraint: a JSON schema, or (json_object) any JSON value as llama.cpp
    allows. llama-server ignores `text.format`; kinetic constrains the answer with it. The chat
    route's own `grammar` and `json_schema` fields pass through, as llama-server lets them."""
    fmt: TextFormat | None = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        if req.json_schema is not None:
            return OutputConstraint(grammar=req.grammar, schema=req.json_schema, param="json_schema")
        return OutputConstraint(grammar=req.grammar, param="grammar" if req.grammar is not None else "")
    if fmt.type == "json_object":
        return OutputConstraint(grammar=req.grammar, any_json=True, param="text.format")
    if fmt.type == "json_schema":
        schema = common.ANY_OBJECT if fmt.schema_ is None else fmt.schema_
        if not isinstance(schema, dict):
            raise field_error("text.format.schema",
                              f"invalid JSON schema: must be an object, but got {type(schema).__name__}")
        return OutputConstraint(grammar=req.grammar, schema=schema, param="text.format.schema")
    raise field_error("text.format.type", f"must be one of {', '.join(common.FORMAT_TYPES)}, but got {fmt.type!r}")


def validate(req: ResponsesRequest) -> None:
    conversation_id(req)  # its shape, and not beside previous_response_id
    if req.n is not None and req.n != 1:
        raise range_error("n", 1, 1, req.n)
    if req.reasoning_format is not None and req.reasoning_format not in REASONING_FORMATS:
        raise field_error("reasoning_format",
                          f"must be one of {', '.join(REASONING_FORMATS)}, but got {req.reasoning_format!r}")


def to_chat_request(req: ResponsesRequest, history: list[InputItemModel] | None = None) -> ChatRequest:
    validate(req)
    max_tokens = common.max_tokens_from([("max_output_tokens", req.max_output_tokens),
                                         ("n_predict", req.n_predict), ("max_tokens", req.max_tokens)])
    return ChatRequest(
        messages=to_messages(req, history),
        options=replace(common.generation_options(req, max_tokens=max_tokens),
                        return_progress=bool(req.stream and req.return_progress)),
        tools=to_tools(req),
        tool_choice=tool_choice(req),
        parallel_tool_calls=req.parallel_tool_calls is True,
        template_kwargs=dict(req.chat_template_kwargs or {}),
        reasoning_format=req.reasoning_format,
        output=output_constraint(req),
    )


def input_tokens_body(n_tokens: int) -> dict[str, Any]:
    return {"object": "response.input_tokens", "input_tokens": n_tokens}


# -------------------------------------------------------------------------------- outward


@dataclass
class ResponseContext:
    """What the outward translation needs to know about the request it answers."""

    id: str
    created_at: int
    model: str
    answer_format: AnswerFormat
    echo: dict[str, Any]  # request settings a response object repeats
    timings_per_token: bool = False  # llama-server's: each streamed event of a token carries the timings so far
    outcome: Outcome = field(default_factory=Outcome)
    on_completed: Callable[[dict[str, Any]], None] | None = None  # the store's, given the completed response

    def completed(self, response: dict[str, Any]) -> None:
        if self.on_completed is not None:
            self.on_completed(response)

    def __post_init__(self) -> None:
        self.outcome.id, self.outcome.model = self.id, self.model


def response_context(req: ResponsesRequest, answer_format: AnswerFormat, *, model: str) -> ResponseContext:
    fmt = req.text.format.model_dump(by_alias=True, exclude_none=True) if req.text and req.text.format else None
    echo = {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls is True,
        "temperature": req.temperature,
        "text": {"format": fmt or {"type": "text"}},
        "tool_choice": (req.tool_choice if isinstance(req.tool_choice, str) or req.tool_choice is None
                        else req.tool_choice.model_dump(exclude_none=True)) or "auto",
        "tools": [tool.model_dump(exclude_none=True) for tool in req.tools or ()],
        "top_p": req.top_p,
        "previous_response_id": req.previous_response_id,
        "conversation": {"id": found} if (found := conversation_id(req)) else None,
        "store": req.store is not False,
        "background": bool(req.background),
    }
    return ResponseContext(id=response_id(), created_at=int(time.time()), model=model, answer_format=answer_format,
                           echo=echo, timings_per_token=bool(req.stream and req.timings_per_token))


def usage_dict(finished: Finished) -> dict[str, Any]:
    usage = finished.usage
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        # thoughts are not counted apart from the answer
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def finish_reason(finished: Finished) -> str:
    """The response's end as its client reads it: `incomplete_details.reason`, else its status."""
    return "max_output_tokens" if finished.finish_reason == "length" else "completed"


def _response(ctx: ResponseContext, *, status: str, output: list[dict[str, Any]],
              finished: Finished | None = None) -> dict[str, Any]:
    """A response object. Cut short by the token limit, it stays `completed` (as llama-server says,
    and the SDK's stream helper waits for `response.completed`), and `incomplete_details` says why."""
    body: dict[str, Any] = {"id": ctx.id, "object": "response", "created_at": ctx.created_at, "status": status,
                            "model": ctx.model, "output": output, "error": None, "incomplete_details": None,
                            **ctx.echo}
    if finished is not None:
        body["completed_at"] = int(time.time())
        body["usage"] = usage_dict(finished)
        if finished.finish_reason == "length":
            body["incomplete_details"] = {"reason": "max_output_tokens"}
    return body


def pending_response(ctx: ResponseContext, status: str, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """A background response without its output yet (`queued`), or one that ended without it (`cancelled`,
    `failed` with its error)."""
    return {**_response(ctx, status=status, output=[]), "error": error}


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [output_text_part(text)] if status == "completed" else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "encrypted_content": "",
            "status": status}


def function_call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """llama-server's ids: `fc_` + the call's id for the item, `call_` + the same for `call_id`."""
    return {"id": "fc_" + call_id, "type": "function_call", "status": status, "arguments": arguments,
            "call_id": "call_" + call_id, "name": name}


def to_response(deltas: list[TextDelta], finished: Finished, ctx: ResponseContext) -> dict[str, Any]:
    """The non-streamed response: reasoning, message and function_call items, each only if there is
    one, then usage and (kinetic's extra, as on the chat route) llama-server's timings."""
    answer = parse_answer(finished.text, ctx.answer_format, finished.calls)
    output: list[dict[str, Any]] = []
    if answer.reasoning:
        output.append(reasoning_item(common.random_id("rs_", 32), answer.reasoning, "completed"))
    if answer.content:
        output.append(message_item(common.random_id("msg_", 32), answer.content, "completed"))
    for call in answer.calls:
        item = function_call_item(call.id or new_call_id(), call.name, call.arguments, "completed")
        ctx.outcome.call(item["call_id"], call.name)
        output.append(item)
    ctx.outcome.finished(finished, finish_reason(finished), answer=answer.content)
    response = _response(ctx, status="completed", output=output, finished=finished)
    ctx.completed(response)
    return {**response, "timings": finished.timings.to_dict()}


@dataclass
class _Item:
    """An output item being streamed: its wire shape, where it is, and the text gathered so far."""

    kind: str  # "reasoning", "message" or "function_call"
    index: int
    id: str
    text: str = ""
    name: str = ""
    call_index: int = -1
    call_id: str = ""


Frame = tuple[str, dict[str, Any]]  # an SSE event's name and data, written out once the event is complete


@dataclass
class EventEncoder(AnswerEncoder[ResponseContext]):
    """Engine events -> Responses' typed SSE events: response.created and response.in_progress,
    then per output item (reasoning, the message, each function call) output_item.added, its
    deltas and its done events, and response.completed with usage and (top level) timings."""

    started: bool = False
    sequence: int = 0
    items: list[_Item] = field(default_factory=list)
    done: list[dict[str, Any]] = field(default_factory=list)

    def _event(self, kind: str, **data: Any) -> Frame:
        frame = (kind, {"type": kind, "sequence_number": self.sequence, **data})
        self.sequence += 1
        return frame

    @property
    def _open(self) -> _Item | None:
        return self.items[-1] if self.items and len(self.done) < len(self.items) else None

    def _start(self) -> list[Frame]:
        self.started = True
        response = _response(self.ctx, status="in_progress", output=[])
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def _close(self) -> list[Frame]:
        item = self._open
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "message":
            wire = message_item(item.id, item.text, "completed")
            frames = [self._event("response.output_text.done", **where, content_index=0, text=item.text, logprobs=[]),
                      self._event("response.content_part.done", **where, content_index=0,
                                  part=output_text_part(item.text))]
        elif item.kind == "reasoning":
            wire = reasoning_item(item.id, item.text, "completed")
            frames = [self._event("response.reasoning_text.done", **where, content_index=0, text=item.text)]
        else:
            wire = function_call_item(item.call_id, item.name, item.text, "completed")
            frames = [self._event("response.function_call_arguments.done", **where, name=item.name,
                                  arguments=item.text)]
        self.done.append(wire)
        return frames + [self._event("response.output_item.done", output_index=item.index, item=wire)]

    def _add(self, item: _Item, wire: dict[str, Any]) -> list[Frame]:
        frames = self._close()
        self.items.append(item)
        return frames + [self._event("response.output_item.added", output_index=item.index, item=wire)]

    def _text(self, kind: str, text: str) -> list[Frame]:
        if not text:
            return []
        frames: list[Frame] = []
        item = self._open
        if item is None or item.kind != kind:
            prefix = "msg_" if kind == "message" else "rs_"
            item = _Item(kind, len(self.items), common.random_id(prefix, 32))
            if kind == "message":
                frames += self._add(item, message_item(item.id, "", "in_progress"))
                frames.append(self._event("response.content_part.added", item_id=item.id, output_index=item.index,
                                          content_index=0, part=output_text_part("")))
            else:
                frames += self._add(item, reasoning_item(item.id, "", "in_progress"))
        item.text += text
        if kind == "message":
            self.outcome.chunk(text)
        delta_kind = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        return frames + [self._event(delta_kind, item_id=item.id, output_index=item.index, content_index=0,
                                     delta=text, **extra)]

    def _call(self, delta: CallDelta) -> list[Frame]:
        frames: list[Frame] = []
        item = self._open
        if item is None or item.call_index != delta.index:
            call_id = delta.id or new_call_id()
            item = _Item("function_call", len(self.items), "fc_" + call_id, name=delta.name or "",
                         call_index=delta.index, call_id=call_id)
            wire = function_call_item(call_id, item.name, "", "in_progress")
            self.outcome.call(wire["call_id"], item.name)
            frames += self._add(item, wire)
        if delta.arguments:
            item.text += delta.arguments
            frames.append(self._event("response.function_call_arguments.delta", item_id=item.id,
                                      output_index=item.index, delta=delta.arguments))
        return frames

    def _frames(self, piece: AnswerPiece) -> list[Frame]:
        frames = self._text("reasoning", piece.reasoning) + self._text("message", piece.content)
        for delta in piece.calls:
            frames += self._call(delta)
        return frames

    def encode(self, event: Event) -> list[bytes]:
        return [sse_event(kind, data) for kind, data in self._encode(event)]

    def _encode(self, event: Event) -> list[Frame]:
        if isinstance(event, PromptProgress):
            # llama-server: the first event opens the response; a later one is another response.in_progress.
            # Either way the last frame carries the progress (and with timings_per_token, the prompt's timings).
            frames = self._start() if not self.started else [self._event(
                "response.in_progress", response=_response(self.ctx, status="in_progress", output=[]))]
            frames[-1][1]["prompt_progress"] = event.to_dict()
            if self.ctx.timings_per_token:
                frames[-1][1]["timings"] = event.timings().to_dict()
            return frames
        frames = [] if self.started else self._start()
        if isinstance(event, TextDelta):
            frames += self._frames(self.answer.push(event.text))
            if frames and self.ctx.timings_per_token and event.timings is not None:
                frames[-1][1]["timings"] = event.timings.to_dict()  # on the token's last event, as llama-server
            return frames
        for piece in self.answer.finish(event.calls):
            frames += self._frames(piece)
        frames += self._close()
        self.outcome.finished(event, finish_reason(event))
        response = _response(self.ctx, status="completed", output=self.done, finished=event)
        self.ctx.completed(response)
        # llama-server puts timings beside `response`, not inside it
        frames.append(self._event("response.completed", response=response, timings=event.timings.to_dict()))
        return frames

    def error(self, err: KineticError) -> list[bytes]:
        """Responses' own `error` event, which ends the stream."""
        return [sse_event(*self._event("error", code=err.kind, message=err.message, param=err.param))]
