"""The lab handouts as the site shows them: annotated lines that are the lab script's own, no instructors' section."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# each lab whose README walks through its script's lines, and that script
ANNOTATED = {"lab-04-02-client-openai": "chat.py", "lab-04-05-images": "see.py"}
ANNOTATION = re.compile(r"\s*# \((\d+)\)!\s*$")


def squeeze(code: str) -> str:
    """Code without comments and whitespace, so wrapped lines compare equal."""
    return re.sub(r"\s+", "", "\n".join(line.split("#", 1)[0] for line in code.splitlines()))


def annotated_block(readme: str) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    with_markers = [block for block in blocks if "(1)!" in block]
    assert len(with_markers) == 1, "the lab README should have one annotated python block"
    return with_markers[0].splitlines()


@pytest.mark.parametrize("lab", sorted(ANNOTATED))
def test_annotated_lines_are_the_scripts_lines(lab: str) -> None:
    readme = (ROOT / "labs" / lab / "README.md").read_text(encoding="utf-8")
    lines = annotated_block(readme)
    markers = [int(m.group(1)) for line in lines if (m := ANNOTATION.search(line))]
    assert markers == [1, 2, 3]
    script = squeeze((ROOT / "labs" / lab / ANNOTATED[lab]).read_text(encoding="utf-8"))
    statement = ""
    for line in lines:
        statement += ANNOTATION.sub("", line) + "\n"
        if ANNOTATION.search(line):  # one annotated statement ends here (it may span lines)
            assert squeeze(statement) in script, f"not in {ANNOTATED[lab]}: {statement.strip()!r}"
            statement = ""


@pytest.mark.parametrize("lab", sorted(ANNOTATED))
def test_annotations_follow_the_block_as_a_three_item_list(lab: str) -> None:
    readme = (ROOT / "labs" / lab / "README.md").read_text(encoding="utf-8")
    after = readme.split("# (3)!", 1)[1].split("```", 1)[1]
    items = re.findall(r"^\s+(\d)\. ", after.split("\n4. ", 1)[0], flags=re.M)
    assert items == ["1", "2", "3"]


def test_students_handouts_have_no_grading_section() -> None:
    """What instructors need to grade is in the site's instructor part, not in the students' lab text."""
    readmes = sorted((ROOT / "labs").glob("lab-*/README.md"))
    assert len(readmes) >= 2
    for readme in readmes:
        text = readme.read_text(encoding="utf-8")
        assert "For instructors" not in text and "--ledger" not in text, f"{readme.parent.name}: grading notes"
    guide = (ROOT / "docs" / "grading.md").read_text(encoding="utf-8")
    for lab in ("lab-04-01", "lab-04-02", "lab-04-03", "lab-04-04", "lab-04-05"):
        assert f"## {lab.capitalize().replace('-', ' ', 1)}: what each check looks at" in guide
    assert "autograding-command-grader" in guide


def test_lab_pages_add_no_second_title() -> None:
    for page in (ROOT / "docs" / "labs").glob("lab-*.md"):
        text = page.read_text(encoding="utf-8")
        assert "--8<--" in text and not re.search(r"^# ", text, flags=re.M), (
            f"{page.name}: the included README already has the title")


def test_labs_index_links_every_lab_page() -> None:
    index = (ROOT / "docs" / "labs" / "index.md").read_text(encoding="utf-8")
    for page in (ROOT / "docs" / "labs").glob("lab-*.md"):
        assert f"]({page.name})" in index, f"docs/labs/index.md does not link {page.name}"
