"""Lab 04-05's rules without a model: the lines see.py prints, the reference set, and ledger matching on
records written here (the e2e test uses a real server's ledger)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from kinetic.grading.cli import grade_file
from kinetic.grading.deliverable import parse_deliverable, read_deliverable
from kinetic.grading.labs import find_lab_folder, load_lab
from kinetic.grading.ledger_view import LedgerView

LAB_DIR = Path(__file__).resolve().parents[2] / "labs" / "lab-04-05-images"
REFERENCE = LAB_DIR / "reference"
LAB = load_lab(str(LAB_DIR))
RULES = sys.modules["kinetic_lab_lab_04_05_images"]
GOOD = sorted(REFERENCE.glob("good*.md"))
FILE_POINTS = 8  # the checks on the file alone, as the lab text and docs/grading.md state
# Each broken reference fails exactly one check, with this in its rationale.
BROKEN = {
    "broken-missing-own-image.md": ("outputs_present", "on an image of your own"),
    "broken-numbers.md": ("run_numbers_agree", "but the whole request took 0.1s"),
    "broken-image-adds-nothing.md": ("image_adds_tokens", "the image added nothing"),
    "broken-no-cache.md": ("repeat_comes_from_cache", "a repeated image is reused"),
    "broken-reused-new-image.md": ("new_image_is_computed", "the server had this image already"),
    "broken-answer.md": ("answer_explains_cost", "does not mention the cache or tokens"),
    "broken-readme-copy.md": ("numbers_not_from_examples", "exactly the example of README.md"),
}


def statuses(path: Path, ledger: LedgerView | None = None) -> dict[str, tuple[str, str]]:
    report = grade_file(LAB, path, None, ledger)
    return {r.name: (r.status, r.rationale + r.note) for r in report.results}


def test_lab_found_by_id() -> None:
    assert find_lab_folder("lab-04-05") == LAB_DIR
    assert LAB.id == "lab-04-05" and LAB.folder == LAB_DIR


def test_points_on_the_file_alone_and_with_the_ledger() -> None:
    assert sum(c.points for c in LAB.checks if c.needs is None) == FILE_POINTS
    assert sum(c.points for c in LAB.checks if c.needs == "ledger") == 4


def test_see_py_lines_are_read_into_one_invocation_per_image() -> None:
    text = ("[image cat.jpg: 210.4 KB, sha256 0123456789ab]\n--- text only\nblah\n"
            "[text only: finish_reason=length prompt=16 tok, completion=32 tok, 0.7s]\n"
            "[server: cache_n=0 prompt_n=16 prompt 300.0 t/s, generation 46.0 t/s]\n"
            "[image: finish_reason=stop prompt=274 tok, completion=9 tok, 2.1s]\n"
            "[server: cache_n=11 prompt_n=263 prompt 140.2 t/s, generazione 44.0 t/s]\n")
    found = RULES.parse_outputs(parse_deliverable(text))
    (invocation,) = found.invocations
    assert (invocation.name, invocation.sha, invocation.complete) == ("cat.jpg", "0123456789ab", False)
    image = invocation.runs["image"]
    assert (image.finish_reason, image.prompt, image.completion, image.seconds, image.cache_n, image.prompt_n,
            image.prompt_tps, image.generation_tps) == ("stop", 274, 9, 2.1, 11, 263, 140.2, 44.0)
    assert invocation.runs["text only"].generation_tps == 46.0 and not found.stray


def test_a_usage_line_without_its_server_line_is_named() -> None:
    text = ("[image cat.jpg: 1.0 KB, sha256 0123456789ab]\n"
            "[image again: finish_reason=length prompt=34 tok, completion=32 tok, 0.7s]\n")
    found = RULES.parse_outputs(parse_deliverable(text))
    assert found.stray == ["[image again: finish_reason=length prompt=34 tok, completion=32 tok, 0.7s]"]


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_every_writing_style_is_read_right_and_passes(path: Path) -> None:
    found = RULES.parse_outputs(read_deliverable(path))
    assert [i.name for i in found.invocations] == ["picture.png", "my-photo.png"]
    assert all(i.complete for i in found.invocations) and found.answer
    report = grade_file(LAB, path, None, None)
    assert {r.name: r.rationale for r in report.results if r.status != "pass"} == {}
    assert report.points == report.max_points == FILE_POINTS + LAB.copy_points


def test_the_styles_are_really_different() -> None:
    texts = {p.stem: p.read_text(encoding="utf-8") for p in GOOD}
    assert "```" in texts["good"] and "## 1." in texts["good"]
    assert "```" not in texts["good-italian"] and "\n    [image again: " in texts["good-italian"]
    assert "## Risposta" in texts["good-italian"]


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_reference_fails_exactly_its_check(name: str) -> None:
    check, fragment = BROKEN[name]
    results = statuses(REFERENCE / name)
    failed = {n: s for n, s in results.items() if s[0] == "fail"}
    assert list(failed) == [check] and fragment in failed[check][1], failed
    assert all(s[0] in ("pass", "skipped") for n, s in results.items() if n != check)


def test_the_lab_picture_is_no_fingerprint() -> None:
    """Every student sends the same picture.png: its hash says nothing about who ran what."""
    from kinetic.grading.checks import Context

    prints = LAB.fingerprint(Context(read_deliverable(REFERENCE / "good.md"), LAB_DIR))
    shas = [p.value for p in prints if p.label == "your image's sha256"]
    assert shas == [RULES.parse_outputs(read_deliverable(REFERENCE / "good.md")).invocations[1].sha]


# --- against a ledger (records written here) ---

def run_lines(label: str, prompt: int, cache_n: int, seconds: float = 0.9) -> str:
    return (f"[{label}: finish_reason=length prompt={prompt} tok, completion=32 tok, {seconds}s]\n"
            f"[server: cache_n={cache_n} prompt_n={prompt - cache_n} prompt 300.0 t/s, generazione 45.0 t/s]\n")


def invocation(name: str, sha: str, first_cache: int) -> str:
    return (f"[image {name}: 2.0 KB, sha256 {sha}]\n" + run_lines("text only", 16, 11)
            + run_lines("image", 34, first_cache) + run_lines("image again", 34, 33))


PICTURE_SHA = RULES.lab_picture_sha(LAB_DIR)
DELIVERABLE = (f"## 1. see.py\n{invocation('picture.png', PICTURE_SHA, 33)}\n"
               f"## 2. see.py mine\n{invocation('cat.png', 'abcdefabcdef', 11)}\n"
               "## 3. Answer\nThe image took 18 tokens; again, cache_n covered it.\n")


def record(client: str, prompt: int, cache_n: int, media: dict[str, int] | None, **fields: Any) -> dict[str, Any]:
    line: dict[str, Any] = {
        "time": "2026-12-02T09:00:00.000Z", "client": client, "auth": "ok", "addr": "10.0.0.9", "method": "POST",
        "route": "/v1/chat/completions", "status": 200, "stream": False, "id": f"chatcmpl-{client}-{prompt}-{cache_n}",
        "duration_s": 0.8, "prompt_tokens": prompt, "completion_tokens": 32, "finish_reason": "length",
        "timings": {"cache_n": cache_n, "prompt_n": prompt - cache_n, "prompt_per_second": 300.02,
                    "predicted_per_second": 44.96}, **fields}
    if media is not None:
        line["media"] = media
    return line


IMAGE = {"images": 1, "audio": 0, "tokens": 16}


def student(client: str, media: dict[str, int] | None = IMAGE) -> list[dict[str, Any]]:
    """The six requests of the deliverable above, as the ledger records them."""
    return [record(client, 16, 11, None), record(client, 34, 33, media), record(client, 34, 33, media),
            record(client, 16, 11, None), record(client, 34, 11, media), record(client, 34, 33, media)]


def graded(tmp_path: Path, name: str, records: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    path = tmp_path / f"{name}.md"
    path.write_text(DELIVERABLE, encoding="utf-8")
    return statuses(path, LedgerView(records))


def test_the_ledger_matches_every_run_to_the_students_image_requests(tmp_path: Path) -> None:
    results = graded(tmp_path, "alice", student("alice"))
    assert results["image_request_in_ledger"] == ("pass", "chatcmpl-alice-34-33 at 09:00:00: prompt_tokens=34, "
                                                          "the image 16 of them")
    assert results["runs_in_ledger"][0] == "pass" and results["runs_in_ledger"][1].count("chatcmpl-") == 6


def test_usage_that_leaves_the_image_out_fails(tmp_path: Path) -> None:
    big = {"images": 1, "audio": 0, "tokens": 40}  # more embeddings than the whole prompt counts
    status, why = graded(tmp_path, "alice", student("alice", big))["image_request_in_ledger"]
    assert status == "fail" and "read an image of 40 tokens but counts prompt_tokens=34" in why


def test_a_run_without_the_image_in_the_ledger_does_not_match_an_image_run(tmp_path: Path) -> None:
    records = student("alice", None)  # the same numbers, but no request carried an image
    results = graded(tmp_path, "alice", records)
    assert results["image_request_in_ledger"][0] == "fail" and "with an image" in results["image_request_in_ledger"][1]
    assert results["runs_in_ledger"][0] == "fail" and "no request in the ledger has these numbers" in \
        results["runs_in_ledger"][1]


def test_another_students_requests_are_named(tmp_path: Path) -> None:
    results = graded(tmp_path, "bob", [*student("alice"), record("bob", 16, 0, None)])
    assert results["runs_in_ledger"][0] == "fail" and "a request of alice" in results["runs_in_ledger"][1]
    assert "no request of bob with an image" in results["image_request_in_ledger"][1]


def test_a_request_longer_than_see_pys_clock_does_not_match(tmp_path: Path) -> None:
    slow = [dict(r, duration_s=1.5) if i == 4 else r for i, r in enumerate(student("alice"))]
    results = graded(tmp_path, "alice", slow)
    assert results["runs_in_ledger"][0] == "fail" and "[image: finish_reason=length prompt=34" in \
        results["runs_in_ledger"][1]
