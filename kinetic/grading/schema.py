"""Does a JSON value satisfy a JSON schema? The subset a lab's schema uses (pydantic's output, an
OpenAI tool's parameters), checked without a dependency: the grader's base install is httpx and
pydantic only. A keyword outside that subset raises `UnsupportedSchema`, so a check can say "could
not check" instead of guessing.
"""

from __future__ import annotations

from typing import Any

# Keywords that only annotate: they never make a value invalid.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$defs", "definitions",
                         "$comment", "strict", "name", "format", "deprecated", "readOnly", "writeOnly"})
TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                      "boolean": (bool,), "object": (dict,), "array": (list,), "null": (type(None),)}


class UnsupportedSchema(ValueError):
    """The schema uses a keyword this checker does not know."""


def schema_errors(value: Any, schema: Any, root: Any = None, where: str = "$") -> list[str]:
    """Every way `value` breaks `schema` (empty: it satisfies it), each naming where in the value."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return []
    if schema is False:
        return [f"{where}: no value is allowed here"]
    if not isinstance(schema, dict):
        raise UnsupportedSchema(f"a schema must be an object, not {type(schema).__name__}")
    unknown = set(schema) - ANNOTATIONS - CHECKED
    if unknown:
        raise UnsupportedSchema(f"keywords not checked here: {', '.join(sorted(unknown))}")
    errors: list[str] = []
    if "$ref" in schema:
        errors += schema_errors(value, _resolve(schema["$ref"], root), root, where)
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(value, name) for name in names):
            return errors + [f"{where}: expected {' or '.join(map(str, names))}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{where}: {value!r} is not one of {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{where}: {value!r} is not {schema['const']!r}")
    for combined in ("allOf", "anyOf", "oneOf"):
        if combined in schema:
            failures = [schema_errors(value, sub, root, where) for sub in schema[combined]]
            passed = sum(not f for f in failures)
            if combined == "allOf" and passed < len(failures):
                errors += [e for f in failures for e in f]
            elif combined == "anyOf" and not passed or combined == "oneOf" and passed != 1:
                errors.append(f"{where}: matches {passed} of the {combined} alternatives")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            errors.append(f"{where}: {len(value)} characters, outside minLength/maxLength")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, ok in (("minimum", lambda b: value >= b), ("maximum", lambda b: value <= b),
                        ("exclusiveMinimum", lambda b: value > b), ("exclusiveMaximum", lambda b: value < b)):
            if key in schema and not ok(schema[key]):
                errors.append(f"{where}: {value} breaks {key} {schema[key]}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [f"{where}: the required {name!r} is missing" for name in schema.get("required", [])
                   if name not in value]
        for name, item in value.items():
            if name in properties:
                errors += schema_errors(item, properties[name], root, f"{where}.{name}")
            elif "additionalProperties" in schema:
                errors += schema_errors(item, schema["additionalProperties"], root, f"{where}.{name}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{where}: {len(value)} items, outside minItems/maxItems")
        if "items" in schema:
            for index, item in enumerate(value):
                errors += schema_errors(item, schema["items"], root, f"{where}[{index}]")
    return errors


CHECKED = frozenset({"$ref", "type", "enum", "const", "allOf", "anyOf", "oneOf", "minLength", "maxLength", "minimum",
                     "maximum", "exclusiveMinimum", "exclusiveMaximum", "properties", "required",
                     "additionalProperties", "items", "minItems", "maxItems"})


def _is(value: Any, name: str) -> bool:
    if name not in TYPES:
        raise UnsupportedSchema(f"unknown type {name!r}")
    if isinstance(value, bool) and name in ("integer", "number"):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, TYPES[name])


def _resolve(ref: Any, root: Any) -> Any:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise UnsupportedSchema(f"only local references (#/...) are followed, not {ref!r}")
    node = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            raise UnsupportedSchema(f"the reference {ref} leads nowhere")
        node = node[part]
    return node
