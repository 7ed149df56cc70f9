"""A small GBNF recognizer for the tests: does a grammar accept a whole text?

llama.cpp's own grammar engine only runs inside sampling, so the unit tests check the grammars kinetic
writes with this reader of the same notation (literals, character classes, groups, `|`, `* + ?`,
`{m,n}`, rule references). Sets of end positions make it a plain backtracking-free recognizer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class CharClass:
    ranges: tuple[tuple[str, str], ...]
    negated: bool

    def matches(self, char: str) -> bool:
        inside = any(low <= char <= high for low, high in self.ranges)
        return inside != self.negated


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Repeat:
    node: Node
    low: int
    high: int | None


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    options: tuple[Node, ...]


Node = Literal | CharClass | Ref | Repeat | Seq | Alt
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "/": "/", "-": "-", "^": "^"}


class _Reader:
    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def space(self) -> None:
        while self.pos < len(self.text):
            if self.text[self.pos] in " \t\r\n":
                self.pos += 1
            elif self.text[self.pos] == "#":
                while self.pos < len(self.text) and self.text[self.pos] != "\n":
                    self.pos += 1
            else:
                break

    def char(self) -> str:
        c = self.text[self.pos]
        self.pos += 1
        if c != "\\":
            return c
        e = self.text[self.pos]
        self.pos += 1
        if e == "x":
            value, self.pos = self.text[self.pos:self.pos + 2], self.pos + 2
            return chr(int(value, 16))
        if e == "u":
            value, self.pos = self.text[self.pos:self.pos + 4], self.pos + 4
            return chr(int(value, 16))
        return _ESCAPES[e]

    def alternatives(self) -> Node:
        options = [self.sequence()]
        while self.pos < len(self.text) and self.text[self.pos] == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def sequence(self) -> Node:
        items: list[Node] = []
        while True:
            self.space()
            if self.pos >= len(self.text) or self.text[self.pos] in "|)":
                break
            if re.match(r"[A-Za-z0-9_-]+\s*::=", self.text[self.pos:]):
                break  # the next rule starts
            items.append(self.postfix(self.atom()))
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def atom(self) -> Node:
        c = self.text[self.pos]
        if c == '"':
            self.pos += 1
            chars = []
            while self.text[self.pos] != '"':
                chars.append(self.char())
            self.pos += 1
            return Literal("".join(chars))
        if c == "[":
            self.pos += 1
            negated = self.text[self.pos] == "^"
            self.pos += negated
            ranges = []
            while self.text[self.pos] != "]":
                low = self.char()
                high = low
                if self.text[self.pos] == "-" and self.text[self.pos + 1] != "]":
                    self.pos += 1
                    high = self.char()
                ranges.append((low, high))
            self.pos += 1
            return CharClass(tuple(ranges), negated)
        if c == "(":
            self.pos += 1
            node = self.alternatives()
            self.space()
            assert self.text[self.pos] == ")", self.text[self.pos:self.pos + 20]
            self.pos += 1
            return node
        if c == ".":
            self.pos += 1
            return CharClass((), True)
        name = re.match(r"[A-Za-z0-9_-]+", self.text[self.pos:])
        assert name, self.text[self.pos:self.pos + 30]
        self.pos += name.end()
        return Ref(name.group(0))

    def postfix(self, node: Node) -> Node:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c in "*+?":
                self.pos += 1
                node = Repeat(node, 1 if c == "+" else 0, 1 if c == "?" else None)
            elif c == "{":
                end = self.text.index("}", self.pos)
                low, _, high = self.text[self.pos + 1:end].partition(",")
                single = "," not in self.text[self.pos + 1:end]
                node = Repeat(node, int(low), int(low) if single else (int(high) if high.strip() else None))
                self.pos = end + 1
            else:
                break
        return node


def parse_gbnf(grammar: str) -> dict[str, Node]:
    reader = _Reader(grammar)
    rules: dict[str, Node] = {}
    while True:
        reader.space()
        if reader.pos >= len(reader.text):
            return rules
        head = re.match(r"([A-Za-z0-9_-]+)\s*::=", reader.text[reader.pos:])
        assert head, reader.text[reader.pos:reader.pos + 40]
        reader.pos += head.end()
        assert head.group(1) not in rules, f"rule {head.group(1)} defined twice"
        rules[head.group(1)] = reader.alternatives()


def accepts(grammar: str, text: str, start: str = "root") -> bool:
    rules = parse_gbnf(grammar)
    memo: dict[tuple[str, int], frozenset[int]] = {}

    def ends(node: Node, pos: int) -> frozenset[int]:
        if isinstance(node, Literal):
            return frozenset([pos + len(node.text)]) if text.startswith(node.text, pos) else frozenset()
        if isinstance(node, CharClass):
            return frozenset([pos + 1]) if pos < len(text) and node.matches(text[pos]) else frozenset()
        if isinstance(node, Ref):
            key = (node.name, pos)
            if key not in memo:
                memo[key] = frozenset()
                memo[key] = ends(rules[node.name], pos)
            return memo[key]
        if isinstance(node, Alt):
            return frozenset().union(*(ends(option, pos) for option in node.options))
        if isinstance(node, Seq):
            current = frozenset([pos])
            for item in node.items:
                current = frozenset().union(*(ends(item, p) for p in current)) if current else current
            return current
        found = frozenset([pos]) if node.low == 0 else frozenset()
        frontier, count = frozenset([pos]), 0
        while frontier and (node.high is None or count < node.high):
            frontier = frozenset().union(*(ends(node.node, p) for p in frontier))
            count += 1
            if count >= node.low:
                if node.high is None and frontier <= found:
                    break  # nothing new: further rounds reach the same ends
                found |= frontier
        return found

    return len(text) in ends(Ref(start), 0)
