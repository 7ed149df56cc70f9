"""The check model (after check50): one function per check, its docstring is what students read.

A check passes by returning (optionally a note: which request matched, which tolerance applied),
fails by raising `Failure(rationale, help)`, cannot be judged by raising `Skip(reason)` (an output
it needs is missing and already failed elsewhere) and could not run by raising `Unchecked(reason)`
(the server answered an error, timed out, or is another model). Neither a skip nor an unchecked
check ever counts as passed, unless the lab marks the check optional (then a skip does).

Points come from the lab's rules: `@lab.check(points=2)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from kinetic.grading.deliverable import Deliverable
from kinetic.grading.ledger_view import StudentLedger
from kinetic.grading.live import LiveServer
from kinetic.grading.outcomes import Failure, Skip, Unchecked

Status = Literal["pass", "fail", "skipped", "unchecked"]
Needs = Literal["server", "ledger"]
FACES = {"pass": ":)", "fail": ":(", "skipped": ":|", "unchecked": ":?"}


@dataclass
class Context:
    """What one check sees: the deliverable, and what the grader was given to compare it with."""

    deliverable: Deliverable
    lab_dir: Path
    server: LiveServer | None = None
    ledger: StudentLedger | None = None  # the ledger as one student's: LedgerView.for_student
    cache: dict[str, Any] = field(default_factory=dict)  # a lab's parsed outputs, built once

    def parsed(self, key: str, build: Callable[[], Any]) -> Any:
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    func: Callable[[Context], str | None]
    points: float
    optional: bool
    needs: Needs | None


@dataclass(frozen=True)
class CheckResult:
    name: str
    description: str
    status: Status
    points: float  # earned
    max_points: float
    rationale: str = ""
    help: str = ""
    note: str = ""  # said even when passed: the request that matched, the tolerance applied
    optional: bool = False

    @property
    def passed(self) -> bool:
        """Counts as passed: passed, or skipped where the lab marks the check optional."""
        return self.status == "pass" or (self.status == "skipped" and self.optional)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "description": self.description, "status": self.status,
                "passed": self.passed, "points": self.points, "max_points": self.max_points,
                "rationale": self.rationale, "help": self.help, "note": self.note}


@dataclass(frozen=True)
class Fingerprint:
    """One pasted output that identifies a run (a speed line, a response id): equal fingerprints in
    two deliverables, or in a deliverable and the lab's own examples, mean copied numbers.
    `weight` says how unlikely a chance match is; the lab sets how much weight makes a copy."""

    label: str
    value: str
    weight: int = 1


class Lab:
    """A lab's rules: its checks in order, their points, and what identifies a run (fingerprints).

    `labs/<lab folder>/grading.py` defines one module-level `lab = Lab("lab-XX-YY", ...)`.
    """

    def __init__(self, lab_id: str, title: str = "", *, deliverable_min_outputs: int = 1,
                 copy_weight: int = 2, copy_points: float = 0.0):
        self.id = lab_id
        self.title = title or lab_id
        self.checks: list[Check] = []
        self.folder: Path = Path(".")
        self.deliverable_min_outputs = deliverable_min_outputs
        self.copy_weight = copy_weight
        self.copy_points = copy_points
        self._fingerprints: Callable[[Context], list[Fingerprint]] = lambda ctx: []
        self._outputs: Callable[[Deliverable], int] = lambda deliverable: 1

    def check(self, *, points: float = 1.0, optional: bool = False, needs: Needs | None = None
              ) -> Callable[[Callable[[Context], str | None]], Callable[[Context], str | None]]:
        def register(func: Callable[[Context], str | None]) -> Callable[[Context], str | None]:
            doc = " ".join((func.__doc__ or func.__name__).split())
            self.checks.append(Check(func.__name__, doc, func, points, optional, needs))
            return func
        return register

    def fingerprints(self, func: Callable[[Context], list[Fingerprint]]) -> Callable[[Context], list[Fingerprint]]:
        """Registers what identifies a run in this lab's outputs (used for copy detection)."""
        self._fingerprints = func
        return func

    def outputs_found(self, func: Callable[[Deliverable], int]) -> Callable[[Deliverable], int]:
        """Registers how many of this lab's outputs a file holds: a file with fewer than
        `deliverable_min_outputs` is not a deliverable and is left out of the batch."""
        self._outputs = func
        return func

    def count_outputs(self, deliverable: Deliverable) -> int:
        return self._outputs(deliverable)

    def fingerprint(self, ctx: Context) -> list[Fingerprint]:
        try:
            return self._fingerprints(ctx)
        except (Skip, Failure, Unchecked):
            return []

    def active_checks(self, *, server: bool, ledger: bool) -> list[Check]:
        """The checks that apply: a check needing a server or a ledger exists only when one is given."""
        given = {"server": server, "ledger": ledger}
        return [c for c in self.checks if c.needs is None or given[c.needs]]

    def run(self, ctx: Context) -> list[CheckResult]:
        results = []
        for check in self.active_checks(server=ctx.server is not None, ledger=ctx.ledger is not None):
            results.append(run_check(check, ctx))
        return results


def run_check(check: Check, ctx: Context) -> CheckResult:
    def result(status: Status, rationale: str = "", help: str = "", note: str = "") -> CheckResult:
        earned = check.points if status == "pass" or (status == "skipped" and check.optional) else 0.0
        return CheckResult(check.name, check.description, status, earned, check.points, rationale, help, note,
                           check.optional)

    try:
        note = check.func(ctx)
    except Failure as failure:
        return result("fail", failure.rationale, failure.help)
    except Skip as skip:
        return result("skipped", str(skip))
    except Unchecked as unchecked:
        return result("unchecked", str(unchecked))
    except Exception as exc:  # a check's own bug on an odd file must not end the batch
        return result("unchecked", f"the check itself failed ({type(exc).__name__}: {exc}); please report it")
    return result("pass", note=note or "")
