"""What constrains a chat answer: `grammar`, `json_schema`, `response_format` and forced tool calls.

Each is turned into one GBNF grammar (or none), and the tool plan tells the outward translation
whether to read the answer as a forced call, to look for the model's own call syntax, or neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from kinetic.engine.llama import grammar_from_json_schema
from kinetic.engine.toolcalls import tool_call_schema
from kinetic.errors import InvalidRequestError, field_error
from kinetic.protocols.openai.types import ChatCompletionRequest

ToolMode = Literal["forced", "auto", "none"]
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# json_object without a schema accepts any JSON value, as llama.cpp does (issue 3, seed 000).
# A JSON schema cannot say that to llama.cpp's converter ({} becomes "any object"), so this
# sentinel stands for it and gets its own grammar.
ANY_VALUE: dict[str, Any] = {}


@dataclass(frozen=True)
class ChatConstraints:
    grammar: str | None
    tool_mode: ToolMode
    tools: list[dict[str, Any]] | None  # what the template lists (None: no tools rendered)
    tool_names: list[str] = field(default_factory=list)


MAX_ENUMERATED_RANGE = 256


def bounded_integers(schema: Any) -> Any:
    """The schema with each small bounded integer range written as an enum.

    llama-cpp-python's schema converter ignores minimum/maximum, so a Pydantic `Field(ge=0, le=99)`
    would not be enforced; an enum of the allowed values is. Wider ranges are left as they are."""
    if isinstance(schema, list):
        return [bounded_integers(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: bounded_integers(value) for key, value in schema.items()}
    if out.get("type") == "integer" and "enum" not in out:
        low = out.get("minimum", None)
        high = out.get("maximum", None)
        if isinstance(out.get("exclusiveMinimum"), (int, float)) and not isinstance(out["exclusiveMinimum"], bool):
            low = math.floor(out["exclusiveMinimum"]) + 1
        if isinstance(out.get("exclusiveMaximum"), (int, float)) and not isinstance(out["exclusiveMaximum"], bool):
            high = math.ceil(out["exclusiveMaximum"]) - 1
        if isinstance(low, (int, float)) and isinstance(high, (int, float)) and 0 <= high - low < MAX_ENUMERATED_RANGE:
            return {"enum": list(range(math.ceil(low), math.floor(high) + 1))}
    return out


def any_value_grammar() -> str:
    """The converter's grammar for {} with its root widened from an object to any value."""
    rules = grammar_from_json_schema({}).splitlines()
    return "\n".join("root ::= value" if rule.startswith("root ::=") else rule for rule in rules)


def schema_grammar(schema: Any, param: str) -> str:
    if schema is ANY_VALUE:
        return any_value_grammar()
    try:
        return grammar_from_json_schema(bounded_integers(schema))
    except ValueError as exc:
        raise field_error(param, f"invalid JSON schema: {exc}") from exc


def response_schema(req: ChatCompletionRequest) -> tuple[dict[str, Any] | None, str]:
    """The schema the answer must follow, and the field that asked for it (for error messages).

    `response_format` wins over the top-level `json_schema`, except that a schema-less json_object
    keeps the top-level schema (llama-server's rule)."""
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return (req.json_schema, "json_schema") if req.json_schema is not None else (None, "")
    if fmt.type == "json_object":
        if fmt.schema_ is not None:
            return fmt.schema_, "response_format.schema"
        if req.json_schema is not None:
            return req.json_schema, "json_schema"
        return ANY_VALUE, "response_format"
    if fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None:  # some clients put the schema at the top of response_format
            return (fmt.schema_ if fmt.schema_ is not None else ANY_OBJECT), "response_format.schema"
        if not isinstance(spec, dict):
            raise field_error("response_format.json_schema", "must be an object")
        schema = spec.get("schema", ANY_OBJECT)
        if not isinstance(schema, dict):
            raise field_error("response_format.json_schema.schema",
                              f"invalid JSON schema: must be an object, but got {type(schema).__name__}")
        return schema, "response_format.json_schema.schema"
    names = ", ".join(f'"{t}"' for t in RESPONSE_FORMAT_TYPES)
    raise InvalidRequestError(f"response_format type must be one of {names}, but got: {fmt.type}",
                              param="response_format.type")


def _tool_plan(req: ChatCompletionRequest) -> tuple[ToolMode, str | None]:
    """The tool mode and, for a named choice, the function it names."""
    choice = req.tool_choice
    if choice == "none":
        return "none", None
    if choice in (None, "auto"):
        return ("auto" if req.tools else "none"), None
    if not req.tools:
        raise field_error("tool_choice", "a tool must be called, but the request has no tools")
    if choice == "required":
        return "forced", None
    name = choice.function.name  # type: ignore[union-attr]
    if name not in {t.function.name for t in req.tools}:
        raise field_error("tool_choice", f"names the function {name!r}, which is not in tools")
    return "forced", name


def chat_constraints(req: ChatCompletionRequest) -> ChatConstraints:
    mode, only = _tool_plan(req)
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    names = [t.function.name for t in req.tools] if req.tools else []
    if mode != "none" and req.grammar:
        raise InvalidRequestError("Cannot use custom grammar constraints with tools.", param="grammar")
    if mode == "forced":
        # Only an explicit true allows several calls: a small model given an array tends to go on
        # listing calls, and templates without parallel-call support never expect more than one.
        schema = tool_call_schema(tools or [], only=only, parallel=req.parallel_tool_calls is True)
        return ChatConstraints(schema_grammar(schema, "tools"), mode, tools, names)
    schema, param = response_schema(req)
    if schema is not None and req.grammar:
        raise InvalidRequestError("Cannot use both json_schema and grammar", param=param)
    grammar = schema_grammar(schema, param) if schema is not None else req.grammar
    # tool_choice "none": the model is not told about tools it may not call.
    return ChatConstraints(grammar, mode, tools if mode == "auto" else None, names if mode == "auto" else [])
