"""What every protocol's encoder of engine events starts from: its request's context, the answer parsed as it
streams (text, reasoning, tool calls: kinetic.chat.answer) and the outcome the ledger records."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from kinetic.chat.answer import AnswerStream
from kinetic.chat.types import AnswerFormat
from kinetic.classroom.outcome import Outcome


class AnswerContext(Protocol):
    @property
    def answer_format(self) -> AnswerFormat: ...

    @property
    def outcome(self) -> Outcome: ...


ContextT = TypeVar("ContextT", bound=AnswerContext)


@dataclass
class AnswerEncoder(Generic[ContextT]):
    ctx: ContextT
    answer: AnswerStream = field(init=False)

    def __post_init__(self) -> None:
        self.answer = AnswerStream(self.ctx.answer_format)

    @property
    def outcome(self) -> Outcome:
        return self.ctx.outcome
