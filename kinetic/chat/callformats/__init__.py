"""Tool calls in each model family's own format: which one a chat template speaks, how to read it
back out of generated text, how to write a past call in it, and the GBNF grammar that holds a
forced call to it.

Detection follows llama-server (common/chat.cpp and common/parsers/): the template's source names
its family by the markers it writes. A model is forced into the shape it was trained on, so a forced
call on Qwen3.5 is its XML, on LFM2 its Python-style list, on Hermes its `<tool_call>` JSON:

  qwen-xml     <tool_call>\\n<function=NAME>\\n<parameter=P>\\nvalue\\n</parameter>\\n</function>\\n</tool_call>
  lfm2         <|tool_call_start|>[NAME(p="value", n=1)]<|tool_call_end|>
  hermes       <tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>
  llama3       {"name": NAME, "parameters": {...}}            (also after <|python_tag|>)
  mistral      [TOOL_CALLS][{"name": NAME, "arguments": {...}, "id": "abcDEF123"}]
  mistral-args [TOOL_CALLS]NAME[ARGS]{...}
  deepseek-r1  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```
               <｜tool▁call▁end｜><｜tool▁calls▁end｜>
  deepseek-v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
               <｜tool▁calls▁end｜>
  command-r7b  <|START_ACTION|>[{"tool_call_id": "0", "tool_name": NAME, "parameters": {...}}]<|END_ACTION|>
  command-r-plus  Action:\n```json\n[{"tool_name": NAME, "parameters": {...}}]```
  gpt-oss      <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}
  json         kinetic's own: {"name": NAME, "arguments": {...}} (templates that name no format)

Pure text work; JSON schemas are compiled to GBNF by a function the caller passes in. One module per
family of formats (json_object, qwen_xml, lfm2, mistral, deepseek, command_r, gpt_oss) over `base` and
`gbnf`; `detect` tells which one a template speaks; this module holds the registry by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from kinetic.chat.callformats.base import CallFormat, FoundCall, FoundCalls, ParameterSchemas
from kinetic.chat.callformats.command_r import CommandR7bFormat, CommandRPlusFormat
from kinetic.chat.callformats.deepseek import DeepSeekFormat
from kinetic.chat.callformats.gpt_oss import GptOssFormat
from kinetic.chat.callformats.json_object import HermesFormat, Llama3Format
from kinetic.chat.callformats.lfm2 import Lfm2Format
from kinetic.chat.callformats.mistral import MistralArgsFormat, MistralFormat
from kinetic.chat.callformats.qwen_xml import QwenXmlFormat

FORMATS: dict[str, CallFormat] = {fmt.name: fmt for fmt in (
    HermesFormat(), Llama3Format(), QwenXmlFormat(), Lfm2Format(), MistralFormat(), MistralArgsFormat(),
    DeepSeekFormat(fenced=True), DeepSeekFormat(fenced=False), CommandR7bFormat(), CommandRPlusFormat(),
    GptOssFormat())}


def format_markers(name: str) -> tuple[str, ...]:
    fmt = FORMATS.get(name)
    return fmt.markers if fmt else ()


def reasoning_enders(name: str) -> tuple[str, ...]:
    fmt = FORMATS.get(name)
    return fmt.ends_reasoning if fmt else ()


def parse_in_format(name: str, text: str, parameters: ParameterSchemas) -> FoundCalls | None:
    fmt = FORMATS.get(name)
    return fmt.parse(text, parameters) if fmt else None


def rendered_calls(name: str, calls: Iterable[FoundCall]) -> str:
    """Past calls written as the model writes them (kinetic's JSON for templates of no known format)."""
    listed = list(calls)
    fmt = FORMATS.get(name)
    if fmt is not None:
        return fmt.render(listed)
    return "\n".join(json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False) for c in listed)
