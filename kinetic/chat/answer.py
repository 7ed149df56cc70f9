"""A generated chat answer, split into reasoning, content and tool calls — whole or as it streams.

Protocol-neutral: each protocol shapes the pieces into its own wire format (OpenAI deltas,
Anthropic blocks, Ollama lines).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinetic.chat.callformats import reasoning_enders
from kinetic.chat.callformats.detect import JSON
from kinetic.chat.reasoning import ReasoningSplitter
from kinetic.chat.toolcalls import (
    AutoCallStream,
    CallDelta,
    ForcedCallStreamer,
    ParsedCall,
    new_call_id,
    parse_forced_calls,
    parse_tool_calls,
    split_arguments,
)
from kinetic.chat.types import AnswerFormat
from kinetic.engine.types import StructuredCall


@dataclass(frozen=True)
class Answer:
    reasoning: str
    content: str | None  # None when the answer is only calls
    calls: list[ParsedCall] = field(default_factory=list)


def forced_in_json(answer_format: AnswerFormat) -> bool:
    """Whether a forced call is kinetic's JSON shape (streamed as it is written) rather than the
    template's own format (read when the answer ends)."""
    return answer_format.tool_mode == "forced" and answer_format.call_format == JSON


def reasoning_splitter(answer_format: AnswerFormat) -> ReasoningSplitter:
    enders = reasoning_enders(answer_format.call_format) if answer_format.tool_mode != "none" else ()
    return ReasoningSplitter(answer_format.reasoning_format, starts_inside=answer_format.starts_in_reasoning,
                             also_ends=enders)


def given_calls(calls: tuple[StructuredCall, ...]) -> list[ParsedCall]:
    """Calls that came as structure (a remote server's), each with an id."""
    return [ParsedCall(name=call.name, arguments=call.arguments, id=call.id or new_call_id()) for call in calls]


def parse_answer(text: str, answer_format: AnswerFormat, given: tuple[StructuredCall, ...] = ()) -> Answer:
    """`given`: tool calls that came as structure beside the text, which then holds none."""
    splitter = reasoning_splitter(answer_format)
    reasoning, content = splitter.push(text)
    tail_reasoning, tail_content = splitter.flush()
    content += tail_content
    reasoning += tail_reasoning
    if given:
        return Answer(reasoning, content or None, given_calls(given))
    if forced_in_json(answer_format):
        calls = parse_forced_calls(content)
        if calls is not None:  # None: cut short by the token limit, what was generated is text
            return Answer(reasoning, None, calls)
    elif answer_format.tool_mode != "none":
        reply = parse_tool_calls(content, answer_format.tool_names, call_format=answer_format.call_format,
                                 parameters=dict(answer_format.tool_parameters))
        if reply.calls:
            return Answer(reasoning, reply.content or None, reply.calls)
    return Answer(reasoning, content)


@dataclass(frozen=True)
class AnswerPiece:
    reasoning: str = ""
    content: str = ""
    calls: tuple[CallDelta, ...] = ()


class AnswerStream:
    """Feed generated text; get the reasoning, content and call deltas that can be sent now.

    Forced calls in kinetic's JSON shape stream as soon as each piece is known; with `auto`, and for
    calls forced into the template's own format, text that may be a call is held back and parsed at
    the end. `deepseek-legacy` streams keep the thoughts inside the content, so no reasoning pieces
    are given for it."""

    def __init__(self, answer_format: AnswerFormat):
        self.legacy = answer_format.reasoning_format == "deepseek-legacy"
        self.splitter = reasoning_splitter(answer_format)
        self.forced = ForcedCallStreamer() if forced_in_json(answer_format) else None
        self.forced_text = ""  # forced output, returned as text if it never became a call
        self.auto = None if self.forced is not None or answer_format.tool_mode == "none" else AutoCallStream(
            answer_format.tool_names, call_format=answer_format.call_format,
            parameters=dict(answer_format.tool_parameters))
        self.n_calls = 0

    def push(self, text: str) -> AnswerPiece:
        return self._piece(*self.splitter.push(text))

    def _piece(self, reasoning: str, content: str) -> AnswerPiece:
        if self.legacy:
            reasoning = ""
        if self.forced is not None:
            self.forced_text += content
            return AnswerPiece(reasoning=reasoning, calls=self._count(self.forced.feed(content)))
        if self.auto is not None:
            content = self.auto.push(content)
        return AnswerPiece(reasoning=reasoning, content=content)

    def _count(self, deltas: list[CallDelta]) -> tuple[CallDelta, ...]:
        self.n_calls = max([self.n_calls] + [d.index + 1 for d in deltas])
        return tuple(deltas)

    def finish(self, given: tuple[StructuredCall, ...] = ()) -> list[AnswerPiece]:
        """What is left at the end: flushed text, then whatever tool handling held back, then the calls
        `given` as structure (a remote server's)."""
        pieces = [self._piece(*self.splitter.flush())]
        if self.forced is not None and self.n_calls == 0 and self.forced_text:
            pieces.append(AnswerPiece(content=self.forced_text))
        calls: list[ParsedCall] = []
        if self.auto is not None:
            content, calls = self.auto.finish()
            if content:
                pieces.append(AnswerPiece(content=content))
        for index, call in enumerate(calls + given_calls(given), start=self.n_calls):
            chunks = split_arguments(call.arguments)
            deltas = [CallDelta(index=index, arguments=chunks[0], id=call.id or new_call_id(), name=call.name)]
            deltas += [CallDelta(index=index, arguments=chunk) for chunk in chunks[1:]]
            pieces.append(AnswerPiece(calls=self._count(deltas)))
        return [piece for piece in pieces if piece.reasoning or piece.content or piece.calls]
