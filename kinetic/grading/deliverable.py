"""Reading a deliverable (`lab-XX-YY.md`) the way students write it.

Students paste outputs under headings or under bold labels, in English or Italian, inside ``` or
~~~ fences, as indented code or as plain text, with or without the command line, with prose in
between. So a lab finds its outputs by their content (the lines its scripts print, the JSON a
route answers) anywhere in the file, and uses the sections only for what has no fixed shape:
the student's own answers. Template instructions live in HTML comments and never count.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# `**1. chat.py**`, `__Risposta__:`, `- **The 401 error:** text...`: a bold run opening the line.
BOLD_LABEL = re.compile(r"^\s*(?:[-*+]\s+)?(?:\d+[.)]\s*)?(\*\*|__)(?P<label>[^*_].*?)\1\s*:?\s*(?P<rest>.*)$")
# `Error 401:` alone on a line: a label in a file written without Markdown. Short, no brackets or
# prompts, so that an output line is never taken for one.
LABEL_LINE = re.compile(r"^\s*(?:\d+[.)]\s*)?(?P<label>[^\W\d][^\[\]{}<>$#|`]{0,58}?)\s*:\s*$")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
NAME_LINE = re.compile(
    r"^\s*(?:[-*]\s+)?(?:\*\*|__)?(?:name|full name|student|nome|nome e cognome|cognome e nome|studente|"
    r"studentessa|autore|autrice|author)(?:\*\*|__)?\s*[:=]\s*(?:\*\*|__)?\s*(?P<name>[^*_].*?)\s*(?:\*\*|__)?\s*$",
    re.IGNORECASE)


@dataclass
class Section:
    heading: str
    lines: list[str] = field(default_factory=list)  # every line, code included
    prose: list[str] = field(default_factory=list)  # the lines outside code

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class Deliverable:
    path: Path | None
    text: str  # comments removed
    sections: list[Section]
    code_lines: list[str]
    prose_lines: list[str]

    @property
    def lines(self) -> list[str]:
        """Every non-empty line, code and prose, in order (trailing spaces removed)."""
        return [line.rstrip() for line in self.text.splitlines() if line.strip()]

    def name_line(self) -> str | None:
        for line in self.prose_lines:
            match = NAME_LINE.match(line)
            if match and match["name"].strip():
                return match["name"].strip()
        return None

    @property
    def student(self) -> str:
        """Who handed it in: a `Name:` line, else the folder when the file keeps the template's name,
        else the file's stem."""
        candidates = self.student_candidates()
        return candidates[0] if candidates else "-"

    def student_candidates(self) -> list[str]:
        """Every way this file names its author, most explicit first (matched to key names later)."""
        found: list[str] = []
        name = self.name_line()
        if name:
            found.append(name)
        if self.path is not None:
            stem, folder = self.path.stem, self.path.parent.name
            if re.fullmatch(r"lab-\d\d-\d\d", stem, re.IGNORECASE) and folder:
                found += [folder, folder.split("_", 1)[0]]  # Moodle's "Name Surname_123_assignsubmission..."
            else:
                found += [stem, re.sub(r"^lab-\d\d-\d\d[-_ ]*|[-_ ]*lab-\d\d-\d\d$", "", stem, flags=re.I)]
        return [c for c in dict.fromkeys(found) if c]

    def json_objects(self) -> list[dict[str, Any]]:
        """Every JSON object pasted anywhere (one-line or pretty-printed), outermost only."""
        return list(_json_objects(self.text))

    def section(self, pattern: re.Pattern[str]) -> Section | None:
        return next((s for s in self.sections if pattern.search(s.heading)), None)


def _json_objects(text: str) -> Iterator[dict[str, Any]]:
    decoder = json.JSONDecoder()
    index = text.find("{")
    while index != -1:
        try:
            obj, end = decoder.raw_decode(text, index)
        except ValueError:
            index = text.find("{", index + 1)
            continue
        if isinstance(obj, dict):
            yield obj
        index = text.find("{", end)


