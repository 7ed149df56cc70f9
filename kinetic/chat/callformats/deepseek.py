"""DeepSeek's calls between its tool-call tokens: R1's fenced JSON, V3.1's bare JSON."""

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


class DeepSeekFormat(CallFormat):
    """DeepSeek R1 (`function<｜tool▁sep｜>NAME` and a fenced JSON block) and V3.1
    (`NAME<｜tool▁sep｜>{...}`)."""

    calls_begin, calls_end = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
    call_begin, sep, call_end = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
    markers = (calls_begin, call_begin)
    _call = re.compile("<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)(?:<｜tool▁call▁end｜>|$)", re.DOTALL)
    _fenced = re.compile(r"\s*([^\n`]+?)\s*\n```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)

    def __init__(self, fenced: bool):
        self.fenced = fenced
        self.name = "deepseek-r1" if fenced else "deepseek-v3"

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        calls = []
        for match in self._call.finditer(text):
            kind, body = match.group(1).strip(), match.group(2)
            fenced = self._fenced.match(body) if kind in ("function", "") else None
            name, arguments = (fenced.group(1), fenced.group(2)) if fenced else (kind, body.strip())
            calls.append(FoundCall(name, arguments_object(arguments)))
        if not calls:
            return None
        starts = [i for i in (text.find(self.calls_begin), text.find(self.call_begin)) if i >= 0]
        return FoundCalls(text[:min(starts)].strip(), calls)

    def _one(self, name: str, arguments: str) -> str:
        if self.fenced:
            return f"{self.call_begin}function{self.sep}{name}\n```json\n{arguments}\n```{self.call_end}"
        return f"{self.call_begin}{name}{self.sep}{arguments}{self.call_end}"

    def render(self, calls: list[FoundCall]) -> str:
        joiner = "\n" if self.fenced else ""
        return self.calls_begin + joiner.join(
            self._one(c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in calls) + self.calls_end

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        head, tail = self._one(tool_function(tool)["name"], "\0").split("\0")
        return f"{gbnf_literal(head)} {builder.schema(tool_parameters(tool))} {gbnf_literal(tail)}"

    def calls_rule(self, one: str, parallel: bool) -> str:
        joiner = '"\\n" ' if self.fenced else ""
        more = f" ( {joiner}{one} )*" if parallel else ""
        return f"{gbnf_literal(self.calls_begin)} {one}{more} {gbnf_literal(self.calls_end)}"
