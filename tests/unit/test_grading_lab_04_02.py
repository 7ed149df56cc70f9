"""Lab 04-02 rules without a model: line parsers, number agreement, the reference deliverables."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic.grading import lab_04_02
from kinetic.grading.deliverable import parse_deliverable, read_deliverable
from kinetic.grading.lab_04_02 import (
    FullRun, error_matches, parse_error_payload, parse_full_run, parse_stream_run, server_seconds,
)

REFERENCE = Path(__file__).resolve().parents[2] / "labs" / "lab-04-02-client-openai" / "reference"
SEED_FULL = ["[finish_reason=stop prompt=41 tok, completion=39 tok, 12.7s]",
             "[server: cache_n=0 prompt 12.4 t/s, generazione 4.2 t/s]"]
BODY = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
# Each broken reference fails exactly one check, with this in its rationale.
BROKEN = {
    "broken-missing-section.md": ("sections_present", "missing section(s): chat.mjs"),
    "broken-numbers.md": ("chat_py_numbers_agree", "needs at least 3.1s, but the whole request took 0.9s"),
    "broken-ttft.md": ("stream_ttft", "first token after 2.4s comes later than the total 1.6s"),
    "broken-401-line.md": ("error_401_line", "Incorrect API key provided"),
    "broken-answer.md": ("answer_names_lines", "does not mention base_url"),
}


def test_lab_04_02_parses_the_seed_output_lines() -> None:
    assert parse_full_run(["answer", *SEED_FULL]) == FullRun("stop", 41, 39, 12.7, 0, 12.4, 4.2)
    assert parse_stream_run(["[39 chunk, primo token dopo 1.11s, totale 15.4s]"]) == lab_04_02.StreamRun(39, 1.11, 15.4)


def test_lab_04_02_accepts_english_labels() -> None:
    english = [SEED_FULL[0], "[server: cache_n=0 prompt 12.4 t/s, generation 4.2 t/s]"]
    assert parse_full_run(english) is not None
    assert parse_stream_run(["[39 chunks, first token after 1.11s, total 15.4s]"]) is not None
    assert lab_04_02.END_RE.match("[end]") and lab_04_02.TOKENS_RE.search("[80 tokens, 4.3 t/s]")


def test_lab_04_02_seed_numbers_agree_within_rounding() -> None:
    run = parse_full_run(SEED_FULL)
    assert server_seconds(run, slack=0.05) <= run.seconds + 0.1 <= 3 * server_seconds(run, slack=-0.05) + 2


@pytest.mark.parametrize("line", [
    "openai.AuthenticationError: Error code: 401 - {'error': {'message': 'Invalid API Key', "
    "'type': 'authentication_error', 'code': 401}}",
    "openai.AuthenticationError: Error code: 401 - Invalid API Key",  # newer openai SDKs
])
def test_lab_04_02_401_line_in_both_sdk_forms_matches_the_server_body(line: str) -> None:
    status, payload = parse_error_payload(line)
    assert status == 401 and error_matches(payload, BODY)


def test_lab_04_02_401_line_from_another_provider_does_not_match() -> None:
    _, payload = parse_error_payload("AuthenticationError: Error code: 401 - {'error': {'message': 'Incorrect API key'}}")
    assert not error_matches(payload, BODY)


def grade_file(name: str) -> dict[str, lab_04_02.CheckResult]:
    return {r.name: r for r in lab_04_02.grade(read_deliverable(REFERENCE / name))}


def test_lab_04_02_good_reference_passes_every_offline_check() -> None:
    results = grade_file("good.md")
    assert len(results) == 7 and all(r.passed for r in results.values()), results


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_lab_04_02_broken_reference_fails_exactly_the_expected_check(name: str) -> None:
    check, message = BROKEN[name]
    results = grade_file(name)
    assert [n for n, r in results.items() if r.passed is False] == [check]
    assert message in results[check].rationale and results[check].help


def test_lab_04_02_missing_section_skips_its_checks_instead_of_failing_them() -> None:
    results = grade_file("broken-missing-section.md")
    assert results["chat_mjs_lines"].passed is None and "chat.mjs section is missing" in results["chat_mjs_lines"].rationale


def test_lab_04_02_empty_template_fails_with_help() -> None:
    template = REFERENCE.parent / "lab-04-02.md"
    results = {r.name: r for r in lab_04_02.grade(read_deliverable(template))}
    assert results["sections_present"].passed is False and "empty section(s)" in results["sections_present"].rationale


def test_lab_04_02_made_up_cache_larger_than_prompt_fails() -> None:
    text = (REFERENCE / "good.md").read_text(encoding="utf-8").replace("cache_n=0", "cache_n=999")
    results = {r.name: r for r in lab_04_02.grade(parse_deliverable(text))}
    assert results["chat_py_numbers_agree"].passed is False and "cache_n=999" in results["chat_py_numbers_agree"].rationale


def test_lab_04_02_every_check_has_a_one_sentence_description() -> None:
    for check in lab_04_02.checks.checks:
        assert check.description.endswith(".") and check.description.count(". ") == 0, check.name
