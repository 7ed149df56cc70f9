"""What constrains an answer, compiled to one GBNF grammar: a grammar, a JSON schema, any JSON
value, or a forced tool call; and the tool plan that tells the outward translation whether to
read the answer as a forced call, to look for the model's own call syntax, or neither.

Compiling a schema is CPU work: the chat layer calls these from a worker thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kinetic.chat.callformats import FORMATS
from kinetic.chat.callformats.detect import JSON
from kinetic.chat.toolcalls import tool_call_schema
from kinetic.chat.types import ChatRequest, OutputConstraint, ToolMode
from kinetic.engine.grammar import grammar_from_json_schema
from kinetic.errors import InvalidRequestError, field_error

MAX_ENUMERATED_RANGE = 256


@dataclass(frozen=True)
class ChatConstraints:
    grammar: str | None
    tool_mode: ToolMode
    tools: list[dict[str, Any]] | None  # what the template lists (None: no tools rendered)
    tool_names: tuple[str, ...] = ()
    call_format: str = JSON


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
    """The converter's grammar for {} with its root widened from an object to any value.

    "Any JSON value" (json_object without a schema, as llama.cpp allows) cannot be said to the
    converter as a schema: {} means any object to it."""
    rules = grammar_from_json_schema({}).splitlines()
    return "\n".join("root ::= value" if rule.startswith("root ::=") else rule for rule in rules)


def schema_grammar(schema: Any, param: str) -> str:
    try:
        return grammar_from_json_schema(bounded_integers(schema))
    except ValueError as exc:
        raise field_error(param, f"invalid JSON schema: {exc}") from exc


def output_grammar(output: OutputConstraint) -> str | None:
    """The grammar of a grammar, schema or any-JSON constraint (None: unconstrained)."""
    given = [kind for kind, value in (("grammar", output.grammar), ("json_schema", output.schema))
             if value is not None]
    if output.any_json:
        given.append("json_object")
    if len(given) > 1:
        raise InvalidRequestError("Cannot use both json_schema and grammar", param=output.param or given[0])
    if output.grammar is not None:
        return output.grammar
    if output.schema is not None:
        return schema_grammar(output.schema, output.param or "json_schema")
    if output.any_json:
        return any_value_grammar()
    return None


def tool_plan(req: ChatRequest) -> tuple[ToolMode, str | None]:
    """The tool mode and, for a named choice, the function it names. Pure: validates only."""
    choice = req.tool_choice
    if choice.mode == "none":
        return "none", None
    if choice.mode == "auto":
        return ("auto" if req.tools else "none"), None
    if not req.tools:
        raise field_error("tool_choice", "a tool must be called, but the request has no tools")
    if choice.name is not None and choice.name not in {tool.name for tool in req.tools}:
        raise field_error("tool_choice", f"names the function {choice.name!r}, which is not in tools")
    return "forced", choice.name


def template_tools(req: ChatRequest) -> list[dict[str, Any]]:
    """Tools the way chat templates expect them (the Hugging Face convention)."""
    tools = []
    for tool in req.tools:
        function: dict[str, Any] = {"name": tool.name, **tool.extra}
        if tool.description is not None:
            function["description"] = tool.description
        if tool.parameters is not None:
            function["parameters"] = tool.parameters
        tools.append({"type": "function", "function": function})
    return tools


def forced_call_grammar(tools: list[dict[str, Any]], call_format: str, *, only: str | None,
                        parallel: bool) -> str:
    """The grammar of a forced call in the template's own format (kinetic's JSON shape when the
    template names none), so the model writes the shape it was trained on."""
    if call_format in FORMATS:
        return FORMATS[call_format].grammar(tools, lambda schema: schema_grammar(schema, "tools"),
                                            only=only, parallel=parallel)
    return schema_grammar(tool_call_schema(tools, only=only, parallel=parallel), "tools")


def chat_constraints(req: ChatRequest, call_format: str = JSON) -> ChatConstraints:
    mode, only = tool_plan(req)
    if mode != "none" and req.output.grammar is not None:
        raise InvalidRequestError("Cannot use custom grammar constraints with tools.", param="grammar")
    tools = template_tools(req)
    names = tuple(tool.name for tool in req.tools)
    if mode == "forced":
        # Only an explicit true allows several calls: a small model given an array tends to go on
        # listing calls, and templates without parallel-call support never expect more than one.
        grammar = forced_call_grammar(tools, call_format, only=only, parallel=req.parallel_tool_calls)
        return ChatConstraints(grammar, mode, tools, names, call_format)
    # tool_choice "none": the model is not told about tools it may not call.
    if mode == "auto":
        return ChatConstraints(output_grammar(req.output), mode, tools, names, call_format)
    return ChatConstraints(output_grammar(req.output), mode, None, ())
