"""`kinetic grade` output, gradebook and exit codes on the reference deliverables (no model, no server)."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from kinetic.cli import main
from kinetic.grading.checks import CheckResult
from kinetic.grading.report import StudentReport, csv_columns, render_csv, render_student, render_summary
from tests.server import free_port

REFERENCE = Path(__file__).resolve().parents[2] / "labs" / "lab-04-02-client-openai" / "reference"
OFFLINE_CHECKS = ["outputs_present", "chat_py_numbers_agree", "stream_ttft", "chat_mjs_lines", "error_401_line",
                  "answer_names_lines", "numbers_not_from_examples", "numbers_not_shared"]


@pytest.fixture()
def lab(tmp_path: Path) -> str:
    """The lab folder without its reference set: the reference files stand in for students' own
    work below, and the grader would (rightly) flag them as copies of the lab's reference files."""
    copy = tmp_path / "lab-04-02-client-openai"
    shutil.copytree(REFERENCE.parent, copy, ignore=shutil.ignore_patterns("reference", "__pycache__"))
    return str(copy)


@pytest.fixture()
def submissions(tmp_path: Path) -> Path:
    """A class folder as an instructor gets it: deliverables, plus files that are not deliverables."""
    folder = tmp_path / "submissions"
    (folder / "mario.rossi").mkdir(parents=True)
    shutil.copy(REFERENCE / "good.md", folder / "mario.rossi" / "lab-04-02.md")
    shutil.copy(REFERENCE / "good-plain.md", folder / "anna.md")
    shutil.copy(REFERENCE / "broken-ttft.md", folder / "luca.md")
    (folder / "mario.rossi" / "chat.py").write_text("print()\n")
    (folder / "notes.md").write_text("# My notes\nremember to buy milk\n")
    (folder / "README.md").write_text("# Submissions\n")
    return folder


def test_grade_good_deliverable_exits_zero_with_a_readable_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grade", "lab-04-02", str(REFERENCE / "good.md")]) == 0
    out = capsys.readouterr().out
    assert out.count(":) ") == len(OFFLINE_CHECKS) and "10/10 points (8 passed)" in out and ":(" not in out


def test_grade_folder_lists_left_out_files_and_a_summary(lab: str, submissions: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grade", lab, str(submissions)]) == 1
    out = capsys.readouterr().out
    summary = out[out.index("\nstudent "):out.index("not graded")].strip().splitlines()
    assert [row.split()[0] for row in summary[2:]] == ["anna", "luca", "mario.rossi"]
    assert summary[3].split()[1:] == ["8/10", "stream_ttft,", "numbers_not_shared"]  # luca's file is mario's, edited
    assert "help: TTFT is measured inside the same request" in out
    left_out = out[out.index("not graded"):]
    assert "notes.md: holds 0 of the outputs lab-04-02 asks for" in left_out
    assert "chat.py: not a .md/.markdown/.txt file" in left_out and "README.md: a README" in left_out


def test_gradebook_csv_has_one_row_per_student_with_points_per_check(lab: str, submissions: Path,
                                                                     tmp_path: Path) -> None:
    gradebook = tmp_path / "grades.csv"
    assert main(["grade", lab, str(submissions), "--csv", str(gradebook), "--json"]) == 1
    rows = list(csv.DictReader(io.StringIO(gradebook.read_text(encoding="utf-8"))))
    assert list(rows[0]) == ["Student", "SIS Login ID", "Total", *OFFLINE_CHECKS, "Feedback"]
    by_id = {row["SIS Login ID"]: row for row in rows}
    assert set(by_id) == {"anna", "luca", "mario.rossi"}
    for row in rows:  # the total is the sum of the check columns, all numbers
        assert float(row["Total"]) == sum(float(row[c]) for c in OFFLINE_CHECKS)
    assert by_id["anna"]["Total"] == "10" and by_id["anna"]["Feedback"] == "all checks passed"
    assert by_id["luca"]["stream_ttft"] == "0" and "stream_ttft: the first token after" in by_id["luca"]["Feedback"]


def test_json_has_the_gradebook_content(lab: str, submissions: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["grade", lab, str(submissions), "--json"])
    report = json.loads(capsys.readouterr().out)
    luca = next(s for s in report["students"] if s["student"] == "luca")
    assert luca["points"] == 8 and luca["max_points"] == 10 and "stream_ttft" in luca["feedback"]
    assert [c["name"] for c in luca["checks"]] == OFFLINE_CHECKS
    assert {item["path"].split("/")[-1] for item in report["left_out"]} == {"notes.md", "chat.py", "README.md"}


def test_missing_path_or_lab_exits_two_but_a_dead_server_does_not_stop_grading(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["grade", "lab-04-02", str(REFERENCE / "nobody.md")]) == 2
    assert main(["grade", "lab-99-99", str(REFERENCE / "good.md")]) == 2
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["grade", "lab-04-02", str(REFERENCE / "good.md"), str(REFERENCE / "good-plain.md"),
                 "--server", url, "--timeout", "5", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert "is not answering" in report["notes"][0] and len(report["students"]) == 2
    for student in report["students"]:
        live = [c for c in student["checks"] if c["name"] in ("prompt_tokens_match_server", "speeds_plausible")]
        assert [c["status"] for c in live] == ["unchecked", "unchecked"]
        assert all("cannot reach the server" in c["rationale"] for c in live)


def test_report_faces_and_points() -> None:
    report = StudentReport("ann", "ann.md", [
        CheckResult("a", "first thing holds.", "pass", 2, 2, note="matches chatcmpl-1"),
        CheckResult("b", "second thing holds.", "fail", 0, 1, "it does not", "do this"),
        CheckResult("c", "third thing holds.", "skipped", 0, 1, "the x section is missing"),
        CheckResult("d", "fourth thing holds.", "unchecked", 0, 1, "HTTP 500 from /tokenize"),
        CheckResult("e", "optional thing.", "skipped", 1, 1, "no key on the server", optional=True),
    ])
    text = render_student(report, "lab-04-02")
    assert ":) first thing holds.\n    matches chatcmpl-1" in text
    assert ":( second thing holds.\n    it does not\n    help: do this" in text
    assert ":| third thing holds.\n    skipped: the x section is missing" in text
    assert ":? fourth thing holds.\n    could not check: HTTP 500 from /tokenize" in text
    assert "3/6 points (1 passed, 1 failed, 2 skipped, 1 could not check)" in text
    assert not report.passed and "b, d?" in render_summary([report])
    assert csv_columns([report]) == ["Student", "SIS Login ID", "Total", "a", "b", "c", "d", "e", "Feedback"]
    assert render_csv([report]).splitlines()[1].startswith("ann,ann,3,2,0,0,0,1,")
