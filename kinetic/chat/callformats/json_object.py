"""Calls written as one JSON object each: Hermes (`<tool_call>` blocks) and Llama 3.x (`<|python_tag|>`)."""

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


class JsonObjectFormat(CallFormat):
    """Calls as one JSON object each, `{"name": NAME, KEY: {...}}`, inside markers of the family."""

    arguments_key = "arguments"
    before = ""
    after = ""

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        name = json.dumps(tool_function(tool)["name"])
        head = gbnf_literal(f'{self.before}{{"name": {name}, "{self.arguments_key}": ')
        return f'{head} {builder.schema(tool_parameters(tool))} {gbnf_literal("}" + self.after)}'

    def render(self, calls: list[FoundCall]) -> str:
        return "\n".join(self.before + json.dumps({"name": c.name, self.arguments_key: c.arguments},
                                                  ensure_ascii=False) + self.after for c in calls)


class HermesFormat(JsonObjectFormat):
    name = "hermes"
    markers = ("<tool_call>",)
    before = "<tool_call>\n"
    after = "\n</tool_call>"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        if "<tool_call>" not in text:
            return None
        calls = []
        for match in self._block.finditer(text):
            try:
                obj = json.loads(match.group(1))
            except json.JSONDecodeError:
                return None
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return None
            calls.append(FoundCall(obj["name"], obj.get("arguments", obj.get("parameters", {}))))
        return FoundCalls(self._block.sub("", text).strip(), calls)


class Llama3Format(JsonObjectFormat):
    name = "llama3"
    markers = ("<|python_tag|>",)
    arguments_key = "parameters"

    def calls_rule(self, one: str, parallel: bool) -> str:
        return one  # Llama 3.x templates describe one call a turn

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        start = text.find("<|python_tag|>")
        content, body = (text[:start], text[start + len("<|python_tag|>"):]) if start >= 0 else ("", text)
        body = body.replace("<|eom_id|>", "").replace("<|eot_id|>", "").strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in parameters:
            return None  # a bare JSON answer is only a call when it names a tool
        return FoundCalls(content.strip(), [FoundCall(obj["name"], obj.get("parameters", obj.get("arguments", {})))])
