"""JSON schema -> GBNF, the constraint language every GenerationRequest carries.

llama-cpp-python's converter is pure Python but lives inside the llama_cpp package, whose import
loads the native library: it is imported on first use, so that protocols, the chat layer and the
grader stay importable without llama.cpp.
"""

from __future__ import annotations

import functools
import json
from typing import Any

# llama-cpp-python's converter lets a JSON string hold raw control characters (a newline inside
# "..."), which no JSON parser accepts; llama.cpp's own converter (llama-server's) excludes them.
_LOOSE_CHAR = r'char ::= [^"\\] |'
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'


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
    return "\n".join(_JSON_CHAR + line[len(_LOOSE_CHAR):] if line.startswith(_LOOSE_CHAR) else line
                     for line in grammar.splitlines())
