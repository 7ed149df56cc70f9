"""Parsing a lab-XX-YY.md deliverable: headed sections, their fenced blocks and plain text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
# Template instructions live in HTML comments so that they never count as the student's text.
COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)


@dataclass
class Section:
    heading: str
    text: str = ""
    blocks: list[str] = field(default_factory=list)

    def output_lines(self) -> list[str]:
        """The pasted output: the fenced blocks' lines, or the plain text when nothing is fenced."""
        source = "\n".join(self.blocks) if any(b.strip() for b in self.blocks) else self.text
        return [line.rstrip() for line in source.splitlines() if line.strip()]


@dataclass
class Deliverable:
    path: Path | None
    sections: list[Section]

    @property
    def student(self) -> str:
        """Who handed it in: the file's stem, or its folder when the file keeps the template's name."""
        if self.path is None:
            return "-"
        if re.fullmatch(r"lab-\d\d-\d\d", self.path.stem) and self.path.parent.name:
            return self.path.parent.name
        return self.path.stem


def parse_deliverable(text: str, path: Path | None = None) -> Deliverable:
    text = COMMENT.sub("", text)
    sections: list[Section] = []
    current = Section("")  # text before the first heading
    block: list[str] | None = None
    for line in text.splitlines():
        if FENCE.match(line):
            if block is None:
                block = []
            else:
                current.blocks.append("\n".join(block))
                block = None
            continue
        if block is not None:
            block.append(line)
            continue
        heading = HEADING.match(line)
        if heading and len(heading.group(1)) >= 2:  # "# Title" is the document's title, not a section
            sections.append(current)
            current = Section(heading.group(2))
        else:
            current.text += line + "\n"
    if block is not None:  # an unclosed fence still holds what the student pasted
        current.blocks.append("\n".join(block))
    sections.append(current)
    return Deliverable(path, [s for s in sections if s.heading])


def read_deliverable(path: Path) -> Deliverable:
    return parse_deliverable(path.read_text(encoding="utf-8", errors="replace"), path)
