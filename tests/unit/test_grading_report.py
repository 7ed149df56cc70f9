"""`kinetic grade` output and exit codes on the reference deliverables (no model, no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kinetic.cli import main
from kinetic.grading.checks import CheckResult
from kinetic.grading.report import StudentReport, render_student, render_summary
from tests.server import free_port

REFERENCE = Path(__file__).resolve().parents[2] / "labs" / "lab-04-02-client-openai" / "reference"


def test_grade_good_deliverable_exits_zero_with_a_readable_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grade", "lab-04-02", str(REFERENCE / "good.md")]) == 0
    out = capsys.readouterr().out
    assert out.count(":) ") == 7 and "7/7 checks passed" in out and ":(" not in out


def test_grade_folder_prints_each_student_and_a_summary_and_exits_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grade", "lab-04-02", str(REFERENCE)]) == 1
    out = capsys.readouterr().out
    summary = out[out.index("student "):].splitlines()
    assert len(summary) == 2 + 6  # header, rule, six deliverables (README.md is not one)
    assert any(row.startswith("good ") and row.rstrip().endswith("-") for row in summary)
    assert any(row.startswith("broken-ttft ") and row.endswith("stream_ttft") for row in summary)
    assert "help: TTFT is measured inside the same request" in out


def test_grade_json_lists_every_check(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grade", "lab-04-02", str(REFERENCE / "broken-answer.md"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    (student,) = report["students"]
    assert report["lab"] == "lab-04-02" and not report["passed"] and student["student"] == "broken-answer"
    failed = [c for c in student["checks"] if c["passed"] is False]
    assert [c["name"] for c in failed] == ["answer_names_lines"] and failed[0]["help"]


def test_grade_missing_path_or_unreachable_server_exits_two(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grade", "lab-04-02", str(REFERENCE / "nobody.md")]) == 2
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["grade", "lab-04-02", str(REFERENCE / "good.md"), "--server", url]) == 2
    assert "no server answers" in capsys.readouterr().err


def test_report_renders_failures_with_rationale_and_skips_with_reason() -> None:
    report = StudentReport("ann", "ann.md", [
        CheckResult("a", "first thing holds.", True),
        CheckResult("b", "second thing holds.", False, "it does not", "do this"),
        CheckResult("c", "third thing holds.", None, "the x section is missing"),
    ])
    text = render_student(report, "lab-04-02")
    assert ":( second thing holds.\n    it does not\n    help: do this" in text
    assert ":| third thing holds.\n    skipped: the x section is missing" in text
    assert not report.passed and report.failed == ["b"] and "1/3" in render_summary([report])
