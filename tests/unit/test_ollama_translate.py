"""The Ollama translator, both directions, with no model."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from kinetic.backends.model_file import ModelFile, read_model_file
from kinetic.chat.toolcalls import ParsedCall
from kinetic.chat.types import AnswerFormat, MediaPart, TextPart, ToolCall
from kinetic.engine.types import (
    Finished,
    ModelInfo,
    TextDelta,
    Timings,
    TokenLogprob,
    TokenProb,
    Usage,
)
from kinetic.errors import InvalidRequestError, NotFoundError, ServerError
from kinetic.protocols.ollama import model_facts, replies, translate
from kinetic.protocols.ollama.types import ChatRequest, EmbedRequest, GenerateRequest

SERVED = model_facts.ServedModel(name="tiny", aliases=("tiny", "tiny-2"), thinks=False, n_ctx=2048)
THINKER = model_facts.ServedModel(name="tiny", aliases=("tiny",), thinks=True, n_ctx=2048)
HI = [{"role": "user", "content": "hi"}]
INFO = ModelInfo(path=Path("m.gguf"), architecture="gemma3", description="gemma3 270M Q4_K - Medium", n_vocab=10,
                 n_ctx_train=32768, n_embd=640, n_params=268098176, size=1, vocab_type=1, bos_token="<bos>",
                 eos_token="<eos>", bos_id=2, add_bos=True, chat_template=None,
                 metadata={"general.file_type": "15", "general.license": "gemma", "gemma3.block_count": "18",
                           "gemma3.rope.freq_base": "1000000.000000", "general.name": "Gemma"})
FILE = ModelFile(sha256="ab" * 32, size=253113024, modified=0.0)


def chat(**fields: Any) -> ChatRequest:
    return ChatRequest.model_validate({"model": "tiny", "messages": HI, **fields})


def finished(text: str, reason: str = "stop", tokens: list[int] | None = None) -> Finished:
    return Finished(finish_reason=reason, stop_type="eos" if reason == "stop" else "limit",  # type: ignore[arg-type]
                    stopping_word="", text=text, tokens=tokens or [7, 8],
                    usage=Usage(prompt_tokens=10, completion_tokens=2, cached_tokens=0),
                    timings=Timings(cache_n=0, prompt_n=10, prompt_ms=1.5, predicted_n=2, predicted_ms=20.25),
                    id_slot=0, tokens_cached=0, truncated=False)


def answer_format(mode: str = "none", reasoning_format: str = "auto") -> AnswerFormat:
    return AnswerFormat(starts_in_reasoning=False, reasoning_format=reasoning_format,
                        tool_mode=mode, tool_names=("get_weather",) if mode != "none" else ())  # type: ignore[arg-type]


def context(kind: str = "chat", mode: str = "none", **fields: Any) -> replies.ReplyContext:
    return replies.ReplyContext(model="tiny:latest", answer_format=answer_format(mode), started_ns=0, kind=kind,
                                **fields)


def lines(encoder: replies.LineEncoder, pieces: list[str], done: Finished) -> list[dict[str, Any]]:
    frames = [f for p in pieces for f in encoder.encode(TextDelta(text=p, token_id=1))] + encoder.encode(done)
    assert all(f.endswith(b"\n") and f.count(b"\n") == 1 for f in frames)  # NDJSON: no blank lines
    return [json.loads(f) for f in frames]


# ------------------------------------------------------------------------ model names


@pytest.mark.parametrize("name", ["tiny", "tiny:latest", "tiny-2", "tiny-2:latest"])
def test_check_model_accepts_the_name_aliases_and_latest(name: str) -> None:
    model_facts.check_model(name, SERVED)


def test_check_model_unknown_is_404_as_ollama_words_it() -> None:
    with pytest.raises(NotFoundError) as info:
        model_facts.check_model("llama3", SERVED)
    assert info.value.status == 404 and info.value.message == 'model "llama3" not found'
    with pytest.raises(NotFoundError):
        model_facts.check_model("tiny:7b", SERVED)


def test_check_model_missing_is_400() -> None:
    with pytest.raises(InvalidRequestError, match="model is required"):
        model_facts.check_model("", SERVED)


def test_check_model_latest_on_an_alias_that_has_it() -> None:
    model_facts.check_model("m", model_facts.ServedModel(name="m:latest", aliases=("m:latest",), thinks=False, n_ctx=1))


# ------------------------------------------------------------------------ inward


def test_options_map_to_sampling_limits_and_stops() -> None:
    req = translate.to_chat_request(chat(options={
        "temperature": 0.2, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 42, "repeat_penalty": 1.1,
        "presence_penalty": 0.3, "frequency_penalty": 0.4, "num_predict": 12, "stop": ["\n", "User:"],
        "num_gpu": 99, "mirostat": 0}), SERVED)
    assert req.options.sampling.chosen == {  # num_gpu is a load-time key: not a sampler
        "temperature": 0.2, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 42, "repeat_penalty": 1.1,
        "presence_penalty": 0.3, "frequency_penalty": 0.4, "mirostat": 0}
    assert req.options.max_tokens == 12 and req.options.stop == ("\n", "User:")


@pytest.mark.parametrize("num_predict, expected", [(None, None), (-1, -1), (-2, -1), (0, 0), (5, 5)])
def test_num_predict_infinite_and_fill_context_are_unlimited(num_predict: int | None, expected: int | None) -> None:
    options = {} if num_predict is None else {"num_predict": num_predict}
    assert translate.to_chat_request(chat(options=options), SERVED).options.max_tokens == expected


@pytest.mark.parametrize("options, field", [({"temperature": 9}, "options.temperature"),
                                            ({"top_p": 2}, "options.top_p"),
                                            ({"num_predict": -3}, "options.num_predict"),
                                            ({"num_ctx": 0}, "options.num_ctx"),
                                            ({"repeat_penalty": 0}, "options.repeat_penalty")])
def test_bad_option_values_name_the_option(options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        translate.to_chat_request(chat(options=options), SERVED)
    assert info.value.param == field and f"'{field}'" in info.value.message


@pytest.mark.parametrize("body", [{"model": "tiny", "messages": "hi"},
                                  {"model": "tiny", "messages": HI, "options": {"top_k": "many"}},
                                  {"model": "tiny", "messages": HI, "stream": [1]},
                                  {"model": "tiny", "messages": [{"role": "user", "content": 5}]},
                                  {"model": "tiny", "messages": HI, "think": "very"}])
def test_wrong_types_fail_wire_validation(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ChatRequest.model_validate(body)


def test_unknown_fields_are_accepted() -> None:
    req = chat(system="x", metadata={"a": 1}, truncate=True, shift=False, options={"penalize_newline": True})
    assert translate.to_chat_request(req, SERVED).messages[0].text == "hi"


def test_format_json_and_schema_become_constraints() -> None:
    assert not translate.to_chat_request(chat(format=""), SERVED).output.is_set
    assert translate.to_chat_request(chat(format="json"), SERVED).output.schema == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    out = translate.to_chat_request(chat(format=schema), SERVED).output
    assert out.schema == schema and out.param == "format"
    with pytest.raises(InvalidRequestError) as info:
        translate.to_chat_request(chat(format="yaml"), SERVED)
    assert info.value.param == "format"


def test_messages_map_images_thinking_tool_calls_and_results() -> None:
    req = translate.to_chat_request(chat(messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "images": ["aGk="]},  # Open WebUI leaves content out of an image-only turn
        {"role": "assistant", "content": "", "thinking": "hmm",
         "tool_calls": [{"id": "c1", "function": {"index": 0, "name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather", "tool_call_id": "c1"}]), SERVED)
    system, user, assistant, tool = req.messages
    assert system.parts == (TextPart("be brief"),)
    assert user.parts == (TextPart(""), MediaPart("images", "image", data=b"hi", param="messages[1].images[0]"))
    assert assistant.reasoning_content == "hmm"
    assert assistant.tool_calls == (ToolCall(name="get_weather", arguments={"city": "Rome"}, id="c1"),)
    assert tool.role == "tool" and tool.name == "get_weather" and tool.tool_call_id == "c1" and tool.text == "sunny"


def test_an_assistant_call_without_content_has_no_parts() -> None:
    req = translate.to_chat_request(chat(messages=HI + [
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]), SERVED)
    assert req.messages[1].parts is None


def test_tools_are_offered_never_forced_and_empty_tools_are_none() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "description": "d",
                                             "parameters": {"type": "object"}}}
    req = translate.to_chat_request(chat(tools=[tool]), SERVED)
    assert [t.name for t in req.tools] == ["get_weather"] and req.tool_choice.mode == "auto"
    assert translate.to_chat_request(chat(tools=[]), SERVED).tools == ()


def test_think_maps_to_the_template_switch() -> None:
    absent = translate.to_chat_request(chat(), THINKER)
    assert absent.template_kwargs == {} and absent.reasoning_format is None
    on = translate.to_chat_request(chat(think=True), THINKER)
    assert on.template_kwargs == {"enable_thinking": True} and on.reasoning_format == "deepseek"
    high = translate.to_chat_request(chat(think="high"), THINKER)
    assert high.template_kwargs == {"enable_thinking": True, "reasoning_effort": "high"}
    off = translate.to_chat_request(chat(think=False), SERVED)
    assert off.template_kwargs == {"enable_thinking": False} and off.reasoning_format == "none"


def test_think_on_a_model_without_thinking_is_400() -> None:
    with pytest.raises(InvalidRequestError, match='"tiny" does not support thinking'):
        translate.to_chat_request(chat(think=True), SERVED)


def test_top_logprobs_range_and_logprobs_ask_for_probabilities() -> None:
    with pytest.raises(InvalidRequestError, match="top_logprobs must be between 0 and 20"):
        translate.to_chat_request(chat(logprobs=True, top_logprobs=21), SERVED)
    assert translate.to_chat_request(chat(logprobs=True, top_logprobs=3), SERVED).options.n_probs == 3
    assert translate.to_chat_request(chat(logprobs=True), SERVED).options.n_probs == 1


def test_empty_messages_is_a_load_and_keep_alive_zero_an_unload() -> None:
    assert translate.is_load_request(chat(messages=[])) and translate.is_load_request(chat(messages=None))
    load = translate.load_reply(chat(messages=[]), SERVED)
    assert load["done"] is True and load["done_reason"] == "load" and load["message"]["content"] == ""
    unload = translate.load_reply(GenerateRequest(model="tiny", prompt="", keep_alive=0), SERVED)
    assert unload["done_reason"] == "unload" and unload["response"] == ""
    with pytest.raises(NotFoundError):
        translate.load_reply(chat(model="other", messages=[]), SERVED)


def test_generate_wraps_system_and_prompt_in_a_chat() -> None:
    req = translate.to_generate_chat(GenerateRequest(model="tiny", prompt="Why?", system="Be short."), SERVED)
    assert [(m.role, m.text) for m in req.messages] == [("system", "Be short."), ("user", "Why?")]


def test_generate_raw_is_a_prompt_and_refuses_what_raw_cannot_do() -> None:
    req = translate.to_prompt_request(GenerateRequest(model="tiny", prompt="Once", raw=True,
                                                      options={"num_predict": 3}), SERVED)
    assert req.prompt == "Once" and req.options.max_tokens == 3
    for extra in ({"system": "s"}, {"context": [1, 2]}):
        with pytest.raises(InvalidRequestError):
            translate.to_prompt_request(GenerateRequest(model="tiny", prompt="x", raw=True, **extra), SERVED)


def test_generate_images_go_with_the_prompt_templated_or_raw() -> None:
    body = GenerateRequest(model="tiny", prompt="what is it", images=["aGk=", "", "data:image/png;base64,aGk="])
    expected = (MediaPart("images", "image", data=b"hi", param="images[0]"),
                MediaPart("images", "image", data=b"hi", param="images[2]"))  # empty strings are skipped
    chat_req = translate.to_generate_chat(body, SERVED)
    assert chat_req.messages[-1].parts == (TextPart("what is it"), *expected)
    # raw: the prompt is left as sent; the chat layer puts the model's markers before it when it has none
    raw = translate.to_prompt_request(body.model_copy(update={"raw": True}), SERVED)
    assert raw.prompt == "what is it" and raw.media == expected


@pytest.mark.parametrize("fields, param", [
    ({"messages": [{"role": "user", "content": "x", "images": ["not base64!"]}]}, "messages[0].images[0]"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y", "images": ["aGk=", "%%"]}]},
     "messages[1].images[1]"),
])
def test_a_bad_image_is_a_400_naming_it(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        translate.to_chat_request(chat(**fields), SERVED)
    assert err.value.param == param and "Invalid base64 value" in err.value.message
    with pytest.raises(InvalidRequestError) as err:
        translate.to_generate_chat(GenerateRequest(model="tiny", prompt="x", images=["aGk=", "@"]), SERVED)
    assert err.value.param == "images[1]"


def test_generate_suffix_is_refused_without_fill_in_the_middle() -> None:
    with pytest.raises(InvalidRequestError, match="does not support insert") as info:
        translate.to_generate_chat(GenerateRequest(model="tiny", prompt="def f(", suffix="return"), SERVED)
    assert info.value.param == "suffix"


def test_stream_lines_then_a_final_line_with_metrics_in_nanoseconds() -> None:
    out = lines(replies.LineEncoder(context()), ["Hel", "lo"], finished("Hello", "length"))
    assert [o["message"]["content"] for o in out] == ["Hel", "lo", ""]
    assert all(o["model"] == "tiny:latest" and o["message"]["role"] == "assistant" for o in out)
    assert [o["done"] for o in out] == [False, False, True]
    final = out[-1]
    assert final["done_reason"] == "length"
    assert final["prompt_eval_count"] == 10 and final["eval_count"] == 2
    assert final["prompt_eval_duration"] == 1_500_000 and final["eval_duration"] == 20_250_000
    assert all(isinstance(final[k], int) for k in ("total_duration", "load_duration"))
    assert final["created_at"].endswith("Z")


def test_generate_lines_carry_response_and_the_final_context() -> None:
    ctx = context("generate", context=[2, 3])
    out = lines(replies.LineEncoder(ctx), ["a"], finished("a", tokens=[9]))
    assert out[0]["response"] == "a" and "message" not in out[0]
    assert out[-1]["context"] == [2, 3, 9] and out[-1]["response"] == ""


def test_thinking_streams_apart_from_content() -> None:
    ctx = replies.ReplyContext(model="m", answer_format=answer_format(reasoning_format="deepseek"), started_ns=0)
    out = lines(replies.LineEncoder(ctx), ["<think>hm", "m</think>", "Yes"], finished("<think>hmm</think>Yes"))
    thinking = "".join(o["message"].get("thinking", "") for o in out)
    content = "".join(o["message"]["content"] for o in out)
    assert thinking == "hmm" and content == "Yes"
    body = replies.to_response([], finished("<think>hmm</think>Yes"), ctx)
    assert body["message"]["thinking"] == "hmm" and body["message"]["content"] == "Yes"


CALL = '{"name": "get_weather", "arguments": {"city": "Rome"}}'


def test_a_call_streams_whole_with_arguments_as_an_object() -> None:
    out = lines(replies.LineEncoder(context(mode="auto")), [CALL[:20], CALL[20:]], finished(CALL))
    calls = [o["message"]["tool_calls"] for o in out if "tool_calls" in o["message"]]
    assert len(calls) == 1 and len(calls[0]) == 1
    function = calls[0][0]["function"]
    assert function == {"index": 0, "name": "get_weather", "arguments": {"city": "Rome"}}
    assert out[-1]["done"] is True and out[-1]["done_reason"] == "stop"  # Ollama has no tool_calls reason
    assert "".join(o["message"]["content"] for o in out) == ""


def test_non_streamed_call_and_plain_text() -> None:
    body = replies.to_response([], finished(CALL), context(mode="auto"))
    assert body["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Rome"}
    assert body["message"]["content"] == ""
    text = replies.to_response([], finished("Hi there"), context(mode="auto"))
    assert text["message"] == {"role": "assistant", "content": "Hi there"} and text["done"] is True


def test_tool_call_arguments_never_a_string() -> None:
    assert replies.tool_call(ParsedCall(name="f", arguments="not json"), 0)["function"]["arguments"] == {}
    assert replies.tool_call(ParsedCall(name="f", arguments="[1]"), 1)["function"]["arguments"] == {"value": [1]}
    assert replies.tool_call(ParsedCall(name="f", arguments="{}", id="x"), 0)["id"] == "x"


def test_logprobs_per_line_and_whole() -> None:
    lp = TokenLogprob(id=1, token="Hi", bytes=[72, 105], logprob=-0.5,
                      top_logprobs=[TokenProb(id=1, token="Hi", bytes=[72, 105], logprob=-0.5),
                                    TokenProb(id=2, token="Yo", bytes=[89, 111], logprob=-1.0)])
    ctx = context(n_probs=1)
    frames = replies.LineEncoder(ctx).encode(TextDelta(text="Hi", token_id=1, logprob=lp))
    entry = json.loads(frames[0])["logprobs"][0]
    assert entry["token"] == "Hi" and entry["logprob"] == -0.5 and len(entry["top_logprobs"]) == 1
    body = replies.to_response([TextDelta(text="Hi", token_id=1, logprob=lp)], finished("Hi"), ctx)
    assert len(body["logprobs"]) == 1


def test_a_failure_midway_is_a_last_error_line() -> None:
    frames = replies.LineEncoder(context()).error(ServerError("decode failed"))
    assert frames == [b'{"error":"decode failed"}\n']
    assert replies.error_body(NotFoundError('model "x" not found')) == {"error": 'model "x" not found'}


# ------------------------------------------------------------------ model listings


@pytest.mark.parametrize("n, text", [(268098176, "268.10M"), (8030261248, "8.0B"), (7_000_000_000, "7B"),
                                     (1_000_000, "1M"), (12_345, "12K"), (999, "999")])
def test_parameter_size_as_ollama_writes_it(n: int, text: str) -> None:
    assert model_facts.human_number(n) == text


def test_quantization_level_from_file_type_or_description() -> None:
    assert model_facts.quantization_level(INFO) == "Q4_K_M"
    assert model_facts.quantization_level(ModelInfo(**{**INFO.__dict__, "metadata": {}})) == "Q4_K_M"


def test_tags_entry_has_every_field_clients_read() -> None:
    entry = model_facts.tags(SERVED, INFO, FILE)["models"][0]
    assert entry["name"] == entry["model"] == "tiny"
    assert entry["size"] == 253113024 and entry["digest"] == "ab" * 32
    assert entry["modified_at"] == "1970-01-01T00:00:00Z"
    assert entry["details"] == {"parent_model": "", "format": "gguf", "family": "gemma3", "families": ["gemma3"],
                                "parameter_size": "268.10M", "quantization_level": "Q4_K_M"}


def test_ps_shows_the_resident_model() -> None:
    entry = model_facts.ps(SERVED, INFO, FILE)["models"][0]
    assert entry["model"] == "tiny" and entry["context_length"] == 2048 and entry["size_vram"] == 0
    assert entry["expires_at"] == model_facts.NEVER_EXPIRES


def test_show_has_model_info_parameters_and_capabilities() -> None:
    body = model_facts.show(THINKER, INFO, FILE, template="{{ messages }}", stop=("<eos>",), temperature=0.8)
    info = body["model_info"]
    assert info["general.architecture"] == "gemma3" and info["general.parameter_count"] == 268098176
    assert info["gemma3.context_length"] == 32768 and info["gemma3.embedding_length"] == 640
    assert info["gemma3.block_count"] == 18 and info["gemma3.rope.freq_base"] == 1e6
    assert body["license"] == "gemma" and body["template"] == "{{ messages }}"
    parsed = {}
    for line in body["parameters"].splitlines():  # the way Continue reads them
        key, value = line.split(None, 1)
        parsed[key] = value
    assert parsed["num_ctx"] == "2048" and json.loads(parsed["stop"]) == "<eos>"
    assert body["capabilities"] == ["completion", "tools", "thinking"]


# ------------------------------------------------------------------------ embeddings


def test_embed_inputs_string_list_and_empty() -> None:
    assert translate.embed_inputs(EmbedRequest(model="tiny", input="a"), SERVED) == (["a"], ["input"])
    assert translate.embed_inputs(EmbedRequest(model="tiny", input=["a", "b"]), SERVED)[1] == ["input[0]", "input[1]"]
    assert translate.embed_inputs(EmbedRequest(model="tiny", input=""), SERVED) == ([], [])
    with pytest.raises(NotFoundError):
        translate.embed_inputs(EmbedRequest(model="x", input="a"), SERVED)
    with pytest.raises(ValueError):
        EmbedRequest.model_validate({"model": "tiny", "input": [1, 2]})


def test_dimensions_shorten_and_renormalise() -> None:
    vector = translate.shorten([0.6, 0.8, 0.0, 0.0], 1)
    assert vector == [1.0]
    assert math.isclose(sum(v * v for v in translate.shorten([0.5, 0.5, 0.5, 0.5], 2)), 1.0)
    with pytest.raises(InvalidRequestError):
        translate.check_dimensions(641, 640)
    body = translate.to_embed_response(EmbedRequest(model="tiny", input="a", dimensions=2), 3,
                                       [[0.5, 0.5, 0.5, 0.5]], 0)
    assert len(body["embeddings"][0]) == 2 and body["prompt_eval_count"] == 3


def test_model_file_digest_is_the_sha256_of_the_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINETIC_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 5000)
    facts = read_model_file(gguf)
    assert facts.sha256 == hashlib.sha256(gguf.read_bytes()).hexdigest() and facts.size == gguf.stat().st_size
    missing = read_model_file(tmp_path / "nope.gguf")  # a test engine's model is no file
    assert len(missing.sha256) == 64 and missing.size == 0


def test_model_file_digest_is_remembered_until_the_file_changes(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINETIC_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"a" * 1000)
    first = read_model_file(gguf)
    assert (tmp_path / "cache" / "digests.json").exists()
    calls: list[int] = []
    assert read_model_file(gguf, busy=lambda: bool(calls.append(1))) == first
    assert not calls  # served from the cache: nothing hashed
    gguf.write_bytes(b"GGUF" + b"b" * 2000)
    changed = read_model_file(gguf, busy=lambda: bool(calls.append(1)))
    assert changed.sha256 == hashlib.sha256(gguf.read_bytes()).hexdigest() != first.sha256
    assert calls  # hashed again, asking between chunks whether the engine is busy
