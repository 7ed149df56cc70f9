"""Mistral's calls after `[TOOL_CALLS]`: a JSON list with 9-character ids (Nemo and older), or
`NAME[ARGS]{...}` for each call (Small 3.2, Devstral, Ministral)."""

from __future__ import annotations

import json
import re
from typing import Any

from kinetic.chat.callformats.base import (
    CallFormat,
    FoundCall,
    FoundCalls,
    ParameterSchemas,
    tool_function,
    tool_parameters,
)
from kinetic.chat.callformats.gbnf import GrammarBuilder, gbnf_literal


class MistralFormat(CallFormat):
    """Mistral Nemo and older: one JSON list of calls, each with a 9-character id."""

    name = "mistral"
    markers = ("[TOOL_CALLS]",)

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        start = text.find("[TOOL_CALLS]")
        if start < 0:
            return None
        try:
            value, _ = json.JSONDecoder().raw_decode(text[start + len("[TOOL_CALLS]"):].lstrip())
        except json.JSONDecodeError:
            return None
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(i, dict) and isinstance(i.get("name"), str) for i in items):
            return None
        return FoundCalls(text[:start].strip(), [
            FoundCall(i["name"], i.get("arguments", {}), i["id"] if isinstance(i.get("id"), str) else None)
            for i in items])

    def render(self, calls: list[FoundCall]) -> str:
        return "[TOOL_CALLS]" + json.dumps([{"name": c.name, "arguments": c.arguments, "id": _nine(c.id, n)}
                                            for n, c in enumerate(calls)], ensure_ascii=False)

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        head = gbnf_literal(f'{{"name": {json.dumps(tool_function(tool)["name"])}, "arguments": ')
        return f'{head} {builder.schema(tool_parameters(tool))} ", \\"id\\": \\"" [a-zA-Z0-9]{{9}} "\\"}}"'

    def calls_rule(self, one: str, parallel: bool) -> str:
        more = f' ( ", " {one} )*' if parallel else ""
        return f'"[TOOL_CALLS][" {one}{more} "]"'


def _nine(call_id: str | None, index: int) -> str:
    """Mistral's call id: 9 letters and digits (the model's own, else one made from the call's place)."""
    if call_id and len(call_id) == 9 and call_id.isalnum():
        return call_id
    return f"call{index:05d}"


class MistralArgsFormat(CallFormat):
    """Mistral Small 3.2, Devstral, Ministral: `[TOOL_CALLS]NAME[ARGS]{...}` for each call."""

    name = "mistral-args"
    markers = ("[TOOL_CALLS]",)
    _head = re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z0-9_.\-]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]")

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        calls, end = [], None
        decoder = json.JSONDecoder()
        first = self._head.search(text)
        for match in self._head.finditer(text):
            try:
                arguments, end = decoder.raw_decode(text, match.end())
            except json.JSONDecodeError:
                return None
            calls.append(FoundCall(match.group(1), arguments, match.group(2)))
        if not calls or first is None:
            return None
        return FoundCalls(text[:first.start()].strip(), calls)

    def render(self, calls: list[FoundCall]) -> str:
        return "".join(f"[TOOL_CALLS]{call.name}[ARGS]{json.dumps(call.arguments, ensure_ascii=False)}"
                       for call in calls)

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        head = gbnf_literal("[TOOL_CALLS]" + tool_function(tool)["name"] + "[ARGS]")
        return f"{head} {builder.schema(tool_parameters(tool))}"

    def calls_rule(self, one: str, parallel: bool) -> str:
        return f"{one}+" if parallel else one
