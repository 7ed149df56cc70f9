"""What one answer told its client, as each protocol's encoder tells it: handed to the request ledger.

The ledger used to find usage by parsing every protocol's JSON and SSE on the way out, so a protocol
that did not look like OpenAI was recorded half and nothing failed. Now the code that writes a
protocol's numbers notes the same numbers here, once: the encoder of a stream as it goes (chunks, the
first one's time, the tool calls it starts, then usage and finish), the body builder of a whole answer,
a route that embeds or ranks. The counts are neutral (prompt tokens include the cached ones, as
OpenAI's `prompt_tokens`): a protocol that shows them split, as Anthropic does, shows the same numbers.

The route hands them to the request's record (classroom/request_record.py: `add_outcomes`), which the
ledger middleware reads once the answer is out, as it reads the caller's name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from kinetic.errors import KineticError


class TokenCounts(Protocol):
    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def cached_tokens(self) -> int: ...


class Timings(Protocol):
    def to_dict(self) -> dict[str, float | int]: ...


class Ending(Protocol):
    """What the end of an answer tells, whoever generated it (an engine's `Finished` has these): neutral
    counts, so the classroom's record never depends on an engine's types."""

    @property
    def usage(self) -> TokenCounts: ...

    @property
    def timings(self) -> Timings: ...


@dataclass(frozen=True)
class CallMade:
    """A tool call as the client got it: the id it must send back, and the function's name."""

    id: str
    name: str


@dataclass(frozen=True)
class ErrorTold:
    type: str
    message: str


def error_told(err: KineticError) -> ErrorTold:
    return ErrorTold(err.kind, err.message)


@dataclass
class Outcome:
    """One generation (or embedding, or ranking) as its client was told it; None: not told."""

    id: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    timings: dict[str, float | int] | None = None
    tool_calls: list[CallMade] = field(default_factory=list)
    chunks: int = 0  # stream frames that carried answer text
    first_chunk_at: float | None = None  # time.monotonic() of the first of them
    text: list[str] = field(default_factory=list)  # the answer's text, kept for --ledger-content
    error: ErrorTold | None = None  # a failure told in-band, after the stream's headers went out

    def chunk(self, text: str) -> None:
        """A stream frame with answer text went out."""
        if text:
            self.chunks += 1
            if self.first_chunk_at is None:
                self.first_chunk_at = time.monotonic()
            self.text.append(text)

    def call(self, call_id: str, name: str) -> None:
        self.tool_calls.append(CallMade(call_id, name))

    def finished(self, finished: Ending, finish_reason: str, *, answer: str | None = None) -> None:
        """The end: `finish_reason` in the protocol's own words, `answer` a whole answer's text."""
        usage = finished.usage
        self.prompt_tokens, self.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        self.cached_tokens = usage.cached_tokens
        self.finish_reason = finish_reason
        self.timings = finished.timings.to_dict()
        if answer is not None:
            self.text = [answer]

    def failed(self, err: KineticError) -> None:
        self.error = error_told(err)
