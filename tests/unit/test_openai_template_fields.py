"""OpenAI chat fields llama-server adds around templates: `continue_final_message`, `reasoning_effort`,
`verbose` (the `__verbose` object)."""

from __future__ import annotations

import json

import pytest

from kinetic.engine.types import GenerationRequest, SamplingParams
from kinetic.protocols.common.translate import continuation
from kinetic.protocols.openai import translate
from tests.unit.test_openai_translate import answer_format, chat, finished


@pytest.mark.parametrize("raw, expected", [(True, "auto"), ("content", "content"),
                                           ("reasoning_content", "reasoning"), (False, None), (None, None),
                                           ("other", None)])
def test_continue_final_message_values(raw: object, expected: str | None) -> None:
    assert continuation(raw) == expected
    assert translate.to_chat_request(chat(continue_final_message=raw)).continue_final_message == expected


@pytest.mark.parametrize("effort, kwargs", [
    (None, {"a": 1}),
    ("none", {"a": 1, "enable_thinking": False}),
    ("high", {"a": 1, "reasoning_effort": "high"}),
])
def test_reasoning_effort_reaches_the_template(effort: str | None, kwargs: dict) -> None:
    request = chat(chat_template_kwargs={"a": 1}, reasoning_effort=effort)
    assert translate.to_chat_request(request).template_kwargs == kwargs


GENERATION = GenerationRequest(prompt_tokens=[1, 2, 3], sampling=SamplingParams(temperature=0.5, seed=1),
                               max_tokens=8)


@pytest.mark.parametrize("field, server, shown", [(None, False, False), (True, False, True), (None, True, True),
                                                  (False, True, False)])
def test_verbose_adds_the_native_result(field: bool | None, server: bool, shown: bool) -> None:
    ctx = translate.chat_context(chat(verbose=field), answer_format(), model="m", fingerprint="b",
                                 generation=GENERATION, verbose=server, prompt_text=lambda: "<bos>Book")
    body = translate.to_chat_completion([], finished("Hello"), ctx)
    assert ("__verbose" in body) is shown
    if shown:
        native = body["__verbose"]
        assert native["prompt"] == "<bos>Book" and native["content"] == "Hello" and native["stop"] is True
        assert native["tokens_evaluated"] == 7 and native["tokens_predicted"] == 2
        assert native["generation_settings"]["temperature"] == 0.5 and native["generation_settings"]["n_predict"] == 8


def test_verbose_rides_on_the_finishing_chunk_of_a_stream() -> None:
    ctx = translate.chat_context(chat(verbose=True, stream=True), answer_format(), model="m", fingerprint="b",
                                 generation=GENERATION, prompt_text=lambda: "P")
    encoder = translate.ChunkEncoder(ctx)
    frames = [f for event in (finished("x"),) for f in encoder.encode(event)]
    chunks = [json.loads(f.decode()[len("data: "):]) for f in frames if f.startswith(b"data: {")]
    assert [("__verbose" in c) for c in chunks] == [False, True]
    assert chunks[-1]["__verbose"]["prompt"] == "P" and chunks[-1]["choices"][0]["finish_reason"] == "stop"
