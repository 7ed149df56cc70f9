"""The grader's own JSON-schema check (no jsonschema in the base install) and the ledger's record of
the tool calls a server made."""

from __future__ import annotations

import pytest

from kinetic.classroom.ledger import absorb, tool_calls_of
from kinetic.grading.schema import UnsupportedSchema, schema_errors

CITTA = {"type": "object", "properties": {"nome": {"type": "string", "maxLength": 4},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 20},
                                          "mare": {"type": "boolean"}},
         "required": ["nome", "n", "mare"], "additionalProperties": False}


@pytest.mark.parametrize(("value", "fragment"), [
    ({"nome": "Roma", "n": 3, "mare": False}, None),
    ({"nome": "Roma", "n": 3}, "the required 'mare' is missing"),
    ({"nome": "Genova", "n": 3, "mare": True}, "$.nome: 6 characters"),
    ({"nome": "Bari", "n": 21, "mare": True}, "$.n: 21 breaks maximum 20"),
    ({"nome": "Bari", "n": True, "mare": True}, "$.n: expected integer, got bool"),
    ({"nome": "Bari", "n": 2.0, "mare": True}, None),
    ({"nome": "Bari", "n": 2, "mare": True, "x": 1}, "$.x: no value is allowed here"),
    ([1], "expected object, got list"),
])
def test_values_against_a_pydantic_like_schema(value: object, fragment: str | None) -> None:
    errors = schema_errors(value, CITTA)
    assert (errors == []) if fragment is None else any(fragment in e for e in errors), errors


def test_refs_combinators_arrays_and_unknown_keywords() -> None:
    schema = {"$defs": {"Day": {"enum": ["lun", "mar"]}}, "type": "array", "items": {"$ref": "#/$defs/Day"},
              "maxItems": 2}
    assert schema_errors(["lun", "mar"], schema) == []
    assert schema_errors(["lun", "dom"], schema) == ["$[1]: 'dom' is not one of ['lun', 'mar']"]
    assert schema_errors([], {"anyOf": [{"type": "string"}, {"type": "null"}]}) == [
        "$: matches 0 of the anyOf alternatives"]
    with pytest.raises(UnsupportedSchema, match="pattern"):
        schema_errors("x", {"type": "string", "pattern": "^x$"})
    with pytest.raises(UnsupportedSchema, match="leads nowhere"):
        schema_errors("x", {"$ref": "#/$defs/Missing"})


def test_the_ledger_keeps_the_id_and_name_of_each_tool_call() -> None:
    body = {"id": "chatcmpl-1", "choices": [{"finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "AbC", "type": "function", "function": {"name": "meteo", "arguments": "{}"}}]}}]}
    record: dict = {}
    absorb(record, body)
    assert record["tool_calls"] == [{"id": "AbC", "name": "meteo"}] and record["finish_reason"] == "tool_calls"
    # a stream: the first piece of a call carries its id, the later ones only arguments
    first = {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "XyZ", "function": {"name": "meteo"}}]}}]}
    later = {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"c"}}]}}]}
    streamed: dict = {}
    for frame in (first, later, later):
        absorb(streamed, frame)
    assert streamed["tool_calls"] == [{"id": "XyZ", "name": "meteo"}]
    assert tool_calls_of({"choices": [{"message": {"content": "hi"}}]}) == [] and tool_calls_of({}) == []
