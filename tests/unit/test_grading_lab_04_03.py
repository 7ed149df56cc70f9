"""Lab 04-03's rules without a model: the schema it checks is structured.py's, every writing style of
the reference set passes, each broken reference fails exactly its check, and the ledger checks on
records (the tool call id, the answer against the schema sent, a ledger without the text)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

from kinetic.grading.cli import grade_file
from kinetic.grading.labs import find_lab_folder, load_lab
from kinetic.grading.ledger_view import LedgerView

LAB_DIR = Path(__file__).resolve().parents[2] / "labs" / "lab-04-03-structured-output"
REFERENCE = LAB_DIR / "reference"
LAB = load_lab(str(LAB_DIR))
RULES = sys.modules["kinetic_lab_lab_04_03_structured_output"]
GOOD = sorted(REFERENCE.glob("good*.md"))
BROKEN = {
    "broken-missing-section.md": ("outputs_present", "tools.py --auto's"),
    "broken-schema.md": ("schema_answer_valid", "breaks maximum 20"),
    "broken-tool-call-id.md": ("tool_round_trip", "but the call's id is"),
    "broken-grammar.md": ("grammar_answer", "is not what the grammar allows"),
    "broken-numbers.md": ("runs_agree", "but the whole request took 0.1s"),
    "broken-answer.md": ("answer_explains", "does not mention tool_calls"),
    "broken-readme-copy.md": ("numbers_not_from_examples", "exactly the example of README.md"),
}


def statuses(path: Path, ledger: LedgerView | None = None) -> dict[str, tuple[str, str]]:
    report = grade_file(LAB, path, None, ledger)
    return {r.name: (r.status, r.rationale + r.note) for r in report.results}


def without_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: without_titles(v) for k, v in schema.items() if k != "title"}
    return schema


def test_lab_found_by_id() -> None:
    assert find_lab_folder("lab-04-03") == LAB_DIR and LAB.id == "lab-04-03"


def test_the_checked_schemas_are_the_scripts() -> None:
    from openai.lib._pydantic import to_strict_json_schema

    structured = runpy.run_path(str(LAB_DIR / "structured.py"), run_name="lab")  # not "__main__": nothing is sent
    assert without_titles(to_strict_json_schema(structured["Citta"])) == RULES.CITTA_SCHEMA
    tools = runpy.run_path(str(LAB_DIR / "tools.py"), run_name="lab")
    (tool,) = tools["TOOLS"]
    assert tool["function"]["name"] == RULES.TOOL_NAME and tool["function"]["parameters"] == RULES.TOOL_PARAMETERS
    grammar = json.loads((LAB_DIR / "grammar.json").read_text(encoding="utf-8"))["grammar"]
    for day in ("lunedì", "martedì", "mercoledì", "giovedì", "venerdì", "sabato", "domenica"):
        assert f'"{day}"' in grammar
    assert RULES.GRAMMAR_ANSWER.fullmatch("domenica alle 23:59")
    assert not RULES.GRAMMAR_ANSWER.fullmatch("lunedì alle 24:00")


def test_reference_set_is_complete() -> None:
    assert {p.name for p in REFERENCE.glob("*.md")} >= {"good.md", "README.md", *BROKEN}
    assert len(GOOD) == 3


@pytest.mark.parametrize("path", GOOD, ids=[p.stem for p in GOOD])
def test_every_writing_style_is_read_right_and_passes(path: Path) -> None:
    from kinetic.grading.deliverable import read_deliverable

    found = RULES.parse_outputs(read_deliverable(path))
    assert len(found.schema) == 1 and found.schema[0][0] is not None and len(found.json_object) == 1
    assert len(found.round_trips) == 1 and found.round_trips[0][2] is not None and len(found.auto) == 1
    assert len(found.grammar) == 1 and len(found.errors) == 1 and found.answer
    assert len(found.runs) == 5
    failed = {name: s for name, s in statuses(path).items() if s[0] not in ("pass",) and name != "stream_tool_call"}
    assert failed == {}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_reference_fails_exactly_its_check(name: str) -> None:
    check, fragment = BROKEN[name]
    failed = {n: s for n, s in statuses(REFERENCE / name).items() if s[0] == "fail"}
    assert list(failed) == [check], failed
    assert fragment in failed[check][1]


def ledger_for(path: Path, *, content: bool = True, call_ids: bool = True) -> LedgerView:
    """The records a class server would have written for the runs of a good deliverable."""
    from kinetic.grading.deliverable import read_deliverable

    found = RULES.parse_outputs(read_deliverable(path))
    records = []
    for run in found.runs:
        record = {"client": "alice", "route": "/v1/chat/completions", "status": 200, "id": run.id, "stream": False,
                  "prompt_tokens": run.prompt, "completion_tokens": run.completion, "duration_s": run.seconds / 2,
                  "finish_reason": run.finish_reason, "timings": {"cache_n": run.cache_n,
                                                                  "prompt_per_second": run.prompt_tps,
                                                                  "predicted_per_second": run.generation_tps}}
        if call_ids and run.calls:
            record["tool_calls"] = [{"id": c[0], "name": c[1]} for c in run.calls]
        if content:
            record["request"], record["answer"] = {"messages": []}, ""
        records.append(record)
    value, schema_run = found.schema[0]
    first, sent, answer = found.round_trips[0]
    for record in records:
        if content and record["id"] == schema_run.id:
            record["answer"] = json.dumps(value)
            record["request"] = {"response_format": {"type": "json_schema",
                                                     "json_schema": {"name": "Citta", "schema": RULES.CITTA_SCHEMA}}}
        if content and record["id"] == answer.id:
            record["request"] = {"messages": [{"role": "tool", "tool_call_id": sent, "content": "{}"}]}
    grammar = found.grammar[0]
    records.append({"client": "alice", "route": "/completion", "status": 200, "timings": grammar["timings"]})
    records.append({"client": "alice", "route": "/v1/chat/completions", "status": 400,
                    "error": {"type": "invalid_request_error", "message": found.errors[0][2]}})
    return LedgerView(records, ["alice"])


def test_ledger_checks_pass_on_the_matching_records(tmp_path: Path) -> None:
    good = tmp_path / "alice.md"
    good.write_text((REFERENCE / "good.md").read_text(encoding="utf-8"), encoding="utf-8")
    results = statuses(good, ledger_for(good))
    assert all(results[name][0] == "pass" for name in ("runs_in_ledger", "schema_answer_in_ledger",
                                                       "tool_call_in_ledger", "grammar_in_ledger",
                                                       "error_400_in_ledger")), results


def test_a_wrong_id_sent_back_fails_and_missing_text_is_could_not_check(tmp_path: Path) -> None:
    good = tmp_path / "alice.md"
    good.write_text((REFERENCE / "good.md").read_text(encoding="utf-8"), encoding="utf-8")
    view = ledger_for(good)
    for record in view.records:
        for message in (record.request or {}).get("messages", []):
            message["tool_call_id"] = "someone-else"
    assert "not for" in statuses(good, view)["tool_call_in_ledger"][1]
    bare = statuses(good, ledger_for(good, content=False))
    assert bare["schema_answer_in_ledger"][0] == "unchecked"
    assert "--ledger-content" in bare["schema_answer_in_ledger"][1]
    old = statuses(good, ledger_for(good, call_ids=False))
    assert old["tool_call_in_ledger"][0] == "unchecked"
    assert "does not record tool calls" in old["tool_call_in_ledger"][1]
