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

Pure text work; JSON schemas are compiled to GBNF by a function the caller passes in.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

SchemaCompiler = Callable[[dict[str, Any]], str]  # a JSON schema -> GBNF whose start rule is `root`
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


# ------------------------------------------------------------------------------ GBNF pieces

_RULE = re.compile(r"^([A-Za-z0-9_-]+)\s*::=\s*(.*)$")
_IDENTIFIER = re.compile(r"[A-Za-z0-9_-]+")


def gbnf_literal(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


def _skip_quoted(body: str, start: int, close: str) -> int:
    """The index just past the literal or character class that opens at `start`."""
    index = start + 1
    while index < len(body) and body[index] != close:
        index += 2 if body[index] == "\\" else 1
    return index + 1


def prefixed_rules(grammar: str, prefix: str) -> str:
    """A converter grammar (one rule a line) with every rule renamed `prefix-name`, so that several
    schemas' grammars live in one grammar without their rules (`root`, `city-kv`...) colliding."""
    rules = [match.groups() for match in map(_RULE.match, grammar.splitlines()) if match]
    names = {name for name, _ in rules}
    lines = []
    for name, body in rules:
        out, index = [], 0
        while index < len(body):
            char = body[index]
            if char in '"[{':
                end = _skip_quoted(body, index, {'"': '"', "[": "]", "{": "}"}[char])
                out.append(body[index:end])
                index = end
                continue
            word = _IDENTIFIER.match(body, index)
            if word:
                token = word.group(0)
                out.append(f"{prefix}-{token}" if token in names else token)
                index = word.end()
                continue
            out.append(char)
            index += 1
        lines.append(f"{prefix}-{name} ::= {''.join(out)}")
    return "\n".join(lines)


class GrammarBuilder:
    """Collects named rules and embedded schema grammars into one GBNF text."""

    def __init__(self, compile_schema: SchemaCompiler):
        self.compile_schema = compile_schema
        self.lines: list[str] = []
        self.count = 0

    def rule(self, name: str, body: str) -> str:
        self.lines.append(f"{name} ::= {body}")
        return name

    def schema(self, schema: dict[str, Any]) -> str:
        """A rule matching the JSON values `schema` allows."""
        self.count += 1
        prefix = f"schema{self.count}"
        self.lines.append(prefixed_rules(self.compile_schema(schema), prefix))
        return f"{prefix}-root"

    def sequence(self, name: str, items: list[tuple[str, bool]], separator: str) -> str:
        """Items in order, each required or optional, with `separator` between those present: one rule
        per (position, separator owed) keeps the grammar linear in the number of items."""
        sep = gbnf_literal(separator) if separator else ""
        made: dict[tuple[int, bool], str] = {}

        def at(index: int, owed: bool) -> str:
            if (index, owed) in made:
                return made[(index, owed)]
            rule = f"{name}-{index}-{int(owed)}"
            if index == len(items):
                body = '""'
            else:
                expr, required = items[index]
                present = " ".join(part for part in (sep if owed else "", expr, at(index + 1, True)) if part)
                body = present if required else f"( {present} ) | {at(index + 1, owed)}"
            made[(index, owed)] = self.rule(rule, body)
            return made[(index, owed)]

        return at(0, False)

    def build(self, root: str) -> str:
        return "\n".join([f"root ::= {root}", *self.lines])


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool)


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return _function(tool).get("parameters") or {"type": "object"}


