"""Cohere Command R's calls: a JSON list of `tool_name`/`parameters` actions, between action tokens
(R7B) or after `Action:` in a fenced block (R+)."""

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


def _tool_name_items(raw: str, *, single_ok: bool) -> list[dict[str, Any]] | None:
    """Command R's JSON list of `{"tool_name", "parameters"}` actions (a lone object too when
    `single_ok`), or None when it is not one."""
    try:
        items = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if single_ok and not isinstance(items, list):
        items = [items]
    if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("tool_name"), str)
                                              for i in items):
        return None
    return items


class CommandR7bFormat(CallFormat):
    name = "command-r7b"
    markers = ("<|START_ACTION|>",)
    _action = re.compile(r"<\|START_ACTION\|>(.*?)(?:<\|END_ACTION\|>|$)", re.DOTALL)

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        match = self._action.search(text)
        items = _tool_name_items(match.group(1), single_ok=True) if match else None
        if match is None or not items:
            return None
        content = text[:match.start()].replace("<|START_RESPONSE|>", "").replace("<|END_RESPONSE|>", "")
        return FoundCalls(content.strip(), [FoundCall(i["tool_name"], i.get("parameters", {}),
                                                      str(i["tool_call_id"]) if "tool_call_id" in i else None)
                                            for i in items])

    def render(self, calls: list[FoundCall]) -> str:
        listed = ",\n    ".join(json.dumps({"tool_call_id": str(n), "tool_name": c.name, "parameters": c.arguments},
                                           ensure_ascii=False) for n, c in enumerate(calls))
        return f"<|START_ACTION|>[\n    {listed}\n]<|END_ACTION|>"

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        opening = gbnf_literal('{"tool_call_id": "')
        middle = gbnf_literal(f'", "tool_name": {json.dumps(tool_function(tool)["name"])}, "parameters": ')
        return f'{opening} [0-9]+ {middle} {builder.schema(tool_parameters(tool))} "}}"'

    def calls_rule(self, one: str, parallel: bool) -> str:
        more = f' ( ",\\n    " {one} )*' if parallel else ""
        return f'"<|START_ACTION|>[\\n    " {one}{more} "\\n]<|END_ACTION|>"'


class CommandRPlusFormat(CallFormat):
    """Command R+ (tool_use template): `Action:` and a fenced JSON list of `tool_name`/`parameters`;
    its `directly-answer` action means no call."""

    name = "command-r-plus"
    markers = ("Action:",)
    _action = re.compile(r"Action:\s*(?:```(?:json)?)?\s*(\[.*?\])\s*(?:```|$)", re.DOTALL)

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        match = self._action.search(text)
        items = _tool_name_items(match.group(1), single_ok=False) if match else None
        if match is None or items is None:
            return None
        calls = [FoundCall(i["tool_name"], i.get("parameters", {})) for i in items
                 if i["tool_name"] != "directly-answer"]
        return FoundCalls(text[:match.start()].strip(), calls) if calls else None

    def render(self, calls: list[FoundCall]) -> str:
        listed = ",\n    ".join(json.dumps({"tool_name": call.name, "parameters": call.arguments}, ensure_ascii=False)
                                for call in calls)
        return f"Action:\n```json\n[\n    {listed}\n]```"

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        head = gbnf_literal(f'{{"tool_name": {json.dumps(tool_function(tool)["name"])}, "parameters": ')
        return f'{head} {builder.schema(tool_parameters(tool))} "}}"'

    def calls_rule(self, one: str, parallel: bool) -> str:
        opening, closing = gbnf_literal("Action:\n```json\n[\n    "), gbnf_literal("\n]```")
        more = f' ( ",\\n    " {one} )*' if parallel else ""
        return f"{opening} {one}{more} {closing}"
