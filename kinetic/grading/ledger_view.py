"""The grader's side of the ledger: whose requests are whose, and which one a pasted number is.

A deliverable names its author by a `Name:` line, its folder or its file name; the ledger names
the caller by the key's name from `--api-key-file`. Both are compared after `normalize_name`
(case, spaces, dots and dashes do not matter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from kinetic.classroom.keys import KeyRing
from kinetic.classroom.ledger import LedgerRecord, read_ledger
from kinetic.grading.deliverable import normalize_name
from kinetic.grading.outcomes import Failure

Record = LedgerRecord
T = TypeVar("T")


def describe_record(record: Record) -> str:
    """`chatcmpl-abc at 10:31:02 (stream)`: how the report names a request."""
    when = record.time[11:19] or "?"
    what = record.id or f"{record.method} {record.route}".strip()
    stream = " (stream)" if record.stream else ""
    return f"{what} at {when}{stream}"


class LedgerView:
    def __init__(self, records: Iterable[Record | Mapping[str, Any]], roster: Iterable[str] = (),
                 source: str = "the ledger"):
        # a ledger's lines as read (LedgerRecord), or as JSON objects (a line parsed elsewhere, a test's)
        self.records = [r if isinstance(r, LedgerRecord) else LedgerRecord.model_validate(r) for r in records]
        self.source = source
        names = [r.client for r in self.records if r.client is not None]
        self.names = list(dict.fromkeys([*roster, *names]))
        self._by_key = {normalize_name(n): n for n in reversed(self.names)}

    @classmethod
    def from_files(cls, ledger: Path, key_file: Path | None = None) -> LedgerView:
        roster = KeyRing(file=key_file).names if key_file else []
        return cls(read_ledger(ledger), roster, str(key_file or ledger))

    def resolve(self, candidates: Iterable[str]) -> str | None:
        for candidate in candidates:
            name = self._by_key.get(normalize_name(candidate))
            if name is not None:
                return name
        return None

    def for_student(self, candidates: list[str]) -> StudentLedger:
        return StudentLedger(self, self.resolve(candidates), candidates)


@dataclass
class StudentLedger:
    view: LedgerView
    name: str | None
    candidates: list[str]
    used: set[int] = field(default_factory=set)  # ids of records already matched to a pasted output

    @property
    def mine(self) -> list[Record]:
        return [r for r in self.view.records if self.name is not None and r.client == self.name]

    @property
    def addresses(self) -> set[str]:
        return {r.addr for r in self.mine if r.addr}

    def who(self) -> str:
        if self.name is not None:
            return self.name
        tried = ", ".join(repr(c) for c in self.candidates) or "no name"
        return f"{tried} (no such name in {self.view.source})"

    def find(self, matches: Callable[[Record], bool]) -> tuple[Record | None, list[Record]]:
        """The first of this student's records that `matches` and is not matched yet, else the
        matching records of anyone else (to say whose numbers these are)."""
        for record in self.mine:
            if id(record) not in self.used and matches(record):
                self.used.add(id(record))
                return record, []
        return None, [r for r in self.view.records if r.client != self.name and matches(r)]

    def match_each(self, pasted: Iterable[T], matches: Callable[[T, Record], bool], missing: Callable[[T], str],
                   hint: str) -> str:
        """Each pasted output is one of this student's requests (each a different one): "matches ..." naming
        them, or a Failure for the first that is not, `missing(item)` saying what was looked for."""

        matched = []
        for item in pasted:
            record, others = self.find(partial(matches, item))
            if record is None:
                raise Failure(f"no {missing(item)}: {whose(others)}", hint)
            matched.append(describe_record(record))
        return "matches " + ", ".join(matched)

    def rejected(self) -> list[Record]:
        """401 answers to calls from an address this student used: a rejected call carries no valid
        key, so the address is all that ties it to a student."""
        addresses = self.addresses
        return [r for r in self.view.records if r.status == 401 and r.addr in addresses]


def whose(others: list[Record]) -> str:
    """`it matches chatcmpl-x at 10:01:02 of bob`, or that no request has these numbers."""
    if not others:
        return "no request in the ledger has these numbers"
    first = others[0]
    owner = first.client or "a caller without a valid key"
    return f"these numbers are those of {describe_record(first)}, a request of {owner}"


def author_ledger(ledger: StudentLedger | None) -> StudentLedger:
    """The deliverable author's part of the ledger; a Failure when the ledger knows no such student."""

    assert ledger is not None
    if ledger.name is None:
        raise Failure(f"no request of {ledger.who()}",
                      "write your name as in the class key file on a line 'Name: ...', or name the file after it")
    return ledger


def timing(record: Record, key: str) -> float | None:
    """One of a request's `timings` numbers, as the ledger recorded it."""
    return record.timing(key)


def printed_alike(value: float | None, pasted: float) -> bool:
    """The server's number printed with one decimal, as the lab scripts print it, equals the pasted one."""
    return value is not None and f"{value:.1f}" == f"{pasted:.1f}"
