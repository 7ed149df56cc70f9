"""Checks across deliverables: numbers copied from the lab's own examples, or from a classmate.

A lab says what identifies a run (its `fingerprints`: a timings line, a response id) and how much
weight of identical fingerprints makes a copy; a single low-weight coincidence (two students both
at 47.6 t/s) is never enough.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kinetic.grading.checks import CheckResult, Context, Fingerprint, Lab
from kinetic.grading.deliverable import read_deliverable
from kinetic.grading.report import StudentReport

EXAMPLES_CHECK = "numbers_not_from_examples"
COPY_CHECK = "numbers_not_shared"


def example_files(lab: Lab, graded: Path) -> list[Path]:
    """The lab text and template always; the reference deliverables too, unless the file graded is
    one of them (the reference set is graded against the lab text only)."""
    files = sorted(p for p in lab.folder.glob("*.md"))
    reference = lab.folder / "reference"
    inside = reference.resolve() in graded.resolve().parents or lab.folder.resolve() == graded.resolve().parent
    if reference.is_dir() and not inside:
        files += sorted(reference.glob("*.md"))
    return files


def example_fingerprints(lab: Lab, graded: Path) -> dict[tuple[str, str], tuple[Fingerprint, str]]:
    found: dict[tuple[str, str], tuple[Fingerprint, str]] = {}
    for path in example_files(lab, graded):
        if path.resolve() == graded.resolve():
            continue
        ctx = Context(read_deliverable(path), lab.folder)
        for fp in lab.fingerprint(ctx):
            found.setdefault((fp.label, fp.value), (fp, path.relative_to(lab.folder).as_posix()))
    return found


def _same(a: list[Fingerprint], b: Mapping[tuple[str, str], object]) -> list[Fingerprint]:
    return [fp for fp in a if (fp.label, fp.value) in b]


def examples_result(lab: Lab, prints: list[Fingerprint], graded: Path,
                    results: list[CheckResult] | None = None) -> CheckResult:
    """Fails numbers that are exactly an example's, unless the ledger proved them this student's own
    requests: on the machine the examples were made on, a fresh run can repeat their timings."""
    description = "the numbers are your own, not the examples of the lab text or its reference files"
    if results is not None and _ledger_proves(lab, results):
        return CheckResult(EXAMPLES_CHECK, description, "pass", lab.copy_points, lab.copy_points)
    same = _same(prints, example_fingerprints(lab, graded)) if prints else []
    if sum(fp.weight for fp in same) >= lab.copy_weight:
        examples = example_fingerprints(lab, graded)
        where = sorted({examples[(fp.label, fp.value)][1] for fp in same})
        return CheckResult(EXAMPLES_CHECK, description, "fail", 0.0, lab.copy_points,
                           f"{', '.join(fp.label for fp in same)} are exactly the example of {', '.join(where)}",
                           "run the scripts yourself and paste your own outputs")
    return CheckResult(EXAMPLES_CHECK, description, "pass", lab.copy_points, lab.copy_points)


def _ledger_proves(lab: Lab, results: list[CheckResult]) -> bool:
    ledger_checks = {c.name for c in lab.checks if c.needs == "ledger"}
    found = [r for r in results if r.name in ledger_checks]
    return bool(found) and all(r.passed for r in found)


def proven_by_ledger(lab: Lab, report: StudentReport) -> bool:
    """Every ledger check passed: the numbers are this student's own requests, so sharing them
    means someone else copied them, not this student."""
    return _ledger_proves(lab, report.results)


def copy_results(lab: Lab, reports: list[StudentReport]) -> None:
    """Appends to each report whether another deliverable of the batch shares its numbers
    (listed for a single deliverable too, so that the points possible never depend on the batch)."""
    description = "no other deliverable of this batch has the same numbers"
    for report in reports:
        shared = []
        for other in reports:
            if other is report:
                continue
            same = _same(report.fingerprints, {(fp.label, fp.value): fp for fp in other.fingerprints})
            if same and sum(fp.weight for fp in same) >= lab.copy_weight:
                shared.append(f"{other.student} ({', '.join(fp.label for fp in same)})")
        if shared and proven_by_ledger(lab, report):
            report.results.append(CheckResult(
                COPY_CHECK, description, "pass", lab.copy_points, lab.copy_points,
                note=f"{'; '.join(shared)} pasted the same numbers, but the ledger shows they are your requests"))
        elif shared:
            report.results.append(CheckResult(
                COPY_CHECK, description, "fail", 0.0, lab.copy_points,
                f"identical numbers in {'; '.join(shared)}: likely a copy",
                "each student pastes the outputs of their own runs"))
        else:
            report.results.append(CheckResult(COPY_CHECK, description, "pass", lab.copy_points, lab.copy_points))
