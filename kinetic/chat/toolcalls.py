"""Tool calls in generated text: the schema that forces one, and parsers for models' own syntaxes.

Pure functions and small state machines, no llama_cpp: the grammar itself comes from
`kinetic.engine.grammar.grammar_from_json_schema(tool_call_schema(...))`.

Forced calls (`tool_choice` required or named) on a template of no known format are generated as
`{"name": ..., "arguments": {...}}` (an array of those when parallel calls are allowed); a template
of a known family gets its own format (kinetic.chat.callformats), which `parse_tool_calls` tries
first. With `auto`, the model writes calls in its own format; the common ones are also recognised:
  Hermes / Qwen   <tool_call>{"name": ..., "arguments": {...}}</tool_call>
  Mistral         [TOOL_CALLS][{"name": ..., "arguments": {...}}]  or  [TOOL_CALLS]name[ARGS]{...}
  Llama 3         <|python_tag|>{"name": ..., "parameters": {...}}  or the bare JSON object
  Gemma (kinetic's template) and generic   the whole reply is {"name": ..., "arguments": {...}} or a list
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kinetic.chat.callformats import format_markers, parse_in_format
from kinetic.chat.callformats.base import ParameterSchemas
from kinetic.chat.callformats.detect import JSON
from kinetic.engine.text import held_suffix

ALPHANUMERIC = string.ascii_letters + string.digits
_DECODER = json.JSONDecoder()

# Markers that open a tool call in some template's syntax; text before them is ordinary content.
CALL_MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")


def new_call_id() -> str:
    """llama-server's id shape: 32 random alphanumerics, no `call_` prefix."""
    return "".join(secrets.choice(ALPHANUMERIC) for _ in range(32))


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # always a JSON text, as OpenAI's `function.arguments`
    id: str | None = None  # the model's own id, when its syntax carries one


@dataclass(frozen=True)
class ParsedReply:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


# ------------------------------------------------------------------------ forcing a call


def call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of one call of `tool` (an OpenAI tool or bare function definition).

    `name` comes first so a streamed call names its function before its arguments start."""
    function = tool.get("function", tool)
    parameters = function.get("parameters") or {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": parameters},
            "required": ["name", "arguments"]}


def tool_call_schema(tools: list[dict[str, Any]], *, only: str | None = None, parallel: bool = False) -> dict[str, Any]:
    """A schema whose documents are exactly the allowed calls: one call of any tool (or of the tool
    named `only`), and with `parallel` also a non-empty array of such calls. The single call stays
    allowed so the model can stop after one, as the templates' own examples do."""
    chosen = [t for t in tools if t.get("function", t).get("name") == only] if only else list(tools)
    if not chosen:
        raise ValueError(f"no tool named {only!r}" if only else "no tools to call")
    schemas = [call_schema(t) for t in chosen]
    one = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if parallel:
        return {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}
    return one


# ------------------------------------------------------------------------------- parsing


