"""llama-server's native translator with no model: /completion inward, results, stream events,
/slots, /metrics (server_state) and /tokenize (tokens, over a backend) outward."""

from __future__ import annotations

import asyncio
import json

import pytest

from kinetic.chat.types import MediaPart
from kinetic.config.settings import ServerSettings
from kinetic.engine.types import (
    EngineStats,
    Finished,
    GenerationRequest,
    SamplingParams,
    SlotState,
    TextDelta,
    Timings,
    Usage,
)
from kinetic.errors import InvalidRequestError
from kinetic.protocols.llamacpp import metrics, server_state, tokens, translate
from kinetic.protocols.llamacpp.types import CompletionRequest, TokenizeRequest
from tests.scripted import ScriptedEngine, single_model_backend


def finished() -> Finished:
    return Finished(finish_reason="stop", stop_type="word", stopping_word="\n", text="ab", tokens=[97, 98],
                    usage=Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=1),
                    timings=Timings(cache_n=1, prompt_n=4, prompt_ms=1.0, predicted_n=2, predicted_ms=1.0),
                    id_slot=1, tokens_cached=7, truncated=False)


def test_to_prompt_request_fields() -> None:
    [req] = translate.to_prompt_requests(CompletionRequest(prompt="hi", n_predict=-1, n_probs=2, top_k=1,
                                                           json_schema={"type": "object"}, id_slot=1))
    assert req.prompt == "hi" and req.options.max_tokens == -1 and req.options.n_probs == 2
    assert req.options.sampling.get("top_k") == 1 and req.options.id_slot == 1
    assert req.output.schema == {"type": "object"} and req.output.param == "json_schema"
    with pytest.raises(InvalidRequestError) as err:
        translate.to_prompt_requests(CompletionRequest(prompt="hi", n_predict=-2))
    assert err.value.param == "n_predict"


@pytest.mark.parametrize("logit_bias", [{"496": False}, [[496, False]]])
def test_logit_bias_false_bans_the_token_in_both_forms(logit_bias: object) -> None:
    # pydantic's lax float once read `false` as 0.0: a ban that changed nothing
    [req] = translate.to_prompt_requests(CompletionRequest.model_validate({"prompt": "hi", "logit_bias": logit_bias}))
    assert req.options.sampling.logit_bias == {496: float("-inf")}


def test_logprobs_is_n_probs() -> None:
    [req] = translate.to_prompt_requests(CompletionRequest(prompt="hi", logprobs=3))
    assert req.options.n_probs == 3


def test_grammar_wins_over_json_schema_on_completion() -> None:
    [req] = translate.to_prompt_requests(CompletionRequest(prompt="hi", grammar='root ::= "a"',
                                                           json_schema={"type": "object"}))
    assert req.output.grammar == 'root ::= "a"' and req.output.schema is None


@pytest.mark.parametrize(("prompt", "expected"), [
    ("text", ["text"]),
    ([12, 34], [[12, 34]]),
    ([12, "text", 34], [[12, "text", 34]]),  # mixed: one prompt
    (["a", "b"], ["a", "b"]),  # no number at the top level: several prompts
    (["a", [1, 2], [3, "x"]], ["a", [1, 2], [3, "x"]]),
    ({"prompt_string": "text"}, ["text"]),  # llama-server's multimodal object, text only
])
def test_prompt_shapes(prompt: object, expected: list) -> None:
    assert translate.prompt_inputs(prompt) == expected


