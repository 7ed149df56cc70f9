"""Lab 04-01's rules without a model: the reference set, found by its id like any lab folder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kinetic.grading.cli import grade_file
from kinetic.grading.deliverable import read_deliverable
from kinetic.grading.labs import find_lab_folder, load_lab

LAB_DIR = Path(__file__).resolve().parents[2] / "labs" / "lab-04-01-server-curl"
LAB = load_lab("lab-04-01")
RULES = sys.modules["kinetic_lab_lab_04_01_server_curl"]
GOOD = sorted((LAB_DIR / "reference").glob("good*.md"))
BROKEN = {
    "broken-health.md": ("health_ok", "the model was still loading"),
    "broken-timings.md": ("completion_numbers_agree", "is not predicted_n / predicted_ms"),
    "broken-same-answer-twice.md": ("cache_grew", "the same answer pasted twice"),
    "broken-answer.md": ("answer_explains_cache", "does not mention the cache"),
}


def test_found_by_id_beside_lab_04_02() -> None:
    assert find_lab_folder("lab-04-01") == LAB_DIR and LAB.id == "lab-04-01"


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_good_references_pass_in_each_style(path: Path) -> None:
    deliverable = read_deliverable(path)
    first, second = RULES.completions(deliverable)
    assert second["timings"]["cache_n"] > first["timings"]["cache_n"] and RULES.props(deliverable)["total_slots"] == 1
    report = grade_file(LAB, path, None, None)
    assert report.passed, [(r.name, r.rationale) for r in report.results if not r.passed]


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_reference_fails_exactly_its_check(name: str) -> None:
    check, fragment = BROKEN[name]
    report = grade_file(LAB, LAB_DIR / "reference" / name, None, None)
    failed = {r.name: r.rationale for r in report.results if r.status == "fail"}
    assert list(failed) == [check] and fragment in failed[check]


def test_completion_numbers_must_agree_as_the_server_computes_them() -> None:
    completion = next(o for o in read_deliverable(GOOD[0]).json_objects() if RULES._is_completion(o))
    assert RULES.completion_problem(completion) is None
    edited = json.loads(json.dumps(completion))
    edited["usage"]["completion_tokens"] += 1
    assert "completion_tokens=" in RULES.completion_problem(edited)
    edited = json.loads(json.dumps(completion))
    edited["timings"]["prompt_per_second"] *= 1.001
    assert "prompt_per_second=" in RULES.completion_problem(edited)
