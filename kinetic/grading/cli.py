"""`kinetic grade LAB PATH... [--server URL] [--ledger FILE] [--json] [--csv FILE]`.

Exit 0 only if every check of every deliverable passed; 1 when one failed or could not be
checked; 2 for a usage problem (no lab, no deliverable, an unreadable ledger).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from kinetic.classroom.keys import KeyFileError
from kinetic.grading.batch import copy_results, examples_result
from kinetic.grading.checks import Context, Lab
from kinetic.grading.deliverable import read_deliverable
from kinetic.grading.labs import LabNotFound, load_lab
from kinetic.grading.ledger_view import LedgerView
from kinetic.grading.live import LiveServer
from kinetic.grading.report import (
    StudentReport,
    render_csv,
    render_json,
    render_left_out,
    render_student,
    render_summary,
)

EXIT_FAILED, EXIT_USAGE = 1, 2
DELIVERABLE_SUFFIXES = (".md", ".markdown", ".txt")


def add_grade_command(subparsers: Any) -> None:
    grade = subparsers.add_parser(
        "grade", help="check lab deliverables (lab-XX-YY.md), against a server's ledger or a live server",
        description="Grade one deliverable or every deliverable in a folder. LAB is a lab folder "
                    "(labs/lab-04-02-client-openai) or its id (lab-04-02). With --ledger, each student's "
                    "numbers must be requests of that student in the class server's ledger; with --server, "
                    "they are also compared with that running server. The grader starts no server.",
    )
    grade.add_argument("lab", metavar="LAB", help="the lab's folder or id, e.g. lab-04-02")
    grade.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="a deliverable, or a folder of them")
    grade.add_argument("--ledger", type=Path, metavar="FILE",
                       help="the ledger of the class server (kinetic serve --ledger)")
    grade.add_argument("--api-key-file", type=Path, metavar="FILE",
                       help="the class server's key file: its names are the students' ids")
    grade.add_argument("--server", metavar="URL", help="a running kinetic serve to check the numbers against")
    grade.add_argument("--api-key", metavar="K", help="the server's --api-key, if it has one")
    grade.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds to wait for the server")
    grade.add_argument("--json", action="store_true", help="print the report as JSON")
    grade.add_argument("--csv", type=Path, metavar="FILE", help="also write a gradebook CSV (Moodle, Canvas)")
    grade.set_defaults(run=run_grade)


def collect(paths: list[Path], lab: Lab) -> tuple[list[Path], list[tuple[str, str]], list[str]]:
    """(deliverables, files left out with why, paths that do not exist)."""
    found: list[Path] = []
    left_out: list[tuple[str, str]] = []
    missing: list[str] = []
    for path in paths:
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                if any(part.startswith(".") for part in file.relative_to(path).parts):
                    continue  # .git, .venv, editor files
                if file.suffix.lower() not in DELIVERABLE_SUFFIXES:
                    left_out.append((str(file), f"not a {'/'.join(DELIVERABLE_SUFFIXES)} file"))
                elif file.name.lower() == "readme.md":
                    left_out.append((str(file), "a README"))
                else:
                    found.append(file)
        elif path.is_file():
            found.append(path)
        else:
            missing.append(str(path))
    kept = []
    for file in found:
        outputs = lab.count_outputs(read_deliverable(file))
        if outputs < lab.deliverable_min_outputs and file not in paths:
            left_out.append((str(file), f"holds {outputs} of the outputs {lab.id} asks for"))
        else:
            kept.append(file)
    return kept, left_out, missing


def grade_file(lab: Lab, path: Path, server: LiveServer | None, ledger: LedgerView | None) -> StudentReport:
    deliverable = read_deliverable(path)
    candidates = deliverable.student_candidates()
    student_ledger = ledger.for_student(candidates) if ledger is not None else None
    ctx = Context(deliverable, lab.folder, server, student_ledger)
    results = lab.run(ctx)
    prints = lab.fingerprint(ctx)
    results.append(examples_result(lab, prints, path, results))
    student = (student_ledger.name if student_ledger is not None and student_ledger.name else None) \
        or (candidates[0] if candidates else path.stem)
    return StudentReport(student, str(path), results, deliverable.name_line() or "", prints)


def run_grade(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per probe would bury the report
    try:
        lab = load_lab(args.lab)
    except LabNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    files, left_out, missing = collect(args.paths, lab)
    if missing or not files:
        print(f"error: no deliverable at {', '.join(missing) or ' '.join(map(str, args.paths))}", file=sys.stderr)
        return EXIT_USAGE
    ledger = None
    if args.ledger is not None:
        try:
            ledger = LedgerView.from_files(args.ledger, args.api_key_file)
        except (OSError, KeyFileError) as exc:
            print(f"error: cannot read the ledger or key file: {exc}", file=sys.stderr)
            return EXIT_USAGE
    notes = []
    server = LiveServer(args.server, args.api_key, args.timeout) if args.server else None
    if server is not None:
        problem = server.health_problem()
        if problem:  # not fatal: the live checks say "could not check" and the rest still grade
            notes.append(f"the server {args.server} is not answering ({problem}): its checks could not run")
    reports = []
    try:
        for path in files:
            reports.append(grade_file(lab, path, server, ledger))
    finally:
        if server is not None:
            server.close()
    copy_results(lab, reports)
    if args.csv is not None:
        args.csv.write_text(render_csv(reports), encoding="utf-8", newline="")
    if args.json:
        print(render_json(reports, lab.id, left_out=left_out, notes=notes))
    else:
        for note in notes:
            print(f"note: {note}")
        print("\n\n".join(render_student(r, lab.id) for r in reports))
        if len(reports) > 1:
            print("\n" + render_summary(reports))
        if left_out:
            print("\n" + render_left_out(left_out))
    return 0 if all(r.passed for r in reports) else EXIT_FAILED
