"""LoadedModel.tokenize keeps the tokens of the last short texts (model.py: CACHED_TEXTS): a text sent again is not
tokenized again, and what it returns is what llama_tokenize gives, whatever the flags, copy by copy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import llama_cpp
import pytest

from kinetic.engine.llama import model as model_module
from kinetic.engine.llama.model import LoadedModel
from tests.hybrid_model import tiny_model


@pytest.fixture(scope="module")
def model() -> LoadedModel:
    return LoadedModel(tiny_model("lfm2"))  # Gemma's vocabulary, with its 6414 special tokens


@pytest.fixture()
def calls(model: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bytes]]:
    """The texts llama_tokenize is called with from now on (the cache starts empty)."""
    seen: list[bytes] = []
    tokenize = llama_cpp.llama_tokenize

    def counting(vocab: Any, data: bytes, *args: Any) -> int:
        seen.append(data)
        return int(tokenize(vocab, data, *args))

    monkeypatch.setattr(llama_cpp, "llama_tokenize", counting)
    model._tokens.clear()
    yield seen
    model._tokens.clear()


TEXTS = ["Hello", "<start_of_turn>user\nWhat is a slot?<end_of_turn>\n", "", " and then", "é ü 漢字 🙂"]


@pytest.mark.parametrize("add_special", [True, False])
@pytest.mark.parametrize("parse_special", [True, False])
def test_a_text_tokenized_again_gives_the_same_tokens_without_llama_tokenize(
        model: LoadedModel, calls: list[bytes], add_special: bool, parse_special: bool) -> None:
    first = [model.tokenize(t, add_special=add_special, parse_special=parse_special) for t in TEXTS]
    n_calls = len(calls)
    again = [model.tokenize(t, add_special=add_special, parse_special=parse_special) for t in TEXTS]
    assert again == first and len(calls) == n_calls
    assert first == [model._tokenize(t, add_special, parse_special) for t in TEXTS]


def test_the_flags_are_part_of_what_is_remembered(model: LoadedModel, calls: list[bytes]) -> None:
    text = "<start_of_turn>user"
    with_bos = model.tokenize(text, add_special=True, parse_special=True)
    without_bos = model.tokenize(text, add_special=False, parse_special=True)
    as_text = model.tokenize(text, add_special=False, parse_special=False)
    assert with_bos[0] == model.info.bos_id and with_bos[1:] == without_bos
    assert len(without_bos) < len(as_text)  # the marker is one special token, or several pieces of text
    assert len(calls) == 3


def test_a_caller_that_changes_its_list_changes_nobody_elses(model: LoadedModel, calls: list[bytes]) -> None:
    tokens = model.tokenize("Hello there")
    expected = list(tokens)
    tokens.append(7)
    tokens[0] = 1
    assert model.tokenize("Hello there") == expected


def test_the_least_recently_used_text_goes_and_a_long_text_is_never_kept(
        model: LoadedModel, calls: list[bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_module, "CACHED_TEXTS", 3)
    for text in ("one", "two", "three", "one", "four"):  # "one" used again: "two" is the oldest when "four" comes
        model.tokenize(text)
    calls.clear()
    model.tokenize("one")
    model.tokenize("two")
    assert calls == [b"two"]
    long_text = "word " * (model_module.CACHED_TEXT_CHARS // 5 + 1)
    assert model.tokenize(long_text) == model.tokenize(long_text)
    assert calls.count(long_text.encode()) == 2 and len(model._tokens) <= 3
