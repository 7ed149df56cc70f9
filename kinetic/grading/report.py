"""Renderers: a readable report per student, a class summary table, JSON for tooling.

Symbols are check50's ASCII faces so that any console (Windows cp1252 included) prints them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kinetic.grading.checks import CheckResult

FACES = {True: ":)", False: ":(", None: ":|"}


@dataclass(frozen=True)
class StudentReport:
    student: str
    path: str
    results: list[CheckResult]

    @property
    def passed(self) -> bool:
        """Every check passed; a skip only happens next to a failure or for a fact the server lacks."""
        return not any(r.passed is False for r in self.results)

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if r.passed is False]

    @property
    def score(self) -> str:
        return f"{sum(r.passed is True for r in self.results)}/{len(self.results)}"


def render_student(report: StudentReport, lab: str) -> str:
    lines = [f"{lab} - {report.student} ({report.path})"]
    for result in report.results:
        lines.append(f"{FACES[result.passed]} {result.description}")
        if result.passed is False:
            lines.append(f"    {result.rationale}")
            if result.help:
                lines.append(f"    help: {result.help}")
        elif result.passed is None:
            lines.append(f"    skipped: {result.rationale}")
    lines.append(f"{report.score} checks passed")
    return "\n".join(lines)


def render_summary(reports: list[StudentReport]) -> str:
    width = max([len("student"), *(len(r.student) for r in reports)])
    rows = [f"{'student':<{width}}  passed  failed checks", f"{'-' * width}  ------  -------------"]
    for report in reports:
        rows.append(f"{report.student:<{width}}  {report.score:>6}  {', '.join(report.failed) or '-'}")
    return "\n".join(rows)


def render_json(reports: list[StudentReport], lab: str) -> str:
    return json.dumps({
        "lab": lab,
        "passed": all(r.passed for r in reports),
        "students": [{"student": r.student, "path": r.path, "passed": r.passed,
                      "checks": [c.to_dict() for c in r.results]} for r in reports],
    }, indent=2, ensure_ascii=False)
