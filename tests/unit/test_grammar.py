"""JSON schema -> GBNF (kinetic.engine.grammar), with no model."""

from __future__ import annotations

from kinetic.engine.grammar import grammar_from_json_schema


def test_strings_hold_no_raw_control_characters() -> None:
    # llama-cpp-python's converter allowed a raw newline inside a string, which json.loads refuses
    for schema in ({"type": "string"}, {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}}):
        (char,) = [line for line in grammar_from_json_schema(schema).splitlines() if line.startswith("char ::=")]
        assert char.startswith(r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (')


def test_properties_keep_their_order_in_the_grammar() -> None:
    """A forced call names its function before its arguments: the schema's order is the output's."""
    from kinetic.engine.grammar import grammar_from_json_schema

    grammar = grammar_from_json_schema({"type": "object", "properties": {"name": {"const": "f"}, "arguments": {
        "type": "object"}}, "required": ["name", "arguments"]})
    root = next(line for line in grammar.splitlines() if line.startswith("root ::="))
    assert root.index("name") < root.index("arguments")
