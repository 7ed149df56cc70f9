"""A class as it happens: one keyed server with a ledger, students running the lab's real chat.py
and chat.mjs with their own keys, deliverables written in several styles, then `kinetic grade
--ledger`. Honest work passes in every style; made-up, copied, README-copied and other-student
work fails with the reason named; a server error during grading is "could not check"."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from kinetic.classroom.ledger import read_ledger
from tests.lab_04_02_runs import (
    CHAT_PY,
    LAB_DIR,
    STYLES,
    Runs,
    broken_variants,
    run,
    student_runs,
    template_style,
)
from tests.server import DEFAULT_MODEL_ENV, KineticServer, wait_until

pytestmark = pytest.mark.e2e

KEYS = {"alice": "sk-alice-7f3a", "bob": "sk-bob-91c2", "carol": "sk-carol-0b5e", "erin": "sk-erin-44d1",
        "frank": "sk-frank-e810", "dave": "sk-dave-2c77"}
ERROR_LINE = ("openai.AuthenticationError: Error code: 401 - {'error': {'message': 'Invalid API Key', "
              "'type': 'authentication_error', 'code': 401}}")
LEDGER_CHECKS = ["chat_py_in_ledger", "stream_in_ledger", "chat_mjs_in_ledger", "error_401_in_ledger"]


@pytest.fixture(scope="module")
def classroom(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KineticServer, Path, Path]]:
    folder = tmp_path_factory.mktemp("class")
    keys = folder / "keys.txt"
    keys.write_text("# lab 04-02, class of 2026\n" + "".join(f"{key} {name}\n" for name, key in KEYS.items()))
    ledger = folder / "ledger.jsonl"
    with KineticServer("-c", "2048", "-np", "1", "--api-key-file", str(keys), "--ledger", str(ledger),
                       env=DEFAULT_MODEL_ENV) as server:
        yield server, keys, ledger


@pytest.fixture(scope="module")
def runs(classroom: tuple[KineticServer, Path, Path],
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Runs]]:
    """alice runs the lab once per writing style, bob and erin once; each also runs chat.py without
    the key (step 8) and pastes that error line."""
    server, _, _ = classroom
    work = tmp_path_factory.mktemp("runs")
    denied = run([sys.executable, str(CHAT_PY)], server.url)
    assert denied.returncode != 0 and denied.stderr.strip().splitlines()[-1] == ERROR_LINE
    result: dict[str, list[Runs]] = {"alice": [], "bob": [], "erin": []}
    for name, count in (("alice", len(STYLES)), ("bob", 1), ("erin", 1)):
        for index in range(count):
            result[name].append(student_runs(server.url, KEYS[name], work / f"{name}{index}", ERROR_LINE))
    return result


def grade(folder: Path, ledger: Path, keys: Path, *extra: str) -> tuple[int, dict]:
    proc = run([sys.executable, "-m", "kinetic", "grade", "lab-04-02", str(folder), "--ledger", str(ledger),
                "--api-key-file", str(keys), "--json", *extra], "http://127.0.0.1:9")
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def by_student(report: dict) -> dict[str, dict[str, dict]]:
    return {s["student"]: {c["name"]: c for c in s["checks"]} for s in report["students"]}


def test_the_ledger_has_every_request_by_name_and_no_text_or_keys(classroom, runs) -> None:
    _, _, ledger = classroom
    records = read_ledger(ledger)  # the server is still running: the file is readable as it grows
    chats = [r for r in records if r.route == "/v1/chat/completions" and r.status == 200]
    assert sum(r.client == "alice" for r in chats) == 4 * len(STYLES)
    assert {r.client for r in chats} == {"alice", "bob", "erin"}
    assert any(r.status == 401 and r.auth == "wrong" and r.client is None for r in records)
    for record in chats:
        assert record.id is not None and record.id.startswith("chatcmpl-") and record.timing("predicted_n") >= 1
        assert (record.chunks or 0) >= 1 if record.stream else (record.completion_tokens or 0) >= 1
    text = ledger.read_text(encoding="utf-8")
    assert not any(key in text for key in KEYS.values()) and "llama.cpp" not in text and "Rispondi" not in text


def test_concurrent_requests_each_get_one_whole_line(classroom) -> None:
    server, _, ledger = classroom
    before = len(read_ledger(ledger))
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    names = list(KEYS)  # eight requests over six keys: within the per-key in-flight limit

    def ask(index: int) -> int:
        headers = {"Authorization": f"Bearer {KEYS[names[index % len(names)]]}"}
        return httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": index % 2 == 0},
                          headers=headers, timeout=120).status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(ask, range(8))) == [200] * 8
    # a record is written once the server has sent the response's end, which a client may read first
    wait_until(lambda: len(read_ledger(ledger)) >= before + 8, "eight records in the ledger", timeout=10)
    new = read_ledger(ledger)[before:]
    assert len(new) == 8 and all(r.status == 200 for r in new)
    assert sorted(r.client or "" for r in new) == sorted(names[i % len(names)] for i in range(8))
    assert sorted(r.stream for r in new) == [False] * 4 + [True] * 4


def test_real_work_passes_with_the_ledger_in_every_style(classroom, runs, tmp_path: Path) -> None:
    _, keys, ledger = classroom
    folder = tmp_path / "submissions"
    (folder / "bob").mkdir(parents=True)
    for (style, render), alice_runs in zip(STYLES.items(), runs["alice"], strict=False):
        name = None if style == "plain" else "alice"  # the plain file names its author by its file name
        (folder / ("alice.md" if style == "plain" else f"lab-04-02-{style}.md")).write_text(
            render(alice_runs, name), encoding="utf-8")
    (folder / "bob" / "lab-04-02.md").write_text(template_style(runs["bob"][0]), encoding="utf-8")
    (folder / "bob" / "chat.py").write_text(CHAT_PY.read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "notes.md").write_text("# To do\nask about cache_n\n", encoding="utf-8")
    gradebook = tmp_path / "grades.csv"
    code, report = grade(folder, ledger, keys, "--csv", str(gradebook))
    students = by_student(report)
    failing = {Path(s["path"]).name: [(c["name"], c["rationale"]) for c in s["checks"] if c["status"] != "pass"]
               for s in report["students"] if not s["passed"]}
    assert code == 0 and report["passed"], failing
    assert sorted(s["student"] for s in report["students"]) == ["alice"] * len(STYLES) + ["bob"]
    for checks in students.values():
        assert re.search(r"matches chatcmpl-\w+ at \d\d:\d\d:\d\d", checks["chat_py_in_ledger"]["note"])
        assert "(stream)" in checks["stream_in_ledger"]["note"]
    assert {Path(item["path"]).name for item in report["left_out"]} == {"notes.md", "chat.py"}
    rows = list(csv.DictReader(io.StringIO(gradebook.read_text(encoding="utf-8"))))
    assert len(rows) == len(STYLES) + 1 and all(row["Total"] == "15" for row in rows)
    assert [c for c in rows[0] if c in LEDGER_CHECKS] == LEDGER_CHECKS


def test_made_up_copied_readme_and_other_students_work_fails_with_the_reason(classroom, runs, tmp_path: Path) -> None:
    _, keys, ledger = classroom
    folder = tmp_path / "submissions"
    folder.mkdir()
    alice = template_style(runs["alice"][0], "alice")
    (folder / "alice.md").write_text(alice, encoding="utf-8")
    (folder / "carol.md").write_text(alice.replace("Name: alice", "Name: carol"), encoding="utf-8")  # a copy
    (folder / "frank.md").write_text(template_style(runs["bob"][0], "frank"), encoding="utf-8")  # bob's numbers
    readme = broken_variants(template_style(runs["erin"][0]), (LAB_DIR / "README.md").read_text(encoding="utf-8"))
    (folder / "dave.md").write_text(readme["broken-readme-copy.md"], encoding="utf-8")
    erin = runs["erin"][0]
    made_up = re.sub(r"generazione (\d+\.\d) t/s", lambda m: f"generazione {float(m[1]) + 0.3:.1f} t/s", erin.full)
    (folder / "erin.md").write_text(template_style(replace(erin, full=made_up), "erin"), encoding="utf-8")

    code, report = grade(folder, ledger, keys)
    students = by_student(report)
    assert code == 1 and students["alice"]["numbers_not_shared"]["status"] == "pass"
    assert "carol (" in students["alice"]["numbers_not_shared"]["note"]

    def failed(student: str, check: str) -> str:
        result = students[student][check]
        assert result["status"] == "fail", (student, check, result)
        return result["rationale"]

    assert "a request of alice" in failed("carol", "chat_py_in_ledger")
    assert "identical numbers in alice" in failed("carol", "numbers_not_shared")
    assert "a request of bob" in failed("frank", "chat_py_in_ledger")
    assert "exactly the example of README.md" in failed("dave", "numbers_not_from_examples")
    assert "no request in the ledger has these numbers" in failed("dave", "chat_py_in_ledger")
    assert "no request of erin matches" in failed("erin", "chat_py_in_ledger")
    assert "no request in the ledger has these numbers" in failed("erin", "chat_py_in_ledger")
    assert students["erin"]["chat_py_numbers_agree"]["status"] == "pass"  # consistent, and still made up


def test_a_server_error_while_grading_is_could_not_check_and_the_batch_completes(classroom, runs,
                                                                                 tmp_path: Path) -> None:
    server, keys, ledger = classroom
    folder = tmp_path / "submissions"
    folder.mkdir()
    (folder / "alice.md").write_text(template_style(runs["alice"][1], "alice"), encoding="utf-8")
    (folder / "bob.md").write_text(template_style(runs["bob"][0]), encoding="utf-8")
    # The class server has keys and the grader is given none: its own requests get 401.
    code, report = grade(folder, ledger, keys, "--server", server.url)
    assert code == 1 and len(report["students"]) == 2
    for checks in by_student(report).values():
        for name in ("prompt_tokens_match_server", "speeds_plausible"):
            assert checks[name]["status"] == "unchecked"
            assert "HTTP 401 from /apply-template" in checks[name]["rationale"]
            assert checks[name]["points"] == 0
        assert checks["error_401_matches_server"]["status"] == "pass"
        assert all(checks[name]["status"] == "pass" for name in LEDGER_CHECKS)


def test_serve_refuses_a_bad_key_file_or_an_unwritable_ledger_with_one_line(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-1 mario rossi\n")  # a name with a space: three words
    proc = run([sys.executable, "-m", "kinetic", "serve", "--port", "0", "--api-key-file", str(keys)], "http://x")
    assert proc.returncode == 1 and "line 1: expected `KEY [name] [field=value ...]`, and 'rossi' is not" in proc.stderr
    keys.write_text("sk-1 mario.rossi\n")
    proc = run([sys.executable, "-m", "kinetic", "serve", "--port", "0", "--api-key-file", str(keys),
                "--ledger", str(tmp_path)], "http://x")  # a folder, not a file
    assert proc.returncode == 1 and proc.stderr.strip().endswith("it is a directory, not a regular file")
    assert len(proc.stderr.strip().splitlines()) == 1
    (tmp_path / "plain").write_text("")
    proc = run([sys.executable, "-m", "kinetic", "serve", "--port", "0", "--api-key-file", str(keys),
                "--ledger", str(tmp_path / "plain" / "ledger.jsonl")], "http://x")  # under a file
    assert proc.returncode == 1 and proc.stderr.strip().endswith("as the ledger: Not a directory")
