"""LFM2 / LFM2.5's calls: a Python-style list of calls with keyword arguments between the tool-call tokens."""

from __future__ import annotations

import ast
import json
from typing import Any

from kinetic.chat.callformats.base import (
    CallFormat,
    FoundCall,
    FoundCalls,
    ParameterSchemas,
    tool_function,
    tool_properties,
)
from kinetic.chat.callformats.gbnf import GrammarBuilder, gbnf_literal


def python_literal(value: Any) -> str:
    """A value as LFM2 writes call arguments: Python literals, strings in double quotes."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "None"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {python_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _literal_value(node: ast.expr) -> Any:
    """A Python literal node's value, with JSON's true/false/null read as Python's (llama-server
    accepts both in LFM2 calls)."""
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    if isinstance(node, ast.List):
        return [_literal_value(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        pairs = zip(node.keys, node.values, strict=True)
        return {_literal_value(k): _literal_value(v) for k, v in pairs if k is not None}
    return ast.literal_eval(node)


class Lfm2Format(CallFormat):
    """LFM2 / LFM2.5: a Python-style list of calls between the tool-call tokens."""

    name = "lfm2"
    start, end = "<|tool_call_start|>", "<|tool_call_end|>"
    markers = (start,)

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        first = text.find(self.start)
        if first < 0:
            return None
        calls, rest, content = [], text[first:], [text[:first]]
        while rest.startswith(self.start):
            stop = rest.find(self.end)
            body = rest[len(self.start):stop if stop >= 0 else len(rest)]
            found = self.parse_list(body.strip())
            if found is None:
                return None
            calls += found
            rest = "" if stop < 0 else rest[stop + len(self.end):]
            next_start = rest.find(self.start)
            content.append(rest if next_start < 0 else rest[:next_start])
            rest = "" if next_start < 0 else rest[next_start:]
        return FoundCalls("".join(content).strip(), calls) if calls else None

    @staticmethod
    def parse_list(body: str) -> list[FoundCall] | None:
        try:
            tree = ast.parse(body if body.startswith("[") else f"[{body}]", mode="eval").body
        except SyntaxError:
            return None
        if not isinstance(tree, ast.List):
            return None
        calls = []
        for item in tree.elts:
            if not isinstance(item, ast.Call) or item.args:
                return None
            try:
                arguments = {kw.arg: _literal_value(kw.value) for kw in item.keywords if kw.arg}
            except (ValueError, TypeError):
                return None
            calls.append(FoundCall(ast.unparse(item.func), arguments))
        return calls

    def render(self, calls: list[FoundCall]) -> str:
        written = ", ".join(
            f"{c.name}(" + ", ".join(f"{k}={python_literal(v)}" for k, v in (
                c.arguments if isinstance(c.arguments, dict) else {}).items()) + ")" for c in calls)
        return f"{self.start}[{written}]{self.end}"

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        items = [(f'{gbnf_literal(name + "=")} {builder.schema(schema)}', required)
                 for name, schema, required in tool_properties(tool)]
        arguments = builder.sequence(f"call-{index}-args", items, ", ")
        return f'{gbnf_literal(tool_function(tool)["name"] + "(")} {arguments} ")"'

    def calls_rule(self, one: str, parallel: bool) -> str:
        more = f' ( ", " {one} )*' if parallel else ""
        return f'{gbnf_literal(self.start + "[")} {one}{more} {gbnf_literal("]" + self.end)}'