def _arguments_text(value: Any) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
            return value
        except json.JSONDecodeError:
            return json.dumps(value, ensure_ascii=False)
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def _call_from(obj: Any, names: set[str] | None) -> ParsedCall | None:
    """A call out of one decoded JSON object, in any of the common shapes."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # OpenAI's own shape, echoed by some models
        inner = obj["function"]
        obj = {"name": inner.get("name"), "arguments": inner.get("arguments"), "id": obj.get("id")}
    name = obj.get("name")
    if not isinstance(name, str) or not name or (names is not None and name not in names):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    return ParsedCall(name=name, arguments=_arguments_text(arguments), id=call_id)


def _calls_from(value: Any, names: set[str] | None) -> list[ParsedCall] | None:
    items = value if isinstance(value, list) else [value]
    calls = [_call_from(item, names) for item in items]
    parsed = [c for c in calls if c is not None]
    if not items or len(parsed) != len(calls):
        return None
    return parsed


def _decode_all(text: str, separators: str = " \t\r\n;,") -> list[Any] | None:
    """Every JSON value in `text`, written one after another; None if anything else is there."""
    values: list[Any] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos] in separators:
            pos += 1
        if pos >= len(text):
            return values
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError:
            return None
        values.append(value)


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def _bare_json(text: str, names: set[str] | None) -> list[ParsedCall] | None:
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    values = _decode_all(stripped)
    if not values:
        return None
    calls: list[ParsedCall] = []
    for value in values:
        found = _calls_from(value, names)
        if found is None:
            return None
        calls += found
    return calls


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)\[ARGS\]")


def _hermes(text: str, names: set[str] | None) -> ParsedReply | None:
    if "<tool_call>" not in text:
        return None
    calls: list[ParsedCall] = []
    for match in _HERMES.finditer(text):
        found = _bare_json(match.group(1), None)
        if found is None:
            return None
        calls += found
    return ParsedReply(content=_HERMES.sub("", text).strip(), calls=calls)


def _mistral(text: str) -> ParsedReply | None:
    start = text.find("[TOOL_CALLS]")
    if start < 0:
        return None
    content, rest = text[:start].strip(), text[start + len("[TOOL_CALLS]"):]
    calls: list[ParsedCall] = []
    while rest.strip():
        named = _MISTRAL_NAMED.match(rest)
        if named:  # newer Mistral templates: [TOOL_CALLS]name[ARGS]{...}
            try:
                arguments, end = _DECODER.raw_decode(rest, named.end())
            except json.JSONDecodeError:
                return None
            calls.append(ParsedCall(name=named.group(1), arguments=_arguments_text(arguments)))
            rest = rest[end:].lstrip()
            if rest.startswith("[TOOL_CALLS]"):
                rest = rest[len("[TOOL_CALLS]"):]
            continue
        found = _bare_json(rest, None)
        if found is None:
            return None
        calls += found
        break
    return ParsedReply(content=content, calls=calls) if calls else None


def _llama3(text: str, names: set[str] | None) -> ParsedReply | None:
    start = text.find("<|python_tag|>")
    if start < 0:
        return None
    body = text[start + len("<|python_tag|>"):].replace("<|eom_id|>", "").replace("<|eot_id|>", "")
    calls = _bare_json(body, None)
    return ParsedReply(content=text[:start].strip(), calls=calls) if calls else None


def parse_in_template_format(text: str, call_format: str, parameters: ParameterSchemas) -> ParsedReply | None:
    """The calls written in the template's own format (kinetic.chat.callformats), if any."""
    found = parse_in_format(call_format, text, parameters)
    if found is None or not found.calls:
        return None
    return ParsedReply(content=found.content, calls=[
        ParsedCall(name=call.name, arguments=_arguments_text(call.arguments), id=call.id) for call in found.calls])


def parse_tool_calls(text: str, tool_names: Iterable[str] | None = None, *, call_format: str = JSON,
                     parameters: ParameterSchemas | None = None) -> ParsedReply:
    """The calls in a reply and the content around them; no calls: the text is all content.

    The template's own format is tried first, then the common ones. Explicit markers are trusted
    whatever name they carry; a bare JSON reply only counts as a call when it names one of
    `tool_names`, so a JSON answer is not mistaken for a call."""
    names = set(tool_names) if tool_names is not None else None
    if call_format != JSON:
        known = parameters if parameters is not None else {name: {} for name in names or ()}
        reply = parse_in_template_format(text, call_format, known)
        if reply is not None:
            return reply
    for parser in (lambda t: _hermes(t, names), _mistral, lambda t: _llama3(t, names)):
        reply = parser(text)
        if reply is not None and reply.calls:
            return reply
    calls = _bare_json(text, names if names is not None else set())
    if calls:
        return ParsedReply(content="", calls=calls)
    return ParsedReply(content=text)


def parse_forced_calls(text: str) -> list[ParsedCall] | None:
    """The calls of grammar-constrained output (one object or an array); None if it is cut short."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return _calls_from(value, None)


# ------------------------------------------------------------------------------ streaming


@dataclass
class CallDelta:
    """One streamed piece of a call: the first carries id and name, later ones argument text."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass
class _StreamCall:
    name: str | None = None
    arguments: str = ""  # argument text seen but not yet sent
    announced: bool = False


