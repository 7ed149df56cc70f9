"""Engine events outward to Ollama: the whole answer as one object, or NDJSON lines as it streams,
with Ollama's metrics, tool calls and logprobs; its error body.

Pure: nothing here touches an engine; the routes pass in the prepared chat and the events.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from kinetic.chat import types as neutral
from kinetic.chat.answer import AnswerPiece, parse_answer
from kinetic.chat.toolcalls import ParsedCall
from kinetic.classroom.outcome import Outcome
from kinetic.engine.types import Event, Finished, PromptProgress, TextDelta, TokenLogprob
from kinetic.errors import KineticError
from kinetic.protocols.common.answer_encoder import AnswerEncoder
from kinetic.protocols.common.streaming import ndjson_line
from kinetic.protocols.ollama.model_facts import timestamp
from kinetic.protocols.ollama.types import ChatRequest, GenerateRequest


def error_body(err: KineticError) -> dict[str, str]:
    return {"error": err.message}


@dataclass
class ReplyContext:
    """What the outward translation needs to know about the request it answers."""

    model: str  # as the client wrote it: Ollama echoes the requested name
    answer_format: neutral.AnswerFormat
    started_ns: int  # time.monotonic_ns() when the request arrived
    kind: Literal["chat", "generate"] = "chat"  # `message` objects, or `response` text
    n_probs: int = 0
    context: list[int] | None = None  # /api/generate's prompt tokens, returned with the output's
    outcome: Outcome = field(default_factory=Outcome)

    def __post_init__(self) -> None:
        self.outcome.model = self.model


def reply_context(body: ChatRequest | GenerateRequest, answer_format: neutral.AnswerFormat, *, started_ns: int,
                  prompt_tokens: list[int] | None = None) -> ReplyContext:
    n_probs = max(body.top_logprobs or 0, 1) if body.logprobs else 0
    if isinstance(body, ChatRequest):
        return ReplyContext(model=body.model, answer_format=answer_format, started_ns=started_ns, n_probs=n_probs)
    return ReplyContext(model=body.model, answer_format=answer_format, started_ns=started_ns, kind="generate",
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
    answer = parse_answer(finished.text, ctx.answer_format, finished.calls)
    calls = [tool_call(call, index) for index, call in enumerate(answer.calls)]
    _note_calls(ctx.outcome, calls)
    ctx.outcome.finished(finished, finished.finish_reason, answer=answer.content or "")
    body = _body(ctx, content=answer.content or "", thinking=answer.reasoning, calls=calls, done=True)
    if ctx.n_probs:
        body["logprobs"] = [logprob_entry(d.logprob, ctx.n_probs) for d in deltas if d.logprob]
    return _final(body, finished, ctx)


def _note_calls(outcome: Outcome, calls: list[dict[str, Any]]) -> None:
    for call in calls:
        outcome.call(str(call.get("id") or ""), call["function"]["name"])


@dataclass
class _PendingCall:
    id: str | None
    name: str
    arguments: str = ""


@dataclass
class LineEncoder(AnswerEncoder[ReplyContext]):
    """Engine events -> NDJSON lines: one per piece of thinking or content, the tool calls whole in
    one line once the answer is complete (Ollama sends parsed calls, not argument fragments), then
    the final `done: true` line with the metrics."""

    calls: dict[int, _PendingCall] = field(default_factory=dict)

    def _lines(self, piece: AnswerPiece, logprob: TokenLogprob | None = None) -> list[bytes]:
        for delta in piece.calls:
            if delta.index not in self.calls:
                self.calls[delta.index] = _PendingCall(id=delta.id, name=delta.name or "")
            self.calls[delta.index].arguments += delta.arguments
        if not (piece.content or piece.reasoning or logprob):
            return []
        body = _body(self.ctx, content=piece.content, thinking=piece.reasoning, done=False)
        self.outcome.chunk(piece.content)
        if logprob is not None:
            body["logprobs"] = [logprob_entry(logprob, self.ctx.n_probs)]
        return [ndjson_line(body)]

    def encode(self, event: Event) -> list[bytes]:
        if isinstance(event, PromptProgress):
            return []  # Ollama has no progress lines (and its requests never ask for them)
        if isinstance(event, TextDelta):
            logprob = event.logprob if self.ctx.n_probs else None
            return self._lines(self.answer.push(event.text), logprob)
        lines = [line for piece in self.answer.finish(event.calls) for line in self._lines(piece)]
        if self.calls:
            calls = [tool_call(ParsedCall(name=c.name, arguments=c.arguments, id=c.id), index)
                     for index, c in sorted(self.calls.items())]
            _note_calls(self.outcome, calls)
            lines.append(ndjson_line(_body(self.ctx, content="", calls=calls, done=False)))
        self.outcome.finished(event, event.finish_reason)
        return lines + [ndjson_line(_final(_body(self.ctx, content="", done=True), event, self.ctx))]

    def error(self, err: KineticError) -> list[bytes]:
        """A failure after the stream started: a last `{"error": ...}` line (ollama-python raises it)."""
        return [ndjson_line(error_body(err))]
