"""The chat chunk encoder's tool-call frames, fed engine events by hand (no model needed)."""

from __future__ import annotations

import json
from typing import Any

from kinetic.chat.types import AnswerFormat
from kinetic.engine.types import Finished, TextDelta, Timings, Usage
from kinetic.protocols.openai.translate import ChatContext, ChunkEncoder, to_chat_completion


def context(mode: str) -> ChatContext:
    answer_format = AnswerFormat(starts_in_reasoning=False, reasoning_format="none",
                            tool_mode=mode, tool_names=("get_weather",))  # type: ignore[arg-type]
    return ChatContext(id="chatcmpl-x", created=0, model="m", answer_format=answer_format, top_logprobs=None,
                       include_usage=False, fingerprint="b0")


def finished(text: str, reason: str = "stop") -> Finished:
    return Finished(finish_reason=reason, stop_type="eos", stopping_word="", text=text, tokens=[],  # type: ignore[arg-type]
                    usage=Usage(prompt_tokens=5, completion_tokens=9, cached_tokens=0),
                    timings=Timings(cache_n=0, prompt_n=5, prompt_ms=1.0, predicted_n=9, predicted_ms=1.0),
                    id_slot=0, tokens_cached=0, truncated=False)


def run(mode: str, pieces: list[str], reason: str = "stop") -> list[dict[str, Any]]:
    encoder = ChunkEncoder(context(mode))
    frames: list[bytes] = []
    for i, piece in enumerate(pieces):
        frames += encoder.encode(TextDelta(text=piece, token_id=i))
    frames += encoder.encode(finished("".join(pieces), reason))
    datas = [f.decode()[len("data: "):].strip() for f in frames]
    assert datas[-1] == "[DONE]"
    return [json.loads(d) for d in datas[:-1]]


def collect(chunks: list[dict[str, Any]]) -> tuple[str, dict[int, dict[str, str]], str]:
    content, calls, finish = "", {}, ""
    for chunk in chunks:
        choice = chunk["choices"][0]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for call in delta.get("tool_calls", []):
            entry = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
            if "id" in call:
                entry["id"], entry["name"] = call["id"], call["function"]["name"]
            entry["arguments"] += call["function"]["arguments"]
        finish = choice["finish_reason"] or finish
    return content, calls, finish


def test_auto_mode_streams_text_then_a_parsed_call() -> None:
    pieces = ["Checking", " now. <tool", '_call>{"name": "get_weather", ', '"arguments": {"city": "Rome"}}',
              "</tool_call>"]
    content, calls, finish = collect(run("auto", pieces))
    assert content == "Checking now."  # as the whole answer parses it: the space before the call is not content
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Rome"}
    assert len(calls[0]["id"]) == 32 and finish == "tool_calls"


def test_auto_mode_plain_text_is_unchanged() -> None:
    content, calls, finish = collect(run("auto", ["It is", " <sunny>", " today."]))
    assert content == "It is <sunny> today." and calls == {} and finish == "stop"


def test_forced_mode_cut_short_keeps_partial_call_and_length() -> None:
    chunks = run("forced", ['{"name": "get_weather", ', '"arguments": {"ci'], reason="length")
    content, calls, finish = collect(chunks)
    assert calls[0]["name"] == "get_weather" and calls[0]["arguments"] == '{"ci' and finish == "length"


def test_non_stream_forced_and_truncated() -> None:
    whole = to_chat_completion([], finished('{"name": "get_weather", "arguments": {"city": "Rome"}}'),
                               context("forced"))
    message = whole["choices"][0]["message"]
    assert message["content"] is None and whole["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Rome"}
    cut = to_chat_completion([], finished('{"name": "get_weather", "argu', "length"), context("forced"))
    assert cut["choices"][0]["message"] == {"role": "assistant", "content": '{"name": "get_weather", "argu'}
    assert cut["choices"][0]["finish_reason"] == "length"
