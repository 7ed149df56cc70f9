"""Renderers: a readable report per student, a class summary, JSON for tooling, a CSV gradebook.

Faces are check50's ASCII ones so that any console (Windows cp1252 included) prints them:
`:)` passed, `:(` failed, `:|` skipped, `:?` could not check.

The CSV is one row per student: `Student`, `SIS Login ID` (the id the grader matched: the key's
name with a ledger, else the file's), `Total`, one column per check with its points, `Feedback`.
Moodle imports it (Grades > Import > CSV file: map `SIS Login ID` to the username or ID number,
`Total` to the grade item, `Feedback` to its feedback); Canvas matches students on `SIS Login ID`
(ignore the per-check columns at its preview step, or keep them as separate assignments).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from kinetic.grading.checks import FACES, CheckResult, Fingerprint

STATUS_WORDS = {"pass": "passed", "fail": "failed", "skipped": "skipped", "unchecked": "could not check"}


def fmt_points(value: float) -> str:
    return f"{value:g}"


@dataclass
class StudentReport:
    student: str  # the id: the ledger's name when one matched, else from the file
    path: str
    results: list[CheckResult]
    display_name: str = ""
    fingerprints: list[Fingerprint] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every check passed (a skip counts only when the lab marks the check optional)."""
        return all(r.passed for r in self.results)

    @property
    def points(self) -> float:
        return sum(r.points for r in self.results)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.results)

    def named(self, status: str) -> list[str]:
        return [r.name for r in self.results if r.status == status]

    @property
    def feedback(self) -> str:
        """One paragraph for the gradebook: what failed or could not be checked, and why."""
        parts = []
        for r in self.results:
            if r.status == "fail":
                parts.append(f"{r.name}: {r.rationale}" + (f" ({r.help})" if r.help else ""))
            elif r.status == "unchecked":
                parts.append(f"{r.name}: could not check: {r.rationale}")
        return " | ".join(parts) or "all checks passed"


def render_student(report: StudentReport, lab: str) -> str:
    who = report.student if not report.display_name or report.display_name == report.student \
        else f"{report.student} ({report.display_name})"
    lines = [f"{lab} - {who}: {report.path}"]
    for result in report.results:
        lines.append(f"{FACES[result.status]} {result.description}")
        if result.status == "fail":
            lines.append(f"    {result.rationale}")
            if result.help:
                lines.append(f"    help: {result.help}")
        elif result.status in ("skipped", "unchecked"):
            lines.append(f"    {STATUS_WORDS[result.status]}: {result.rationale}")
        if result.note:
            lines.append(f"    {result.note}")
    counts = ", ".join(f"{sum(r.status == s for r in report.results)} {word}"
                       for s, word in STATUS_WORDS.items() if any(r.status == s for r in report.results))
    lines.append(f"{fmt_points(report.points)}/{fmt_points(report.max_points)} points ({counts})")
    return "\n".join(lines)


def render_summary(reports: list[StudentReport]) -> str:
    width = max([len("student"), *(len(r.student) for r in reports)])
    rows = [f"{'student':<{width}}  points  failed / could not check",
            f"{'-' * width}  ------  ------------------------"]
    for report in reports:
        points = f"{fmt_points(report.points)}/{fmt_points(report.max_points)}"
        trouble = report.named("fail") + [f"{name}?" for name in report.named("unchecked")]
        rows.append(f"{report.student:<{width}}  {points:>6}  {', '.join(trouble) or '-'}")
    return "\n".join(rows)


def render_left_out(left_out: list[tuple[str, str]]) -> str:
    lines = [f"not graded ({len(left_out)} file(s) that are not deliverables):"]
    lines += [f"  {path}: {why}" for path, why in left_out]
    return "\n".join(lines)


def render_json(reports: list[StudentReport], lab: str, *, left_out: Sequence[tuple[str, str]] = (),
                notes: Sequence[str] = ()) -> str:
    return json.dumps({
        "lab": lab,
        "passed": all(r.passed for r in reports),
        "notes": list(notes),
        "students": [{"student": r.student, "name": r.display_name or r.student, "path": r.path,
                      "passed": r.passed, "points": r.points, "max_points": r.max_points,
                      "feedback": r.feedback, "checks": [c.to_dict() for c in r.results]} for r in reports],
        "left_out": [{"path": path, "reason": why} for path, why in left_out],
    }, indent=2, ensure_ascii=False)


def csv_columns(reports: list[StudentReport]) -> list[str]:
    checks = list(dict.fromkeys(r.name for report in reports for r in report.results))
    return ["Student", "SIS Login ID", "Total", *checks, "Feedback"]


def render_csv(reports: list[StudentReport]) -> str:
    columns = csv_columns(reports)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for report in reports:
        by_name = {r.name: fmt_points(r.points) for r in report.results}
        writer.writerow([report.display_name or report.student, report.student, fmt_points(report.points),
                         *(by_name.get(name, "") for name in columns[3:-1]), report.feedback])
    return out.getvalue()
