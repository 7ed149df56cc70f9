"""Reading deliverables as students write them: headings, bold labels, label lines, every fence."""

from __future__ import annotations

from pathlib import Path

from kinetic.grading.deliverable import normalize_name, parse_deliverable


def test_headings_title_and_comments() -> None:
    d = parse_deliverable("# Lab\n<!-- hint [x] -->\n## 1. chat.py\n```text\nout\n```\nprose\n## 2. Answer\nyes\n")
    assert [s.heading for s in d.sections] == ["1. chat.py", "2. Answer"]
    assert d.sections[0].lines == ["out", "prose"] and d.sections[0].prose == ["prose"]
    assert "hint" not in d.text


def test_level_one_headings_are_sections_when_there_is_nothing_deeper() -> None:
    d = parse_deliverable("# chat.py\nout\n# Answer\nyes\n")
    assert [s.heading for s in d.sections] == ["chat.py", "Answer"]


def test_bold_labels_and_text_on_the_label_line() -> None:
    d = parse_deliverable("**1. chat.py**\n\n~~~\nout\n~~~\n\n"
                          "- **Answer:** base_url and api_key\nmore\n__Risposta__\nsì\n")
    assert [s.heading for s in d.sections] == ["1. chat.py", "Answer", "Risposta"]
    assert d.sections[1].prose == ["base_url and api_key", "more"]


def test_label_lines_without_markdown_but_never_output_lines() -> None:
    d = parse_deliverable("chat.py --stream:\nPS C:\\lab> python chat.py\n[80 chunk, a: 1s]\nError 401:\nx\n")
    assert [s.heading for s in d.sections] == ["chat.py --stream", "Error 401"]


def test_fences_of_every_kind_and_an_unclosed_one() -> None:
    text = "## A\n~~~~console\n```\ninside\n~~~~\n## B\n    indented\n\tcode\n## C\n```\nnever closed\n"
    d = parse_deliverable(text)
    assert d.sections[0].lines == ["```", "inside"]  # a ``` inside ~~~~ is content
    assert d.sections[1].prose == [] and d.code_lines[-2:] == ["    indented", "\tcode"]
    assert d.sections[2].prose == ["```", "never closed"]  # a fence never closed is not one


def test_a_pasted_answer_cut_off_inside_its_own_fence_leaves_the_rest_of_the_file_alone() -> None:
    answer = "Here is a function:\n```python\ndef add(a, b):\n    return a +\n[finish_reason=length]"
    d = parse_deliverable(f"chat.py:\nPS C:\\lab> python chat.py\n{answer}\n\nAnswer:\nThe base_url.\n")
    assert d.sections[-1].heading == "Answer" and d.sections[-1].prose == ["The base_url."]


def test_a_pasted_answer_with_its_own_code_block_inside_the_students_fence() -> None:
    answer = "Sure:\n```python\nprint(1)\n```\nDone."
    d = parse_deliverable(f"## 1. chat.py\n```\n{answer}\n```\n## 2. Answer\nThe base_url.\n")
    assert d.sections[0].lines == answer.splitlines() and d.sections[0].prose == []
    assert d.sections[1].prose == ["The base_url."]
    cut = "Sure:\n```python\nprint(1"  # cut off inside the student's fence: the next section is still one
    d = parse_deliverable(f"## 1. chat.py\n```console\n{cut}\n```\n## 2. Answer\n```console\nx\n```\nyes\n")
    assert [s.heading for s in d.sections] == ["1. chat.py", "2. Answer"]
    assert d.sections[1].prose == ["yes"]


def test_json_objects_pasted_on_one_line_or_pretty() -> None:
    d = parse_deliverable('$ curl /health\n{"status":"ok"}\ntext {not json}\n```\n{\n  "a": {"b": 1}\n}\n```\n')
    assert d.json_objects() == [{"status": "ok"}, {"a": {"b": 1}}]


def test_student_from_name_line_folder_or_file() -> None:
    named = parse_deliverable("# Lab\n**Nome:** Mario Rossi\n", Path("sub/x/lab-04-02.md"))
    assert named.student == "Mario Rossi"
    moodle = parse_deliverable("", Path("sub/Anna Bianchi_123_assignsubmission_file_/lab-04-02.md"))
    assert moodle.student_candidates() == ["Anna Bianchi_123_assignsubmission_file_", "Anna Bianchi"]
    assert parse_deliverable("", Path("sub/lab-04-02-luca.verdi.md")).student_candidates() == [
        "lab-04-02-luca.verdi", "luca.verdi"]
    assert normalize_name("Mario Rossi") == normalize_name("mario.rossi") == normalize_name("MARIO-ROSSI")
