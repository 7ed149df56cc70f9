"""The grader's own JSON-schema check (no jsonschema in the base install) and the ledger's record of
the tool calls a server made."""

from __future__ import annotations

import pytest

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
