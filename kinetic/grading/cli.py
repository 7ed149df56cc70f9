"""`kinetic grade LAB PATH... [--server URL] [--api-key K] [--json]`: exit 0 only if every check passes."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Callable

from kinetic.grading import lab_04_02
from kinetic.grading.deliverable import read_deliverable
from kinetic.grading.live import LiveServer
from kinetic.grading.report import StudentReport, render_json, render_student, render_summary

LABS: dict[str, Callable[..., Any]] = {lab_04_02.LAB: lab_04_02.grade}
EXIT_FAILED, EXIT_USAGE = 1, 2


def add_grade_command(subparsers: Any) -> None:
    grade = subparsers.add_parser(
        "grade", help="check lab deliverables (lab-XX-YY.md), optionally against a live server",
        description="Grade one deliverable or every .md file in a folder (README.md excepted). With --server, "
                    "the numbers are also checked against that running server; the grader starts none.",
    )
    grade.add_argument("lab", choices=sorted(LABS), help="the lab id")
    grade.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="a deliverable, or a folder of them")
    grade.add_argument("--server", metavar="URL", help="a running kinetic serve to check the numbers against")
    grade.add_argument("--api-key", metavar="K", help="the server's --api-key, if it has one")
    grade.add_argument("--json", action="store_true", help="print JSON for tooling instead of the report")
    grade.set_defaults(run=run_grade)


def collect(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.md") if p.name.lower() != "readme.md")
        else:
            found.append(path)
    return found


def run_grade(args: argparse.Namespace) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per probe would bury the report
    files = collect(args.paths)
    missing = [str(p) for p in files if not p.is_file()]
    if missing or not files:
        print(f"error: no deliverable at {', '.join(missing) or ' '.join(map(str, args.paths))}", file=sys.stderr)
        return EXIT_USAGE
    server = LiveServer(args.server, args.api_key) if args.server else None
    if server is not None and not server.healthy():
        print(f"error: no server answers {args.server}/health; start kinetic serve first", file=sys.stderr)
        return EXIT_USAGE
    grade = LABS[args.lab]
    try:
        reports = []
        for path in files:
            deliverable = read_deliverable(path)
            reports.append(StudentReport(deliverable.student, str(path), grade(deliverable, server)))
    finally:
        if server is not None:
            server.close()
    if args.json:
        print(render_json(reports, args.lab))
    else:
        print("\n\n".join(render_student(r, args.lab) for r in reports))
        if len(reports) > 1:
            print("\n" + render_summary(reports))
    return 0 if all(r.passed for r in reports) else EXIT_FAILED
