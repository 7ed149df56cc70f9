"""Qwen3-Coder, Qwen3.5 and Nemotron Nano 3's XML calls: `<function=NAME>` with one `<parameter=P>` each."""

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
    tool_properties,
    value_types,
)
from kinetic.chat.callformats.gbnf import GrammarBuilder, gbnf_literal


class QwenXmlFormat(CallFormat):
    """Qwen3-Coder, Qwen3.5, Nemotron Nano 3: string values written as they are, others as JSON."""

    name = "qwen-xml"
    markers = ("<tool_call>", "<function=")
    ends_reasoning = ("<tool_call>",)  # llama-server's thinking_end_tags for these templates
    _call = re.compile(r"(?:<tool_call>\s*)?<function=([^>\n]+)>(.*?)</function>\s*(?:</tool_call>)?", re.DOTALL)
    _parameter = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
    _text_rule = '( [^<] | "<" [^/] )*'  # a value never holds "</": the grammar closes it there

    def parse(self, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
        calls = []
        for match in self._call.finditer(text):
            name = match.group(1).strip()
            properties = (parameters.get(name) or {}).get("properties") or {}
            arguments = {}
            for parameter in self._parameter.finditer(match.group(2)):
                key, raw = parameter.group(1).strip(), parameter.group(2)
                arguments[key] = self.value(raw, properties.get(key) or {})
            calls.append(FoundCall(name, arguments))
        if not calls:
            return None
        first = self._call.search(text)
        assert first is not None
        return FoundCalls(text[:first.start()].strip(), calls)

    @staticmethod
    def value(raw: str, schema: dict[str, Any]) -> Any:
        """A string property's text as it is; anything else as JSON when it parses (llama-server's rule)."""
        if value_types(schema) == {"string"}:
            return raw
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw

    def render(self, calls: list[FoundCall]) -> str:
        blocks = []
        for call in calls:
            arguments = call.arguments if isinstance(call.arguments, dict) else {}
            parameters = "".join(
                f"<parameter={key}>\n"
                f"{value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}\n</parameter>\n"
                for key, value in arguments.items())
            blocks.append(f"<tool_call>\n<function={call.name}>\n{parameters}</function>\n</tool_call>")
        return "\n".join(blocks)

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        items = []
        for name, schema, required in tool_properties(tool):
            if value_types(schema) == {"string"}:
                options = schema.get("enum") if isinstance(schema.get("enum"), list) else (
                    [schema["const"]] if "const" in schema else None)
                value = f'( {" | ".join(gbnf_literal(o) for o in options)} )' if options else self._text_rule
            else:
                value = builder.schema(schema)
            items.append((f'{gbnf_literal(f"<parameter={name}>" + chr(10))} {value} '
                          f'{gbnf_literal(chr(10) + "</parameter>" + chr(10))}', required))
        arguments = builder.sequence(f"call-{index}-args", items, "")
        head = gbnf_literal(f"<tool_call>\n<function={tool_function(tool)['name']}>\n")
        return f'{head} {arguments} {gbnf_literal("</function>" + chr(10) + "</tool_call>")}'
