"""Lab 04-02's rules without a model: parsers, every writing style, the reference set, ledger
matching on records, and live checks that cannot run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kinetic.grading.checks import Context, Unchecked
from kinetic.grading.cli import grade_file
from kinetic.grading.deliverable import parse_deliverable, read_deliverable
from kinetic.grading.labs import LabNotFound, find_lab_folder, load_lab
from kinetic.grading.ledger_view import LedgerView

LAB_DIR = Path(__file__).resolve().parents[2] / "labs" / "lab-04-02-client-openai"
REFERENCE = LAB_DIR / "reference"
LAB = load_lab(str(LAB_DIR))
RULES = sys.modules["kinetic_lab_lab_04_02_client_openai"]
GOOD = sorted(REFERENCE.glob("good*.md"))
# Each broken reference fails exactly one check, with this in its rationale.
BROKEN = {
    "broken-missing-section.md": ("outputs_present", "chat.mjs's [N token, X t/s] line"),
    "broken-numbers.md": ("chat_py_numbers_agree", "but the whole request took 0.1s"),
    "broken-ttft.md": ("stream_ttft", "comes later than the total"),
    "broken-401-line.md": ("error_401_line", "Incorrect API key provided"),
    "broken-answer.md": ("answer_names_lines", "does not mention base_url"),
    "broken-readme-copy.md": ("numbers_not_from_examples", "exactly the example of README.md"),
}


def statuses(path: Path, **kwargs: object) -> dict[str, tuple[str, str]]:
    report = grade_file(LAB, path, kwargs.get("server"), kwargs.get("ledger"))  # type: ignore[arg-type]
    return {r.name: (r.status, r.rationale + r.note) for r in report.results}


def test_lab_found_by_id_by_path_and_from_inside_its_folder(tmp_path: Path) -> None:
    assert find_lab_folder("lab-04-02") == LAB_DIR
    assert find_lab_folder(str(LAB_DIR / "grading.py")) == LAB_DIR
    assert find_lab_folder("lab-04-02", cwd=LAB_DIR) == LAB_DIR
    with pytest.raises(LabNotFound, match="no lab 'lab-99-99'"):
        find_lab_folder("lab-99-99", cwd=tmp_path)
    assert LAB.id == "lab-04-02" and LAB.folder == LAB_DIR


def test_output_lines_parsed_in_italian_and_english() -> None:
    text = ("[finish_reason=stop prompt=41 tok, completion=39 tok, 12.7s]\n"
            "[server: cache_n=0 prompt 12.4 t/s, generation 4.2 t/s]\n"
            "[39 chunks, first token after 1.11s, total 15.4s]\n[80 tokens, 4.3 t/s]\n[end]\n")
    found = RULES.parse_outputs(parse_deliverable(text))
    (run,) = found.full
    assert (run.finish_reason, run.prompt, run.completion, run.seconds, run.cache_n, run.prompt_tps,
            run.generation_tps) == ("stop", 41, 39, 12.7, 0, 12.4, 4.2)
    assert found.stream[0].chunks == 39 and found.stream[0].ttft == 1.11 and found.tokens[0].tokens == 80 and found.end


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_every_writing_style_is_read_right_and_passes(path: Path) -> None:
    found = RULES.parse_outputs(read_deliverable(path))
    assert len(found.full) == 1 and len(found.stream) == 1 and len(found.tokens) == 2 and found.end
    assert found.error_line and found.error_line.startswith("openai.AuthenticationError: Error code: 401")
    assert found.answer and any("base_url" in line for line in found.answer)
    failed = {name: s for name, s in statuses(path).items() if s[0] != "pass"}
    assert failed == {}


def test_the_styles_are_really_different() -> None:
    texts = {p.stem: p.read_text(encoding="utf-8") for p in GOOD}
    assert "```" in texts["good"] and "## " in texts["good"]
    bold = texts["good-bold-labels"]
    assert "~~~" in bold and "**" in bold and "## " not in bold
    assert "\n    [finish_reason=" in texts["good-italian"] and "## Errore 401" in texts["good-italian"]
    assert "```" not in texts["good-plain"] and "~~~" not in texts["good-plain"] and "#" not in texts["good-plain"]


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_reference_fails_exactly_its_check(name: str) -> None:
    check, fragment = BROKEN[name]
    results = statuses(REFERENCE / name)
    failed = {n: s for n, s in results.items() if s[0] == "fail"}
    assert list(failed) == [check] and fragment in failed[check][1]
    assert all(s[0] in ("pass", "skipped") for n, s in results.items() if n != check)


def test_error_payload_forms() -> None:
    body = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
    line = f"openai.AuthenticationError: Error code: 401 - {body}"
    assert RULES.parse_error_payload(line) == (401, body)
    assert RULES.parse_error_payload(f"`{line}`") == (401, body)
    payload = RULES.parse_error_payload("AuthenticationError: Error code: 401 - Invalid API Key")[1]
    assert RULES.error_matches(payload, body)


# --- against a ledger (records written here; the e2e tests use a real server's) ---

FULL = ("[finish_reason=length prompt=28 tok, completion=80 tok, 1.2s]\n"
        "[server: cache_n=0 prompt 300.1 t/s, generazione 90.4 t/s]\n")
STREAM = "[80 chunk, primo token dopo 0.10s, totale 1.0s]\n"
MJS = "[80 token, 88.2 t/s]\n[fine]\n"
ERROR = ("openai.AuthenticationError: Error code: 401 - {'error': {'message': 'Invalid API Key', "
         "'type': 'authentication_error', 'code': 401}}\n")


def record(client: str | None, **fields: object) -> dict[str, object]:
    return {"time": "2026-11-30T08:00:00.000Z", "client": client, "auth": "ok" if client else "wrong",
            "addr": "10.0.0.7", "method": "POST", "route": "/v1/chat/completions", "status": 200, **fields}


ALICE = [
    record("alice", id="chatcmpl-full", stream=False, duration_s=1.1, prompt_tokens=28, completion_tokens=80,
           finish_reason="length", timings={"cache_n": 0, "prompt_per_second": 300.14, "predicted_per_second": 90.36,
                                            "predicted_n": 80}),
    record("alice", id="chatcmpl-stream", stream=True, duration_s=0.95, ttft_s=0.09, chunks=80, finish_reason="length",
           timings={"cache_n": 27, "predicted_n": 80, "predicted_per_second": 91.0}),
    record("alice", id="chatcmpl-mjs", stream=False, duration_s=0.9,
           timings={"predicted_n": 80, "predicted_per_second": 88.21}),
    record(None, status=401, duration_s=0.001),
]


def deliverable(tmp_path: Path, name: str, full: str = FULL) -> Path:
    path = tmp_path / f"{name}.md"
    path.write_text(f"## chat.py\n{full}\n## stream\n{STREAM}\n## chat.mjs\n{MJS}\n## 401\n{ERROR}\n"
                    "## Answer\nbase_url, api_key, model\n", encoding="utf-8")
    return path


def test_ledger_matches_each_number_to_the_students_own_request(tmp_path: Path) -> None:
    results = statuses(deliverable(tmp_path, "Alice"), ledger=LedgerView(ALICE))
    assert {n: s[0] for n, s in results.items() if "ledger" in n} == {
        "chat_py_in_ledger": "pass", "stream_in_ledger": "pass", "chat_mjs_in_ledger": "pass",
        "error_401_in_ledger": "pass"}
    assert "chatcmpl-full at 08:00:00" in results["chat_py_in_ledger"][1]


def test_ledger_names_the_other_student_and_the_made_up_numbers(tmp_path: Path) -> None:
    ledger = LedgerView([*ALICE, record("bob", id="chatcmpl-bob", stream=False, duration_s=5.0)])
    bob = statuses(deliverable(tmp_path, "bob"), ledger=ledger)
    assert bob["chat_py_in_ledger"][0] == "fail"
    assert "these numbers are those of chatcmpl-full at 08:00:00, a request of alice" in bob["chat_py_in_ledger"][1]
    made_up = FULL.replace("90.4", "90.9")
    alice = statuses(deliverable(tmp_path, "alice", made_up), ledger=LedgerView(ALICE))
    assert "no request in the ledger has these numbers" in alice["chat_py_in_ledger"][1]
    nobody = statuses(deliverable(tmp_path, "zed"), ledger=LedgerView(ALICE))
    assert "no request of 'zed' (no such name in" in nobody["chat_py_in_ledger"][1]


def test_a_request_longer_than_the_clients_clock_does_not_match(tmp_path: Path) -> None:
    slow = [dict(ALICE[0], duration_s=1.4), *ALICE[1:]]
    results = statuses(deliverable(tmp_path, "alice"), ledger=LedgerView(slow))
    assert results["chat_py_in_ledger"][0] == "fail"
    assert "took the server 1.40s, more than the 1.2s" in results["chat_py_in_ledger"][1]


# --- live checks that cannot run ---

class DeadServer:
    """What LiveServer raises when the server answers an error: every live answer is Unchecked."""

    def count_prompt_tokens(self, *args: object) -> int:
        raise Unchecked("the server at http://x gave no usable answer: HTTP 401 from /apply-template")

    speeds = property(count_prompt_tokens)
    unauthorized_body = property(count_prompt_tokens)


class OtherModel(DeadServer):
    def count_prompt_tokens(self, *args: object) -> int:
        return 35


def test_server_errors_are_could_not_check_and_never_pass() -> None:
    results = statuses(REFERENCE / "good.md", server=DeadServer())
    live = {n: results[n] for n in ("prompt_tokens_match_server", "speeds_plausible", "error_401_matches_server")}
    assert all(s == "unchecked" and "HTTP 401" in why for s, why in live.values())
    report = grade_file(LAB, REFERENCE / "good.md", DeadServer(), None)  # type: ignore[arg-type]
    assert not report.passed and report.points < report.max_points


def test_another_model_is_said_so_not_called_made_up() -> None:
    results = statuses(REFERENCE / "good.md", server=OtherModel())
    status, why = results["prompt_tokens_match_server"]
    assert status == "unchecked" and "come from another model" in why and "made up" not in why


def test_checks_see_one_context_per_file() -> None:
    ctx = Context(read_deliverable(REFERENCE / "good.md"), LAB_DIR)
    assert RULES.outputs(ctx) is RULES.outputs(ctx)


def test_example_numbers_pass_when_the_ledger_proves_them_the_students_own() -> None:
    """On the machine the examples were made on, a fresh honest run can repeat their timings: the
    ledger's word (every ledger check passed) outweighs the coincidence."""
    from kinetic.grading.batch import examples_result
    from kinetic.grading.checks import CheckResult

    copied = LAB_DIR / "reference" / "broken-readme-copy.md"
    prints = LAB.fingerprint(Context(read_deliverable(copied), LAB_DIR))
    assert examples_result(LAB, prints, copied).status == "fail"
    ledger_checks = [CheckResult(c.name, "", "pass", 1, 1) for c in LAB.checks if c.needs == "ledger"]
    assert ledger_checks
    assert examples_result(LAB, prints, copied, ledger_checks).status == "pass"
    failed = [CheckResult(c.name, "", "fail", 0, 1) for c in LAB.checks if c.needs == "ledger"]
    assert examples_result(LAB, prints, copied, failed).status == "fail"
