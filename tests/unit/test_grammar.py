"""JSON schema -> GBNF (kinetic.engine.grammar), with no model."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kinetic.engine.grammar import ConverterChanged, check_converter_source, grammar_from_json_schema


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


def test_the_converter_patch_still_applies_to_the_installed_converter() -> None:
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.submodule_search_locations
    source = (Path(next(iter(spec.submodule_search_locations))) / "llama_grammar.py").read_text(encoding="utf-8")
    check_converter_source(source)  # raises when it does not


def test_a_changed_converter_fails_loudly_at_import(tmp_path: Path) -> None:
    """A llama-cpp-python whose converter writes another `char` rule stops `import kinetic.engine.grammar`."""
    # the rule as a fixed converter might write it: control characters already excluded
    fixed = ('    "char": BuiltinRule(\n        r\'[^"\\\\\\x7F\\x00-\\x1F] | "\\\\" (["\\\\/bfnrt])\',\n'
             '        [],\n    ),\n')
    with pytest.raises(ConverterChanged, match="no longer writes the string character rule"):
        check_converter_source(fixed)
    package = tmp_path / "llama_cpp"  # a stand-in llama-cpp-python, found before the installed one
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "llama_grammar.py").write_text(f"PRIMITIVE_RULES = {{\n{fixed}}}\n")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", "import kinetic.engine.grammar"], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{root}"})
    assert result.returncode == 1
    assert "ConverterChanged: llama-cpp-python's JSON-schema converter" in result.stderr
