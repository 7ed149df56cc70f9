"""Lab 04-05 as a class does it: see.py against a keyed `kinetic serve -mm` (the bundled Gemma with the tiny
gemma3 projector) that keeps a ledger, then `kinetic grade --ledger`.

The good reference deliverables are real runs of see.py; KINETIC_REGENERATE_REFERENCE=1 rewrites
labs/lab-04-05-images/reference/ from this server.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kinetic.classroom.ledger import read_ledger
from kinetic.grading.deliverable import parse_deliverable
from kinetic.grading.labs import load_lab
from tests.hybrid_model import tiny_model
from tests.lab_04_05_runs import LAB_DIR, SEE_PY, STYLES, Runs, broken_variants, student_runs, template_style
from tests.projector_model import GEMMA3_IMAGE_TOKENS, tiny_projector
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

KEYS = {"alice": "sk-alice-5e1f", "bob": "sk-bob-8a20"}


def grading_rules() -> Any:
    load_lab(str(LAB_DIR))
    return sys.modules["kinetic_lab_" + LAB_DIR.name.replace("-", "_")]


@pytest.fixture(scope="module")
def classroom(model_lock: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KineticServer, Path, Path]]:
    folder = tmp_path_factory.mktemp("class")
    keys = folder / "keys.txt"
    keys.write_text("".join(f"{key} {name}\n" for name, key in KEYS.items()))
    ledger = folder / "ledger.jsonl"
    with KineticServer("-mm", str(tiny_projector("gemma3")), "-c", "2048", "-np", "1",
                       "--api-key-file", str(keys), "--ledger", str(ledger)) as server:
        yield server, keys, ledger


@pytest.fixture(scope="module")
def alice(classroom: tuple[KineticServer, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Runs:
    server, _, _ = classroom
    return student_runs(server.url, KEYS["alice"], tmp_path_factory.mktemp("alice"), seed=501)


def grade(paths: list[Path], *extra: str) -> tuple[int, dict[str, dict[str, dict[str, Any]]]]:
    proc = subprocess.run([sys.executable, "-m", "kinetic", "grade", "lab-04-05", *map(str, paths), "--json", *extra],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    return proc.returncode, {s["student"]: {c["name"]: c for c in s["checks"]} for s in report["students"]}


def test_see_py_asks_what_the_grader_expects() -> None:
    rules = grading_rules()
    script = runpy.run_path(str(SEE_PY), run_name="lab")  # not "__main__": nothing is sent
    assert script["MAX_TOKENS"] == rules.MAX_TOKENS
    assert script["PICTURE"].name == rules.LAB_PICTURE and (LAB_DIR / rules.LAB_PICTURE).is_file()
    source = SEE_PY.read_text(encoding="utf-8")
    assert all(f'ask("{label}", ' in source for label in rules.LABELS)


def test_see_py_prints_what_the_grader_reads(alice: Runs) -> None:
    rules = grading_rules()
    found = rules.parse_outputs(parse_deliverable(alice.picture + alice.own))
    picture, own = found.invocations
    assert picture.complete and own.complete and not found.stray
    assert picture.name == "picture.png" and own.name == "my-photo.png" and picture.sha != own.sha
    for invocation in (picture, own):
        text, image, again = (invocation.runs[label] for label in rules.LABELS)
        # the image's 16 embeddings, and the <start_of_image> / <end_of_image> around them
        assert image.prompt >= text.prompt + GEMMA3_IMAGE_TOKENS + 1 and again.prompt == image.prompt
        assert again.cache_n == again.prompt - 1 and again.prompt_n == 1
    assert own.runs["image"].cache_n < own.runs["text only"].prompt  # the new image was computed


def test_the_ledger_says_which_requests_carried_the_image(classroom: tuple[KineticServer, Path, Path],
                                                          alice: Runs) -> None:
    _, _, ledger = classroom
    chats = [r for r in read_ledger(ledger) if r.client == "alice" and r.route == "/v1/chat/completions"]
    assert len(chats) == 6
    image = {"images": 1, "audio": 0, "tokens": GEMMA3_IMAGE_TOKENS}
    assert [r.media.model_dump() if r.media else None for r in chats] == [None, image, image] * 2
    assert all((r.prompt_tokens or 0) >= r.media.tokens + 1 for r in chats if r.media is not None)


def test_real_runs_pass_every_check_with_the_ledger(classroom: tuple[KineticServer, Path, Path], alice: Runs,
                                                    tmp_path: Path) -> None:
    _, keys, ledger = classroom
    deliverable = tmp_path / "alice.md"
    deliverable.write_text(template_style(alice, "alice"), encoding="utf-8")
    code, students = grade([deliverable], "--ledger", str(ledger), "--api-key-file", str(keys))
    checks = students["alice"]
    assert code == 0 and all(c["status"] == "pass" for c in checks.values()), checks
    assert f"the image {GEMMA3_IMAGE_TOKENS} of them" in checks["image_request_in_ledger"]["note"]
    assert checks["runs_in_ledger"]["note"].count("chatcmpl-") == 6


def test_another_students_outputs_are_named_as_theirs(classroom: tuple[KineticServer, Path, Path], alice: Runs,
                                                      tmp_path: Path) -> None:
    _, keys, ledger = classroom
    copied = tmp_path / "bob.md"
    copied.write_text(template_style(alice, "bob"), encoding="utf-8")
    code, students = grade([copied], "--ledger", str(ledger), "--api-key-file", str(keys))
    checks = students["bob"]
    assert code == 1
    assert checks["image_request_in_ledger"]["status"] == "fail"
    assert "no request of bob with an image" in checks["image_request_in_ledger"]["rationale"]
    assert checks["runs_in_ledger"]["status"] == "fail"
    assert "a request of alice" in checks["runs_in_ledger"]["rationale"]


def test_hybrid_model_runs_pass_the_file_checks(model_lock: None, tmp_path: Path) -> None:
    """On the tiny Qwen3.5 (M-RoPE, hybrid memory) with its qwen3vl projector: the repeated image comes back
    from a checkpoint a few tokens before the prompt's end, within what the grader allows."""
    with KineticServer("-m", str(tiny_model("qwen35")), "-mm", str(tiny_projector("qwen3vl")), "-c", "4096",
                       "-np", "1") as server:
        runs = student_runs(server.url, None, tmp_path, seed=502)
    deliverable = tmp_path / "qwen.md"
    deliverable.write_text(template_style(runs), encoding="utf-8")
    code, students = grade([deliverable])
    assert code == 0, {n: c for n, c in students["qwen"].items() if c["status"] != "pass"}


@pytest.mark.regenerate  # a tool, not a test: collected only with KINETIC_REGENERATE_REFERENCE=1
def test_regenerate_reference_deliverables(classroom: tuple[KineticServer, Path, Path], tmp_path: Path) -> None:
    """One real pair of runs per writing style (each its own photo, so no two share numbers), then one broken
    file per offline check made from the good one."""
    server, _, _ = classroom
    reference = LAB_DIR / "reference"
    reference.mkdir(exist_ok=True)
    template_runs = None
    for seed, (style, render) in enumerate(STYLES.items(), start=600):
        runs = student_runs(server.url, KEYS["alice"], tmp_path / style, seed)
        name = "good.md" if style == "template" else f"good-{style}.md"
        (reference / name).write_text(render(runs, None), encoding="utf-8")
        template_runs = template_runs or runs
    assert template_runs is not None
    good = (reference / "good.md").read_text(encoding="utf-8")
    readme = (LAB_DIR / "README.md").read_text(encoding="utf-8")
    for name, text in broken_variants(good, template_runs, readme).items():
        (reference / name).write_text(text, encoding="utf-8")
