"""JSON schema -> GBNF, the constraint language every GenerationRequest carries.

llama-cpp-python's converter is pure Python but lives inside the llama_cpp package, whose import
loads the native library: it is imported on first use, so that protocols, the chat layer and the
grader stay importable without llama.cpp.
"""

from __future__ import annotations

import json
from typing import Any


def grammar_from_json_schema(schema: Any) -> str:
    """GBNF text accepting exactly the JSON documents `schema` allows (llama.cpp's converter).

    Raises ValueError with the converter's reason when the schema is not one it understands."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # heavy: loads libllama

    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema must be an object, but got {type(schema).__name__}")
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except RecursionError as exc:
        raise ValueError("the schema nests too deeply") from exc
    except (AssertionError, AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:
        # The converter reports bad schemas with asserts and incidental errors alike.
        raise ValueError(str(exc) or type(exc).__name__) from exc