def normalize_name(name: str) -> str:
    """`Mario Rossi`, `mario.rossi`, `mario-rossi`: one key for matching names across sources."""
    return re.sub(r"[^0-9a-z]", "", name.casefold())


def _fence_kinds(lines: list[str]) -> list[str]:
    """Each line's part in the file's fences: "fence" (an opening or closing line), "code" or "text".

    For output pasted from a chat model, which writes its own fences: inside a fence, a line opening one with
    an info string (```python) may open a nested block, whose bare ``` closes it rather than the student's
    fence, if that reading closes every fence; else CommonMark's, if that does; else a fence never closed
    (an answer cut off at max_tokens, pasted as plain text) is not a fence, so the rest of the file stays
    the student's."""
    not_fences: set[int] = set()
    while True:
        kinds, unclosed = _scan_fences(lines, not_fences, nested=True)
        if unclosed is None:
            return kinds
        kinds, flat_unclosed = _scan_fences(lines, not_fences, nested=False)
        if flat_unclosed is None:
            return kinds
        not_fences.add(unclosed)


def _scan_fences(lines: list[str], not_fences: set[int], nested: bool) -> tuple[list[str], int | None]:
    """The lines' kinds, and the first line of the outermost fence left open at the end (None if none is)."""
    kinds: list[str] = []
    open_fences: list[tuple[int, str]] = []  # (line index, marker), the student's own first
    for index, line in enumerate(lines):
        opening = None if index in not_fences else FENCE.match(line)
        if opening is None:
            kinds.append("code" if open_fences else "text")
            continue
        marker = opening.group(1)
        info = line.strip()[len(marker):].strip()
        if not open_fences or (nested and info):
            kinds.append("code" if open_fences else "fence")
            open_fences.append((index, marker))
        elif not info and marker[0] == open_fences[-1][1][0] and len(marker) >= len(open_fences[-1][1]):
            open_fences.pop()
            kinds.append("code" if open_fences else "fence")
        else:
            kinds.append("code")
    return kinds, open_fences[0][0] if open_fences else None


def parse_deliverable(text: str, path: Path | None = None) -> Deliverable:
    text = COMMENT.sub("", text.replace("\r\n", "\n"))
    raw_sections: list[tuple[str, int, list[tuple[str, bool]]]] = [("", 0, [])]  # (heading, level, lines)
    code_lines: list[str] = []
    prose_lines: list[str] = []
    lines = text.splitlines()
    for line, kind in zip(lines, _fence_kinds(lines), strict=True):
        if kind == "code":
            raw_sections[-1][2].append((line, True))
            code_lines.append(line)
        if kind != "text":
            continue
        if not line.startswith(("    ", "\t")):
            prose_lines.append(line)  # as written, labels included: a `**Nome:** ...` line names the author
        heading = HEADING.match(line)
        bold = None if heading else BOLD_LABEL.match(line)
        label = None if heading or bold or line.startswith(("    ", "\t")) else LABEL_LINE.match(line)
        if heading:
            raw_sections.append((heading.group(2), len(heading.group(1)), []))
            continue
        if label:
            raw_sections.append((label["label"], 8, []))
            continue
        if bold:
            raw_sections.append((bold["label"].strip().rstrip(":"), 7, []))
            line = bold["rest"]
            if not line.strip():
                continue
        indented = line.startswith(("    ", "\t")) and bool(line.strip())
        raw_sections[-1][2].append((line, indented))
        if indented:
            code_lines.append(line)
    # A lone level-1 heading above deeper ones is the document's title, not a section.
    levels = [level for heading, level, _ in raw_sections if heading]
    title_level = 1 if levels and min(levels) == 1 and any(level > 1 for level in levels) else 0
    sections = [Section(heading, [t for t, _ in lines if t.strip()], [t for t, code in lines if not code and t.strip()])
                for heading, level, lines in raw_sections if heading and level != title_level]
    return Deliverable(path, text, sections, code_lines, prose_lines)


def read_deliverable(path: Path) -> Deliverable:
    return parse_deliverable(path.read_text(encoding="utf-8-sig", errors="replace"), path)
