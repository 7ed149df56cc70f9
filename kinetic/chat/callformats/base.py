"""What every call format shares: the calls found in a text, the parts of a tool's schema a format
writes, and the CallFormat interface (parse, render, grammar)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kinetic.chat.callformats.gbnf import GrammarBuilder, SchemaCompiler

ParameterSchemas = dict[str, dict[str, Any]]  # tool name -> its parameters schema


@dataclass(frozen=True)
class FoundCall:
    name: str
    arguments: Any  # an object (or, when the model wrote something else, its text)
    id: str | None = None


@dataclass(frozen=True)
class FoundCalls:
    content: str  # the text around the calls
    calls: list[FoundCall]


def tool_function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool)


def tool_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return tool_function(tool).get("parameters") or {"type": "object"}


def tool_properties(tool: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """(name, schema, required) of each parameter; each schema carries the definitions its `$ref`s
    may point to, since it is compiled on its own."""
    parameters = tool_parameters(tool)
    required = set(parameters.get("required") or ())
    definitions: dict[str, Any] = {key: parameters[key] for key in ("$defs", "definitions") if key in parameters}
    return [(name, {**schema, **definitions} if isinstance(schema, dict) else {}, name in required)
            for name, schema in (parameters.get("properties") or {}).items()]


def value_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a property schema allows (empty: any)."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            found: set[str] = set()
            for option in schema[key]:
                types = value_types(option) if isinstance(option, dict) else set()
                if not types:
                    return set()
                found |= types
            return found
    values = schema["enum"] if isinstance(schema.get("enum"), list) else (
        [schema["const"]] if "const" in schema else None)
    if values is not None:
        return {"string" if isinstance(v, str) else "object" if isinstance(v, dict) else "other" for v in values}
    return set()


def arguments_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class CallFormat:
    """One family's call syntax. Subclasses say how one call and a list of calls are written."""

    name = "json"
    markers: tuple[str, ...] = ()  # texts that open a call: what precedes them is content
    ends_reasoning: tuple[str, ...] = ()  # texts that close an open think block as well as </think>

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        raise NotImplementedError

    def render(self, calls: list[FoundCall]) -> str:
        raise NotImplementedError

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        raise NotImplementedError

    def calls_rule(self, one: str, parallel: bool) -> str:
        return f'{one} ( "\\n" {one} )*' if parallel else one

    def grammar(self, tools: list[dict[str, Any]], compile_schema: SchemaCompiler, *, only: str | None = None,
                parallel: bool = False) -> str:
        """GBNF whose texts are exactly the allowed calls in this format: one call of any tool (or of
        the tool named `only`), and with `parallel` one or more."""
        chosen = [t for t in tools if tool_function(t).get("name") == only] if only else list(tools)
        if not chosen:
            raise ValueError(f"no tool named {only!r}" if only else "no tools to call")
        builder = GrammarBuilder(compile_schema)
        calls = [builder.rule(f"call-{index}", self.call_rule(builder, tool, index))
                 for index, tool in enumerate(chosen)]
        one = builder.rule("call", " | ".join(calls))
        return builder.build(self.calls_rule(one, parallel))