@pytest.mark.parametrize(("prompt", "message"), [
    ([], '"prompt" must not be empty'),
    ({"x": 1}, translate.PROMPT_ELEMENTS),
    (["a", []], translate.PROMPT_ELEMENTS),
    (["a", [1.5]], translate.PROMPT_ELEMENTS),
    ({"prompt_string": "x", "multimodal_data": ["aGk="]},  # /embedding's prompts: text only
     "multimodal_data is not supported here: embeddings are of text only"),
])
def test_bad_prompt_shapes(prompt: object, message: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        translate.prompt_inputs(prompt)
    assert err.value.message == message and err.value.param == "prompt"


def test_a_multimodal_prompt_object_carries_its_files() -> None:
    marker = "<__media__>"
    [req] = translate.to_prompt_requests(CompletionRequest(prompt={
        "prompt_string": f"{marker} and {marker}: which is bigger?", "multimodal_data": ["aGk=", "aG8="]}))
    assert req.prompt == f"{marker} and {marker}: which is bigger?" and req.param == "prompt"
    assert req.media == (MediaPart("multimodal_data", "image", data=b"hi", param="prompt.multimodal_data[0]"),
                         MediaPart("multimodal_data", "image", data=b"ho", param="prompt.multimodal_data[1]"))


def test_several_multimodal_prompts_are_several_requests_each_with_its_files() -> None:
    reqs = translate.to_prompt_requests(CompletionRequest(prompt=[
        "plain", {"prompt_string": "<m> one", "multimodal_data": ["aGk="]}, {"prompt_string": "none"}]))
    assert [(r.prompt, r.param) for r in reqs] == [("plain", "prompt[0]"), ("<m> one", "prompt[1]"),
                                                 ("none", "prompt[2]")]
    assert [r.media for r in reqs] == [
        (), (MediaPart("multimodal_data", "image", data=b"hi", param="prompt[1].multimodal_data[0]"),), ()]


@pytest.mark.parametrize("prompt, param", [
    ({"prompt_string": "x", "multimodal_data": ["aGk=", "not base64"]}, "prompt.multimodal_data[1]"),
    ({"prompt_string": "x", "multimodal_data": "aGk="}, "prompt.multimodal_data"),
    ({"prompt_string": "x", "multimodal_data": [1]}, "prompt.multimodal_data"),
    (["a", {"prompt_string": "x", "multimodal_data": [""]}], "prompt[1].multimodal_data[0]"),
])
def test_bad_multimodal_data_is_a_400_naming_the_file(prompt: object, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        translate.to_prompt_requests(CompletionRequest(prompt=prompt))
    assert err.value.param == param


def test_final_result_and_stream_events() -> None:
    generation = GenerationRequest(prompt_tokens=[1, 2], sampling=SamplingParams(seed=-1), max_tokens=8)
    ctx = translate.native_context(CompletionRequest(prompt="hi", return_tokens=True), generation,
                                   model="m", prompt_text="hi")
    body = translate.to_completion([], finished(), ctx)
    assert body["content"] == "ab" and body["tokens"] == [97, 98] and body["stop_type"] == "word"
    assert body["tokens_evaluated"] == 5 and body["tokens_cached"] == 7 and body["timings"]["cache_n"] == 1
    assert body["generation_settings"]["seed"] == 4294967295 and body["generation_settings"]["n_predict"] == 8
    encoder = translate.NativeEncoder(ctx)
    first = json.loads(encoder.encode(TextDelta(text="a", token_id=97))[0].decode().removeprefix("data: "))
    assert first == {"index": 0, "content": "a", "tokens": [97], "stop": False, "id_slot": -1, "tokens_predicted": 1,
                     "tokens_evaluated": 2}
    last = json.loads(encoder.encode(finished())[0].decode().removeprefix("data: "))
    assert last["stop"] is True and last["content"] == ""


def test_slots_and_metrics_from_engine_state() -> None:
    states = [SlotState(id=0, is_processing=True, used=True, n_prompt_tokens=9, n_prompt_tokens_processed=4,
                        n_prompt_tokens_cache=5, n_decoded=3),
              SlotState(id=1, is_processing=False, used=False, n_prompt_tokens=0, n_prompt_tokens_processed=0,
                        n_prompt_tokens_cache=0, n_decoded=0)]
    busy, idle = server_state.slots(states, 1024)
    assert busy["n_prompt_tokens_cache"] == 5 and busy["next_token"][0]["n_decoded"] == 3 and busy["n_ctx"] == 1024
    assert idle == {"id": 1, "n_ctx": 1024, "speculative": False, "is_processing": False}
    text = metrics.metrics_text(EngineStats(counters={"prompt_tokens_total": 12}, requests_processing=1,
                                              requests_deferred=2))
    assert "llamacpp:prompt_tokens_total 12" in text and "llamacpp:requests_deferred 2" in text
    assert "# TYPE llamacpp:requests_processing gauge" in text


def test_tokenize_mixes_text_and_ids_and_shows_pieces() -> None:
    backend = single_model_backend(ServerSettings(), ScriptedEngine([]), "m")
    body = TokenizeRequest(content=["ab", 7], with_pieces=True)

    async def answers() -> tuple[list[int], list[bytes], str]:
        ids = await backend.tokenize(tokens.tokenize_parts(body), add_special=False, parse_special=True)
        return ids, await backend.token_pieces(ids), await backend.detokenize([104, 105, 9999])

    ids, pieces, text = asyncio.run(answers())
    assert tokens.tokenize_answer(ids, pieces) == {
        "tokens": [{"id": 97, "piece": "a"}, {"id": 98, "piece": "b"}, {"id": 7, "piece": "\x07"}]}
    assert tokens.tokenize_answer(ids, None) == {"tokens": [97, 98, 7]}
    assert tokens.tokenize_parts(TokenizeRequest(content=None)) == [] and text == "hi"
    assert tokens.piece_text(b"\xe2\x82") == [0xE2, 0x82]  # half a character: its bytes


def test_n_cmpl_repeats_each_prompt_with_shifted_seeds() -> None:
    reqs = translate.to_prompt_requests(CompletionRequest(prompt=["a", "b"], n_cmpl=2, seed=7), n_slots=4)
    assert [(r.prompt, r.options.sampling.get("seed"), r.param) for r in reqs] == [
        ("a", 7, "prompt[0]"), ("a", 8, "prompt[0]"), ("b", 7, "prompt[1]"), ("b", 8, "prompt[1]")]
    unseeded = translate.to_prompt_requests(CompletionRequest(prompt="a", n=3), n_slots=3)
    assert [r.options.sampling.get("seed") for r in unseeded] == [None, None, None]  # `n` is n_cmpl's alias


@pytest.mark.parametrize("fields, param", [({"n_cmpl": 0}, "n_cmpl"), ({"n_cmpl": 3}, "n_cmpl"), ({"n": 5}, "n")])
def test_n_cmpl_is_bounded_by_the_slots(fields: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        translate.to_prompt_requests(CompletionRequest(prompt="a", **fields), n_slots=2)
    assert err.value.param == param and "Value must be between 1 <= value <= 2" in err.value.message
