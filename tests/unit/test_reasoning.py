import pytest

from kinetic.chat.reasoning import ReasoningSplitter


def split_all(splitter: ReasoningSplitter, pieces: list[str]) -> tuple[str, str]:
    reasoning, content = "", ""
    for piece in pieces:
        r, c = splitter.push(piece)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.flush()
    return reasoning + r, content + c


PIECES = ["<thi", "nk>\nLet me ", "think.</th", "ink>\n\nThe answer", " is 4."]


def test_auto_splits_think_block_across_pieces() -> None:
    assert split_all(ReasoningSplitter("auto"), PIECES) == ("Let me think.", "The answer is 4.")


def test_none_keeps_everything_in_content() -> None:
    assert split_all(ReasoningSplitter("none"), PIECES) == ("", "".join(PIECES))


def test_legacy_keeps_tags_in_content_and_fills_reasoning() -> None:
    reasoning, content = split_all(ReasoningSplitter("deepseek-legacy"), PIECES)
    assert reasoning == "Let me think."
    assert content.startswith("<think>") and "</think>" in content and content.endswith("is 4.")


def test_prompt_opened_think_block() -> None:
    splitter = ReasoningSplitter("auto", starts_inside=True)
    assert split_all(splitter, ["hmm", "</think>", "ok"]) == ("hmm", "ok")


@pytest.mark.parametrize("text", ["no tags at all", "a < b and c > d", "<thinking is fun"])
def test_text_without_block_is_content(text: str) -> None:
    assert split_all(ReasoningSplitter("auto"), [text[:3], text[3:]]) == ("", text)
