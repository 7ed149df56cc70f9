"""Parsing lab deliverables: sections, fenced blocks, template comments."""

from __future__ import annotations

from pathlib import Path

from kinetic.grading.deliverable import parse_deliverable

TEXT = """# Lab

intro text

## 1. chat.py
<!-- instructions mentioning base_url must not count -->
```text
hello
## not a heading inside a fence

[end]
```

## 2. Answer
plain line one
plain line two
"""


def test_deliverable_sections_split_on_level_two_headings() -> None:
    deliverable = parse_deliverable(TEXT)
    assert [s.heading for s in deliverable.sections] == ["1. chat.py", "2. Answer"]


def test_deliverable_output_lines_come_from_fences_and_keep_fenced_hashes() -> None:
    section = parse_deliverable(TEXT).sections[0]
    assert section.output_lines() == ["hello", "## not a heading inside a fence", "[end]"]


def test_deliverable_plain_text_counts_when_nothing_is_fenced_and_comments_never_do() -> None:
    deliverable = parse_deliverable(TEXT)
    assert deliverable.sections[1].output_lines() == ["plain line one", "plain line two"]
    assert "base_url" not in deliverable.sections[0].text


def test_deliverable_unclosed_fence_keeps_the_pasted_text() -> None:
    section = parse_deliverable("## chat.py\n```\n[fine]\n").sections[0]
    assert section.output_lines() == ["[fine]"]


def test_deliverable_student_is_folder_for_template_name_else_stem() -> None:
    assert parse_deliverable("", Path("class/alice/lab-04-02.md")).student == "alice"
    assert parse_deliverable("", Path("class/bob.md")).student == "bob"
