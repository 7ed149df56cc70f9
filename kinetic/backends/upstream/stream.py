"""An upstream's OpenAI SSE answer as kinetic's engine events.

The stream is read by httpx-sse, to the whole SSE format (multi-line `data:`, comments, `event:`,
CRLF). Reasoning the upstream sends apart (`reasoning_content`) is wrapped in <think> tags, which the
chat layer's answer parser splits off again by the request's reasoning format. Tool calls are
gathered from their deltas and given as structure on the Finished event, so every protocol's
encoder writes them in its own shape without parsing any text.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError

from kinetic.chat.reasoning import CLOSE_TAG, OPEN_TAG
from kinetic.engine.types import Event, Finished, FinishReason, StructuredCall, TextDelta, Timings, Usage
from kinetic.errors import ServerError


async def sse_chunks(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of an OpenAI stream, up to `[DONE]`; an error event raises ServerError."""
    try:
        async for sse in EventSource(response).aiter_sse():
            if sse.data == "[DONE]":
                return
            try:
                chunk = json.loads(sse.data)
            except json.JSONDecodeError:
                continue  # a keep-alive or a line no OpenAI client reads either
            if sse.event == "error" or (isinstance(chunk, dict) and "error" in chunk):
                error = chunk.get("error", chunk) if isinstance(chunk, dict) else chunk
                raise ServerError(f"upstream: {error.get('message') if isinstance(error, dict) else error}")
            if isinstance(chunk, dict):
                yield chunk
    except SSEError as exc:
        raise ServerError(f"upstream answered without streaming: {exc}") from exc


@dataclass
class CallBuilder:
    id: str = ""
    name: str = ""
    arguments: str = ""

    def add(self, delta: dict[str, Any]) -> None:
        """One streamed OpenAI tool-call delta (the first of a call carries its id and name, later ones
        pieces of its arguments)."""
        function = delta.get("function") or {}
        self.id = self.id or delta.get("id") or ""
        self.name += function.get("name") or ""
        self.arguments += function.get("arguments") or ""

    def call(self) -> StructuredCall:
        return StructuredCall(name=self.name, arguments=self.arguments or "{}", id=self.id)


@dataclass
class Answer:
    """What the upstream said so far, and when."""

    started: float = field(default_factory=time.perf_counter)
    first_at: float | None = None
    pieces: list[str] = field(default_factory=list)
    thinking: bool = False
    finish: str = "stop"
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] | None = None
    calls: dict[int, CallBuilder] = field(default_factory=dict)

    def text(self, reasoning: str, content: str) -> str:
        text = ""
        if reasoning:
            text += ("" if self.thinking else OPEN_TAG) + reasoning
            self.thinking = True
        if content:
            text += (CLOSE_TAG if self.thinking else "") + content
            self.thinking = False
        if text:
            self.first_at = self.first_at or time.perf_counter()
            self.pieces.append(text)
        return text

    def read(self, choice: dict[str, Any], *, is_chat: bool) -> str:
        if is_chat:
            delta = choice.get("delta") or {}
            for call in delta.get("tool_calls") or []:
                self.calls.setdefault(int(call.get("index") or 0), CallBuilder()).add(call)
            text = self.text(delta.get("reasoning_content") or "", delta.get("content") or "")
        else:
            text = self.text("", choice.get("text") or "")
        self.finish = choice.get("finish_reason") or self.finish
        return text

    def finished(self) -> Finished:
        ended = time.perf_counter()
        prompt_n = int(self.usage.get("prompt_tokens") or 0)
        predicted_n = int(self.usage.get("completion_tokens") or len(self.pieces))
        cached = int((self.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        if self.timings:  # llama-server's (or kinetic's) own numbers, passed through
            t = self.timings
            measured = Timings(cache_n=int(t.get("cache_n", cached)), prompt_n=int(t.get("prompt_n", prompt_n)),
                               prompt_ms=float(t.get("prompt_ms", 0.0)),
                               predicted_n=int(t.get("predicted_n", predicted_n)),
                               predicted_ms=float(t.get("predicted_ms", 0.0)))
        else:  # measured here: time to the first piece, then the rest
            first = self.first_at or ended
            measured = Timings(cache_n=cached, prompt_n=prompt_n, prompt_ms=(first - self.started) * 1000,
                               predicted_n=predicted_n, predicted_ms=(ended - first) * 1000)
        reason: FinishReason = "length" if self.finish == "length" else "stop"
        return Finished(finish_reason=reason, stop_type="limit" if reason == "length" else "eos", stopping_word="",
                        text="".join(self.pieces), tokens=[], usage=Usage(prompt_n, predicted_n, cached),
                        timings=measured, id_slot=-1, tokens_cached=cached, truncated=False,
                        calls=tuple(self.calls[index].call() for index in sorted(self.calls)))


async def read_events(response: httpx.Response, *, is_chat: bool) -> AsyncIterator[Event]:
    answer = Answer()
    async for chunk in sse_chunks(response):
        answer.usage = chunk.get("usage") or answer.usage
        answer.timings = chunk.get("timings") or answer.timings
        for choice in chunk.get("choices") or []:
            if text := answer.read(choice, is_chat=is_chat):
                yield TextDelta(text=text, token_id=-1)
    if answer.thinking:
        answer.pieces.append(CLOSE_TAG)
        yield TextDelta(text=CLOSE_TAG, token_id=-1)
    yield answer.finished()
