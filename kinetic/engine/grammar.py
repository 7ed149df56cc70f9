"""JSON schema -> GBNF, the constraint language every GenerationRequest carries.

llama-cpp-python's converter is pure Python but lives inside the llama_cpp package, whose import
loads the native library: it is imported on first use, so that protocols, the chat layer and the
grader stay importable without llama.cpp.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

# llama-cpp-python's converter lets a JSON string hold raw control characters (a newline inside
# "..."), which no JSON parser accepts; llama.cpp's own converter (llama-server's) excludes them.
# The converter's `char` rule starts with _LOOSE_RULE; its grammars' `char` line is rewritten.
_LOOSE_RULE = r'[^"\\] |'
_LOOSE_CHAR = "char ::= " + _LOOSE_RULE
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'
# how the rule reads in the converter's source (llama_cpp/llama_grammar.py, PRIMITIVE_RULES)
_SOURCE_RULE = re.compile(r'"char":\s*BuiltinRule\(\s*r\'' + re.escape(_LOOSE_RULE))


class ConverterChanged(RuntimeError):
    """llama-cpp-python's converter no longer writes the `char` rule kinetic rewrites."""


def check_converter_source(source: str) -> None:
    """Raise ConverterChanged unless the converter's source still writes the rule the patch rewrites
    (an upgraded llama-cpp-python may have fixed it, or changed it so that the patch would not apply)."""
    if _SOURCE_RULE.search(source) is None:
        raise ConverterChanged(
            "llama-cpp-python's JSON-schema converter (llama_cpp/llama_grammar.py) no longer writes the string "
            f"character rule {_LOOSE_CHAR!r} that kinetic.engine.grammar rewrites to keep control characters "
            "out of JSON strings: check what it writes now and update or drop the patch")


def _converter_source() -> str | None:
    """The converter's source, found without importing llama_cpp (whose import loads libllama); None
    where llama-cpp-python is not installed (the grader alone), since then nothing converts."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return (Path(next(iter(spec.submodule_search_locations))) / "llama_grammar.py").read_text(encoding="utf-8")


_SOURCE = _converter_source()
if _SOURCE is not None:
    check_converter_source(_SOURCE)


def grammar_from_json_schema(schema: Any) -> str:
    """GBNF text accepting exactly the JSON documents `schema` allows (llama.cpp's converter).

    Raises ValueError with the converter's reason when the schema is not one it understands.
    A class sends the same lab schema thirty times: each distinct schema is converted once."""
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema must be an object, but got {type(schema).__name__}")
    return _convert(json.dumps(schema))  # key order matters: properties are generated in order


@functools.lru_cache(maxsize=256)
def _convert(schema_text: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # heavy: loads libllama

    try:
        grammar = json_schema_to_gbnf(schema_text)
    except RecursionError as exc:
        raise ValueError("the schema nests too deeply") from exc
    except (AssertionError, AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        # The converter reports bad schemas with asserts and incidental errors alike.
        raise ValueError(str(exc) or type(exc).__name__) from exc
    return strict_strings(grammar)


def strict_strings(grammar: str) -> str:
    """The converter's grammar with its `char` rule excluding control characters, as llama.cpp's does."""
    return "\n".join(_JSON_CHAR + line[len(_LOOSE_CHAR):] if line.startswith(_LOOSE_CHAR) else line
                     for line in grammar.splitlines())
