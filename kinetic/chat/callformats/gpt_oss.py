"""GPT-OSS's harmony channels: a call is a commentary message addressed to functions.NAME."""

from __future__ import annotations

import json
import re
from typing import Any

from kinetic.chat.callformats.base import (
    CallFormat,
    FoundCall,
    FoundCalls,
    ParameterSchemas,
    arguments_object,
    tool_function,
    tool_parameters,
)
from kinetic.chat.callformats.gbnf import GrammarBuilder, gbnf_literal


class GptOssFormat(CallFormat):
    """GPT-OSS's harmony channels: a call is a commentary message addressed to functions.NAME."""

    name = "gpt-oss"
    markers = ("<|channel|>commentary to=", " to=functions.")
    # the recipient comes after the channel name, or (as the template writes past calls) before it
    _call = re.compile(r"(?:\s*to=functions\.(?P<before>[^\s<]+))?\s*<\|channel\|>commentary"
                       r"(?:\s+to=functions\.(?P<after>[^\s<]+))?\s*(?:<\|constrain\|>)?\s*(?:json)?\s*"
                       r"<\|message\|>(?P<arguments>.*?)(?:<\|call\|>|<\|end\|>|$)", re.DOTALL)
    _final = re.compile(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", re.DOTALL)

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        calls = [FoundCall(m.group("before") or m.group("after"), arguments_object(m.group("arguments").strip()))
                 for m in self._call.finditer(text) if m.group("before") or m.group("after")]
        if not calls:
            return None
        final = self._final.search(text)
        return FoundCalls(final.group(1).strip() if final else "", calls)

    def render(self, calls: list[FoundCall]) -> str:
        return "".join(f"<|channel|>commentary to=functions.{c.name} <|constrain|>json<|message|>"
                       f"{json.dumps(c.arguments, ensure_ascii=False)}<|call|>" for c in calls)

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        head = f"<|channel|>commentary to=functions.{tool_function(tool)['name']} <|constrain|>json<|message|>"
        return f"{gbnf_literal(head)} {builder.schema(tool_parameters(tool))}"

    def calls_rule(self, one: str, parallel: bool) -> str:
        return one  # the call token ends the turn: one call a turn
