"""The check model (after check50): one function per check, its docstring is what students read.

A check passes by returning, fails by raising `Failure(rationale, help)`, and is skipped by raising
`Skip(reason)` (a section it needs is missing, or a live fact the server cannot give).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Failure(Exception):
    """The student's deliverable does not meet the check: `rationale` says what, `help` what to do."""

    def __init__(self, rationale: str, help: str = ""):
        super().__init__(rationale)
        self.rationale = rationale
        self.help = help


class Skip(Exception):
    """The check cannot be judged (a missing section already failed elsewhere, or no live fact)."""


@dataclass(frozen=True)
class Check(Generic[T]):
    name: str
    description: str
    func: Callable[[T], None]
    live: bool


@dataclass(frozen=True)
class CheckResult:
    name: str
    description: str
    passed: bool | None  # None: skipped
    rationale: str = ""
    help: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "passed": self.passed,
                "rationale": self.rationale, "help": self.help}


class Checklist(Generic[T]):
    """The ordered checks of one lab; `run` applies them to one subject (a parsed deliverable)."""

    def __init__(self, lab: str):
        self.lab = lab
        self.checks: list[Check[T]] = []

    def check(self, *, live: bool = False) -> Callable[[Callable[[T], None]], Callable[[T], None]]:
        def register(func: Callable[[T], None]) -> Callable[[T], None]:
            doc = " ".join((func.__doc__ or func.__name__).split())
            self.checks.append(Check(func.__name__, doc, func, live))
            return func
        return register

    def run(self, subject: T, *, live: bool = False) -> list[CheckResult]:
        results = []
        for check in self.checks:
            if check.live and not live:
                continue  # live checks only exist when a server was given
            try:
                check.func(subject)
            except Failure as failure:
                results.append(CheckResult(check.name, check.description, False, failure.rationale, failure.help))
            except Skip as skip:
                results.append(CheckResult(check.name, check.description, None, str(skip)))
            else:
                results.append(CheckResult(check.name, check.description, True))
        return results