def _properties(tool: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """(name, schema, required) of each parameter; each schema carries the definitions its `$ref`s
    may point to, since it is compiled on its own."""
    parameters = _parameters(tool)
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


def _arguments_object(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


# --------------------------------------------------------------------------------- formats


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
        chosen = [t for t in tools if _function(t).get("name") == only] if only else list(tools)
        if not chosen:
            raise ValueError(f"no tool named {only!r}" if only else "no tools to call")
        builder = GrammarBuilder(compile_schema)
        calls = [builder.rule(f"call-{index}", self.call_rule(builder, tool, index))
                 for index, tool in enumerate(chosen)]
        one = builder.rule("call", " | ".join(calls))
        return builder.build(self.calls_rule(one, parallel))


class JsonObjectFormat(CallFormat):
    """Calls as one JSON object each, `{"name": NAME, KEY: {...}}`, inside markers of the family."""

    arguments_key = "arguments"
    before = ""
    after = ""

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        head = gbnf_literal(f'{self.before}{{"name": {json.dumps(_function(tool)["name"])}, "{self.arguments_key}": ')
        return f'{head} {builder.schema(_parameters(tool))} {gbnf_literal("}" + self.after)}'

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
        for name, schema, required in _properties(tool):
            if value_types(schema) == {"string"}:
                options = schema.get("enum") if isinstance(schema.get("enum"), list) else (
                    [schema["const"]] if "const" in schema else None)
                value = f'( {" | ".join(gbnf_literal(o) for o in options)} )' if options else self._text_rule
            else:
                value = builder.schema(schema)
            items.append((f'{gbnf_literal(f"<parameter={name}>" + chr(10))} {value} '
                          f'{gbnf_literal(chr(10) + "</parameter>" + chr(10))}', required))
        arguments = builder.sequence(f"call-{index}-args", items, "")
        head = gbnf_literal(f"<tool_call>\n<function={_function(tool)['name']}>\n")
        return f'{head} {arguments} {gbnf_literal("</function>" + chr(10) + "</tool_call>")}'


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
        return {_literal_value(k): _literal_value(v)
                for k, v in zip(node.keys, node.values, strict=True) if k is not None}
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
                 for name, schema, required in _properties(tool)]
        arguments = builder.sequence(f"call-{index}-args", items, ", ")
        return f'{gbnf_literal(_function(tool)["name"] + "(")} {arguments} ")"'

    def calls_rule(self, one: str, parallel: bool) -> str:
        more = f' ( ", " {one} )*' if parallel else ""
        return f'{gbnf_literal(self.start + "[")} {one}{more} {gbnf_literal("]" + self.end)}'


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
        head = gbnf_literal(f'{{"name": {json.dumps(_function(tool)["name"])}, "arguments": ')
        return f'{head} {builder.schema(_parameters(tool))} ", \\"id\\": \\"" [a-zA-Z0-9]{{9}} "\\"}}"'

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
        head = gbnf_literal("[TOOL_CALLS]" + _function(tool)["name"] + "[ARGS]")
        return f"{head} {builder.schema(_parameters(tool))}"

    def calls_rule(self, one: str, parallel: bool) -> str:
        return f"{one}+" if parallel else one


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
            calls.append(FoundCall(name, _arguments_object(arguments)))
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
        head, tail = self._one(_function(tool)["name"], "\0").split("\0")
        return f"{gbnf_literal(head)} {builder.schema(_parameters(tool))} {gbnf_literal(tail)}"

    def calls_rule(self, one: str, parallel: bool) -> str:
        joiner = '"\\n" ' if self.fenced else ""
        more = f" ( {joiner}{one} )*" if parallel else ""
        return f"{gbnf_literal(self.calls_begin)} {one}{more} {gbnf_literal(self.calls_end)}"


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
        middle = gbnf_literal(f'", "tool_name": {json.dumps(_function(tool)["name"])}, "parameters": ')
        return f'{opening} [0-9]+ {middle} {builder.schema(_parameters(tool))} "}}"'

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
        head = gbnf_literal(f'{{"tool_name": {json.dumps(_function(tool)["name"])}, "parameters": ')
        return f'{head} {builder.schema(_parameters(tool))} "}}"'

    def calls_rule(self, one: str, parallel: bool) -> str:
        opening, closing = gbnf_literal("Action:\n```json\n[\n    "), gbnf_literal("\n]```")
        more = f' ( ",\\n    " {one} )*' if parallel else ""
        return f"{opening} {one}{more} {closing}"


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
        calls = [FoundCall(m.group("before") or m.group("after"), _arguments_object(m.group("arguments").strip()))
                 for m in self._call.finditer(text) if m.group("before") or m.group("after")]
        if not calls:
            return None
        final = self._final.search(text)
        return FoundCalls(final.group(1).strip() if final else "", calls)

    def render(self, calls: list[FoundCall]) -> str:
        return "".join(f"<|channel|>commentary to=functions.{c.name} <|constrain|>json<|message|>"
                       f"{json.dumps(c.arguments, ensure_ascii=False)}<|call|>" for c in calls)

    def call_rule(self, builder: GrammarBuilder, tool: dict[str, Any], index: int) -> str:
        head = f"<|channel|>commentary to=functions.{_function(tool)['name']} <|constrain|>json<|message|>"
        return f"{gbnf_literal(head)} {builder.schema(_parameters(tool))}"

    def calls_rule(self, one: str, parallel: bool) -> str:
        return one  # the call token ends the turn: one call a turn


JSON = "json"  # kinetic's own shape, compiled and streamed by kinetic.chat.toolcalls
FORMATS: dict[str, CallFormat] = {fmt.name: fmt for fmt in (
    HermesFormat(), Llama3Format(), QwenXmlFormat(), Lfm2Format(), MistralFormat(), MistralArgsFormat(),
    DeepSeekFormat(fenced=True), DeepSeekFormat(fenced=False), CommandR7bFormat(), CommandRPlusFormat(),
    GptOssFormat())}


def detect_call_format(source: str) -> str:
    """The call format a chat template's source speaks (common_chat_try_specialized_template's tests,
    then the markers the generic families write); `json` when it names none."""
    if "<|channel|>" in source:
        return "gpt-oss"
    if "<|tool_list_start|>" in source or "List of tools: [" in source:
        return "lfm2"
    if "<tool_call>" in source and "<function=" in source and "<parameter=" in source:
        return "qwen-xml"
    if "tool▁calls▁begin" in source:
        return "deepseek-r1" if "```json" in source else "deepseek-v3"
    if "<|START_ACTION|>" in source:
        return "command-r7b"
    if "Write \\'Action:\\'" in source or ("Action:" in source and "directly-answer" in source):
        return "command-r-plus"
    if "[TOOL_CALLS]" in source:
        return "mistral-args" if "[ARGS]" in source else "mistral"
    if "<tool_call>" in source and "<arg_key>" not in source and "<invoke name=" not in source:
        return "hermes"  # (GLM's and MiniMax's <tool_call> hold tagged arguments, not Hermes JSON)
    if "<|python_tag|>" in source or ("<|start_header_id|>" in source and '"parameters"' in source):
        return "llama3"
    return JSON


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
