"""GBNF pieces the call formats build their grammars from: literals, a converter grammar's rules renamed
under a prefix (so several schemas live in one grammar), and a builder of named rules."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

SchemaCompiler = Callable[[dict[str, Any]], str]  # a JSON schema -> GBNF whose start rule is `root`

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