class ForcedCallStreamer:
    """Turns grammar-forced JSON (`{"name":..,"arguments":{..}}` or an array of those), fed piece
    by piece, into call deltas as soon as each piece is known.

    A character-level scanner tracks strings and nesting, so argument text is passed on verbatim
    while the closing braces of the call object and the array are not."""

    def __init__(self) -> None:
        self.stack: list[str] = []
        self.call_depth: int | None = None  # nesting depth inside a call object
        self.in_string = False
        self.escape = False
        self.string = ""
        self.expect_key = False
        self.key: str | None = None
        self.args_pending_start = False  # after `"arguments":`, before the value's first character
        self.capturing = False  # inside the arguments value: its text goes to the call verbatim
        self.calls: list[_StreamCall] = []

    def feed(self, text: str) -> list[CallDelta]:
        for char in text:
            self._char(char)
        return self._deltas()

    def _char(self, c: str) -> None:
        if self.args_pending_start and not c.isspace():
            self.args_pending_start, self.capturing = False, True
        if self.capturing:
            if not self.in_string and len(self.stack) == self.call_depth and c in ",}]":
                self.capturing = False  # a scalar value ended; this character is the call's
            else:
                self.calls[-1].arguments += c
        self._scan(c)
        if self.capturing and not self.in_string and len(self.stack) == self.call_depth and c in '}]"':
            self.capturing = False  # an object, array or string value just closed

    def _scan(self, c: str) -> None:
        if self.in_string:
            if self.escape:
                self.escape = False
            elif c == "\\":
                self.escape = True
            elif c == '"':
                self.in_string = False
                self._string_done()
            else:
                self.string += c
            return
        at_call_level = len(self.stack) == self.call_depth and not self.capturing
        if c == '"':
            self.in_string, self.string = True, ""
        elif c in "{[":
            self.stack.append(c)
            if self.call_depth is None and c == "{":
                self.call_depth = len(self.stack)
            if c == "{" and len(self.stack) == self.call_depth:
                self.calls.append(_StreamCall())
                self.expect_key = True
        elif c in "}]":
            self.stack.pop()
        elif c == ":" and at_call_level:
            self.expect_key = False
            self.args_pending_start = self.key == "arguments"
        elif c == "," and at_call_level:
            self.expect_key = True

    def _string_done(self) -> None:
        if len(self.stack) != self.call_depth or self.capturing:
            return
        if self.expect_key:
            self.key = self.string
        elif self.key == "name" and self.calls:
            self.calls[-1].name = self.string

    def _deltas(self) -> list[CallDelta]:
        deltas: list[CallDelta] = []
        for index, call in enumerate(self.calls):
            if call.name is None:
                continue
            if not call.announced:
                call.announced = True
                deltas.append(CallDelta(index=index, arguments=call.arguments, id=new_call_id(), name=call.name))
                call.arguments = ""
            elif call.arguments:
                deltas.append(CallDelta(index=index, arguments=call.arguments))
                call.arguments = ""
        return deltas


class AutoCallStream:
    """With `tool_choice: auto`, content streams as usual until the text may be a tool call; from
    there it is held back and parsed when the generation ends."""

    def __init__(self, tool_names: Iterable[str], *, call_format: str = JSON,
                 parameters: ParameterSchemas | None = None):
        self.names = list(tool_names)
        self.call_format = call_format
        self.parameters = parameters
        self.markers = tuple(dict.fromkeys(format_markers(call_format) + CALL_MARKERS))
        self.text = ""
        self.released = 0
        self.hold_from: int | None = None

    def push(self, text: str) -> str:
        """Content that is safe to send now."""
        self.text += text
        if self.hold_from is not None:
            return ""
        stripped = self.text.lstrip()
        if self.released == 0:
            if not stripped:
                return ""
            if stripped[0] in "{[`":  # a bare JSON call is the whole reply
                self.hold_from = 0
                return ""
        found = [i for i in (self.text.find(m, self.released) for m in self.markers) if i >= 0]
        if found:
            self.hold_from = min(found)
            return self._release(self.hold_from)
        return self._release(len(self.text) - held_suffix(self.text, self.markers))

    def _release(self, end: int) -> str:
        # trailing whitespace waits for what follows: before a call it is not content (the whole
        # answer's parse strips it too)
        end = len(self.text[:end].rstrip())
        if end <= self.released:
            return ""
        piece, self.released = self.text[self.released:end], end
        return piece

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """The rest of the content and the calls found in what was held back."""
        rest = self.text[self.released:]
        if self.hold_from is None:
            return rest, []
        reply = parse_tool_calls(rest, self.names, call_format=self.call_format, parameters=self.parameters)
        return reply.content, reply.calls


def split_arguments(arguments: str, pieces: int = 2) -> list[str]:
    """Argument text cut into a few pieces, for calls that were parsed whole but are streamed."""
    if len(arguments) < pieces:
        return [arguments]
    size = -(-len(arguments) // pieces)
    return [arguments[i:i + size] for i in range(0, len(arguments), size)]
