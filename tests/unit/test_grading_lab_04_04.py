"""Lab 04-04's rules without a model: load.py's lines parsed, the physics a run obeys, the table made
of the runs, the reference set, and the ledger's view of a run's concurrency."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kinetic.grading.cli import grade_file
from kinetic.grading.deliverable import parse_deliverable, read_deliverable
from kinetic.grading.labs import find_lab_folder, load_lab
from kinetic.grading.ledger_view import LedgerView

LAB_DIR = Path(__file__).resolve().parents[2] / "labs" / "lab-04-04-concurrency"
REFERENCE = LAB_DIR / "reference"
LAB = load_lab(str(LAB_DIR))
RULES = sys.modules["kinetic_lab_lab_04_04_concurrency"]
GOOD = sorted(REFERENCE.glob("good*.md"))
BROKEN = {
    "broken-missing-section.md": ("outputs_present", "the answer to the question on class"),
    "broken-physics.md": ("load_numbers_agree", "tokens are"),
    "broken-table.md": ("table_from_outputs", "is none of the runs pasted above"),
    "broken-answer.md": ("answers_given", "names neither the KV cache nor the context"),
    "broken-readme-copy.md": ("numbers_not_from_examples", "exactly the example of README.md"),
}
RUN = """[np=4, 4 client, 4 richieste, 128 token in 2.0s]
[aggregato 64.0 t/s, per stream 17.0 t/s, TTFT p50 0.20s p95 0.30s]
[cache: prompt 236 tok, cache_n medio 170]
[id: aaaa1111 bbbb2222 cccc3333 dddd4444]
"""


def statuses(path: Path, ledger: LedgerView | None = None) -> dict[str, tuple[str, str]]:
    report = grade_file(LAB, path, None, ledger)
    return {r.name: (r.status, r.rationale + r.note) for r in report.results}


def test_lab_found_by_id_and_max_tokens_is_load_pys() -> None:
    import runpy

    assert find_lab_folder("lab-04-04") == LAB_DIR
    script = runpy.run_path(str(LAB_DIR / "load.py"), run_name="lab")
    assert script["MAX_TOKENS"] == RULES.MAX_TOKENS and script["EXTRA"]["ignore_eos"] is True
    assert script["percentile"]([0.1, 0.4, 0.2, 0.3], 0.95) == RULES.percentile([0.1, 0.4, 0.2, 0.3], 0.95) == 0.4


def test_a_run_is_parsed_in_italian_and_english() -> None:
    (run,) = RULES.parse_outputs(parse_deliverable(RUN)).runs
    assert (run.np, run.clients, run.requests, run.tokens, run.wall, run.aggregate, run.per_stream, run.p50,
            run.p95, run.prompt, run.cache_n, len(run.ids)) == (4, 4, 4, 128, 2.0, 64.0, 17.0, 0.2, 0.3, 236, 170, 4)
    english = RUN.replace("richieste", "requests").replace("aggregato", "aggregate").replace("medio", "mean")
    assert len(RULES.parse_outputs(parse_deliverable(english)).runs) == 1


@pytest.mark.parametrize(("edit", "fragment"), [
    (("128 token", "120 token"), "not 120"),
    (("aggregato 64.0", "aggregato 90.0"), "is not 128 tokens"),
    (("per stream 17.0", "per stream 70.0"), "is above the aggregate"),
    (("per stream 17.0", "per stream 10.0"), "more than 4 streams"),
    (("p95 0.30s", "p95 0.10s"), "are not in that order"),
    (("dddd4444]", "]"), "3 ids for 4 requests"),
])
def test_physics_catches_each_edit(tmp_path: Path, edit: tuple[str, str], fragment: str) -> None:
    path = tmp_path / "x.md"
    path.write_text(RUN.replace(*edit), encoding="utf-8")
    status, why = statuses(path)["load_numbers_agree"]
    assert status == "fail" and fragment in why, why


def test_reference_set_is_complete() -> None:
    assert {p.name for p in REFERENCE.glob("*.md")} >= {"good.md", "README.md", *BROKEN} and len(GOOD) == 2


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_every_writing_style_passes(path: Path) -> None:
    found = RULES.parse_outputs(read_deliverable(path))
    assert len(found.runs) == 3 and len(found.rows) == 3 and len(found.answers) == 3
    assert {n: s for n, s in statuses(path).items() if s[0] != "pass"} == {}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_reference_fails_exactly_its_check(name: str) -> None:
    check, fragment = BROKEN[name]
    failed = {n: s for n, s in statuses(REFERENCE / name).items() if s[0] == "fail"}
    assert list(failed) == [check], failed
    assert fragment in failed[check][1]


def ledger_of(run_ids: list[str], starts: list[float], duration: float, client: str = "alice") -> LedgerView:
    base = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    records = [{"client": client, "route": "/v1/chat/completions", "status": 200, "stream": True,
                "id": f"chatcmpl-{short}XYZ", "duration_s": duration, "ttft_s": 0.1, "timings": {"predicted_n": 32},
                "time": (base + timedelta(seconds=start + duration)).isoformat().replace("+00:00", "Z")}
               for short, start in zip(run_ids, starts, strict=False)]
    return LedgerView(records, ["alice", "bob"])


def test_the_ledger_shows_how_many_were_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "alice.md"
    path.write_text("Name: alice\n\n" + RUN, encoding="utf-8")
    ids = ["aaaa1111", "bbbb2222", "cccc3333", "dddd4444"]
    together = statuses(path, ledger_of(ids, [0, 0.01, 0.02, 0.03], 1.9))["load_runs_in_ledger"]
    assert together[0] == "pass" and "4 requests, 4 at once" in together[1]
    one_by_one = statuses(path, ledger_of(ids, [0, 0.5, 1.0, 1.5], 0.5))["load_runs_in_ledger"]
    assert one_by_one[0] == "fail" and "in flight at most 1, not 4" in one_by_one[1]
    bobs = statuses(path, ledger_of(ids, [0, 0.01, 0.02, 0.03], 1.9, client="bob"))["load_runs_in_ledger"]
    assert bobs[0] == "fail" and "a request of bob" in bobs[1]
    elsewhere = statuses(path, ledger_of(["zzzz9999"], [0], 1.0))["load_runs_in_ledger"]
    assert elsewhere[0] == "fail" and "none of the runs is in the ledger" in elsewhere[1]
