"""The OpenAI chat core through the real openai SDK against `kinetic serve` on the bundled model."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.conftest import MODEL_ALIAS
from tests.server import wait_until

MESSAGES = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "In one sentence, what is llama.cpp?"}]
# llama.cpp's logits are not bit-identical between a prompt evaluated whole and one resumed from the
# KV cache (llama-server documents this for cache_prompt), so runs compared token for token each
# evaluate their prompt from scratch.
COLD = {"cache_prompt": False}
LONG = 1900  # tokens: a minute or more of generation on the bundled model, within a slot's 2048
TIMING_KEYS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
               "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}


def metric(base_url: str, name: str) -> float:
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line.startswith(f"llamacpp:{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def slots(base_url: str) -> list[dict]:
    return httpx.get(base_url + "/slots").json()


def test_models_list_shows_alias(openai_client: openai.OpenAI) -> None:
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [MODEL_ALIAS]
    assert models.data[0].object == "model" and models.data[0].owned_by


def test_chat_full_response_usage_and_timings(openai_client: openai.OpenAI) -> None:
    r = openai_client.chat.completions.create(model="local", messages=MESSAGES, max_tokens=12,
                                              extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL_ALIAS
    assert r.system_fingerprint.startswith("b")
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in {"stop", "length"}
    assert r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    timings = r.model_extra["timings"]
    assert TIMING_KEYS <= set(timings)
    assert timings["prompt_n"] + timings["cache_n"] == r.usage.prompt_tokens
    assert timings["predicted_n"] == r.usage.completion_tokens
    assert all(v >= 0 for v in timings.values())
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 12


def test_chat_repeat_reuses_cache(openai_client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Tell me about caching in language model servers, please."}]
    first = openai_client.chat.completions.create(model="local", messages=messages, max_tokens=4,
                                                  extra_body={"id_slot": 0})
    second = openai_client.chat.completions.create(model="local", messages=messages, max_tokens=4,
                                                   extra_body={"id_slot": 0})
    n_prompt = second.usage.prompt_tokens
    assert first.model_extra["timings"]["cache_n"] < n_prompt - 1
    assert second.model_extra["timings"]["cache_n"] == n_prompt - 1  # all but the last token
    assert second.usage.prompt_tokens_details.cached_tokens == n_prompt - 1


def test_chat_stream_chunks_usage_and_ttft(openai_client: openai.OpenAI) -> None:
    started = time.perf_counter()
    stream = openai_client.chat.completions.create(model="local", messages=MESSAGES, max_tokens=10, stream=True,
                                                   stream_options={"include_usage": True})
    chunks, ttft = [], None
    for chunk in stream:
        chunks.append(chunk)
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - started
    total = time.perf_counter() - started
    first = chunks[0].choices[0].delta
    assert first.role == "assistant" and first.content is None
    assert len({c.id for c in chunks}) == 1
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason in {"stop", "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens <= 10
    assert set(chunks[-1].model_extra["timings"]) >= TIMING_KEYS
    content_chunks = [c for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) <= chunks[-1].usage.completion_tokens
    assert ttft is not None and 0 < ttft < total


def test_chat_stream_without_usage_puts_timings_on_finish_chunk(base_url: str) -> None:
    with httpx.stream("POST", base_url + "/v1/chat/completions", timeout=60,
                      json={"messages": MESSAGES, "max_tokens": 3, "stream": True}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    import json

    last = json.loads(lines[-2][len("data: "):])
    assert last["choices"][0]["delta"] == {} and "timings" in last and "usage" not in last


def test_completions_legacy_string_and_token_prompt(openai_client: openai.OpenAI) -> None:
    r = openai_client.completions.create(model="local", prompt="def add(a, b):", max_tokens=5, suffix="\n")
    assert r.object == "text_completion" and r.choices[0].finish_reason in {"stop", "length"}
    assert r.usage.completion_tokens <= 5 and "timings" in r.model_extra
    tokens = openai_client.completions.create(model="local", prompt=[2, 9259, 1902], max_tokens=3)
    assert tokens.usage.prompt_tokens == 3


def test_completions_stream_ends_with_usage(openai_client: openai.OpenAI) -> None:
    kwargs = dict(model="local", prompt="Once upon a time", max_tokens=4, temperature=0, extra_body=COLD)
    whole = openai_client.completions.create(**kwargs)
    chunks = list(openai_client.completions.create(stream=True, **kwargs))
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


STORY = [{"role": "user", "content": "Tell me a story."}]


def sampled(client: openai.OpenAI, **fields: object) -> str:
    """24 tokens exactly (ignore_eos), so two runs differ only where the sampler differs."""
    extra = {k: fields.pop(k) for k in ("top_k", "min_p", "repeat_penalty") if k in fields}
    r = client.chat.completions.create(model="local", messages=STORY, max_tokens=24, **fields,
                                       extra_body={"ignore_eos": True, **COLD, **extra})
    assert r.usage.completion_tokens == 24
    return r.choices[0].message.content


def test_top_k_1_is_greedy_whatever_the_seed(openai_client: openai.OpenAI) -> None:
    greedy = sampled(openai_client, temperature=0)
    assert sampled(openai_client, temperature=1.5, top_k=1, seed=1) == greedy
    assert sampled(openai_client, temperature=1.5, top_k=1, seed=2) == greedy
    assert sampled(openai_client, temperature=1.5, seed=1) != greedy  # without top_k the seed matters


def test_seed_fixes_the_sampled_text(openai_client: openai.OpenAI) -> None:
    # A wide distribution (no top-k, min-p or top-p cut) over 24 tokens: two seeds agreeing on all
    # of them is out of reach, while one seed always makes the same draws.
    wide = dict(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0)
    first = sampled(openai_client, seed=1234, **wide)
    assert sampled(openai_client, seed=1234, **wide) == first
    assert sampled(openai_client, seed=4321, **wide) != first
    assert sampled(openai_client, seed=99, **wide) != first


def test_repeat_penalty_changes_a_seeded_run(openai_client: openai.OpenAI) -> None:
    plain = sampled(openai_client, temperature=0.8, seed=7)
    assert sampled(openai_client, temperature=0.8, seed=7, repeat_penalty=1.0) == plain  # 1.0 is "off"
    assert sampled(openai_client, temperature=0.8, seed=7, repeat_penalty=1.5) != plain


def test_repeat_penalty_breaks_a_greedy_loop(openai_client: openai.OpenAI) -> None:
    def run(**extra: float) -> str:
        r = openai_client.completions.create(model="local", prompt="1, 1, 1, 1, 1, 1, 1, 1,", max_tokens=16,
                                             temperature=0, extra_body={"ignore_eos": True, **COLD, **extra})
        return r.choices[0].text

    looping = run()
    assert looping.startswith(" 1, 1, 1, 1,")  # what greedy decoding makes of this prompt
    assert run(repeat_penalty=1.5).count("1") < looping.count("1")


def test_sampling_fields_and_unknown_fields_accepted(openai_client: openai.OpenAI) -> None:
    fields = dict(model="local", messages=MESSAGES, max_completion_tokens=4, temperature=0.7, top_p=0.9, seed=42,
                  presence_penalty=0.5, frequency_penalty=0.5, stop=["\n\n", "###"])
    extra = {"top_k": 20, "min_p": 0.1, "typical_p": 0.9, "repeat_penalty": 1.1, "mirostat": 0, **COLD}
    r = openai_client.chat.completions.create(**fields, extra_body={**extra, "some_future_field": {"x": 1}})
    assert r.usage.completion_tokens <= 4
    # the unknown field is ignored, not half-applied: the same seeded run without it gives the same text
    again = openai_client.chat.completions.create(**fields, extra_body=extra)
    assert again.choices[0].message.content == r.choices[0].message.content


def test_stop_string_is_not_returned(openai_client: openai.OpenAI) -> None:
    # ignore_eos and greedy decoding: the 12-token continuation is fixed, so a piece of its middle is
    # certain to come up again when it is the stop string.
    kwargs = dict(model="local", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True, **COLD})
    text = openai_client.completions.create(**kwargs).choices[0].text
    assert len(text) >= 12, text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    r = openai_client.completions.create(**kwargs, stop=["NEVER!", stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[:text.index(stop)]


@pytest.mark.parametrize("overrides, field", [
    ({"n": 2}, "n"),
    ({"messages": []}, "messages"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 3.5}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_logprobs": 2}, "top_logprobs"),
])
def test_bad_request_names_field(openai_client: openai.OpenAI, overrides: dict, field: str) -> None:
    body = {"model": "local", "messages": MESSAGES, "max_tokens": 4, **overrides}
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(**body)
    assert info.value.status_code == 400
    assert field in info.value.message
    assert info.value.body["type"] == "invalid_request_error"


def test_prompt_longer_than_context_is_400(openai_client: openai.OpenAI) -> None:
    long_text = "word " * 2500
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model="local", messages=[{"role": "user", "content": long_text}],
                                              max_tokens=4)
    assert info.value.body["type"] == "exceed_context_size_error"
    assert info.value.body["n_ctx"] == 2048 and info.value.body["n_prompt_tokens"] > 2048


def test_stream_request_errors_are_plain_json(base_url: str) -> None:
    r = httpx.post(base_url + "/v1/chat/completions", json={"messages": [], "stream": True}, timeout=30)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize("raw", [b"{bad json", b"", b"[1, 2]", b'{"messages": "hi"}', b"\xff\xfe\x00{",
                                 b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "\xff"}'])
def test_malformed_bodies_are_400_and_server_keeps_serving(base_url: str, raw: bytes) -> None:
    r = httpx.post(base_url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(base_url + "/health").json() == {"status": "ok"}


def test_unknown_route_is_404(base_url: str) -> None:
    r = httpx.get(base_url + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["message"] == "File Not Found"


def test_disconnect_mid_stream_frees_slot(base_url: str) -> None:
    """A client that leaves a stream after its first token stops the generation: the slot is freed
    long before the tokens asked for could have been generated (they would take a minute or more)."""
    wait_until(lambda: not any(slot["is_processing"] for slot in slots(base_url)), "slots idle before the test")
    predicted_before = metric(base_url, "tokens_predicted_total")
    body = {"messages": MESSAGES, "max_tokens": LONG, "stream": True, "id_slot": 1, "ignore_eos": True}
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()  # held: a dropped iterator closes the stream
        next(line for line in lines if '"content":"' in line)  # leave after the first token
        assert slots(base_url)[1]["is_processing"]  # still generating when the client goes
    wait_until(lambda: not slots(base_url)[1]["is_processing"], "the slot is freed")
    # A generation that ran on to its max_tokens would have added LONG tokens; a stopped one far fewer.
    assert metric(base_url, "tokens_predicted_total") - predicted_before < LONG // 2
