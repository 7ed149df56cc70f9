"""llama-server's sampler fields reach llama.cpp's chain, and each does what it does there: a sampler
set to keep only the likeliest token makes a seeded run greedy, a banned token never comes, XTC
takes the top choice away, DRY breaks a loop; the rest are echoed in `generation_settings`. The base
model writes nonsense, so the tests compare runs with each other, never with expected wording."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

STORY = {"prompt": "Once upon a time", "n_predict": 16, "seed": 42, "temperature": 1.0}
# A prompt the greedy model continues by repeating it ("... one two" -> " three")
REPEATING = {"prompt": "one two three one two three one two three one two three one two", "temperature": 0}


def complete(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(base_url + "/completion", json={"return_tokens": True, **body}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def tokens(base_url: str, body: dict[str, Any]) -> list[int]:
    return complete(base_url, body)["tokens"]


GREEDY = {**STORY, "temperature": 0}


def test_seeded_run_repeats_and_is_not_greedy(base_url: str) -> None:
    # the preconditions of every comparison below: a seeded run repeats, and it is not the greedy one,
    # so a sampler that leaves only the likeliest token shows by turning it greedy
    assert tokens(base_url, STORY) == tokens(base_url, STORY) != tokens(base_url, GREEDY)


@pytest.mark.parametrize("keep_only_the_top", [
    {"min_p": 1.0},  # keeps tokens at least as likely as the likeliest
    {"top_n_sigma": 1e-6},  # keeps logits within a millionth of a standard deviation of the largest
    {"mirostat": 1, "mirostat_tau": 0.0},  # a target surprise of 0 bits leaves one candidate
    {"mirostat": 2, "mirostat_tau": 0.0},
])
def test_a_sampler_that_keeps_only_the_top_token_is_greedy(base_url: str, keep_only_the_top: dict[str, Any]) -> None:
    assert tokens(base_url, {**STORY, **keep_only_the_top}) == tokens(base_url, GREEDY)


@pytest.mark.parametrize("change", [
    {"mirostat": 2}, {"mirostat": 2, "mirostat_tau": 1.0}, {"dynatemp_range": 0.9},
    {"temperature": 2.0, "samplers": ["temperature"]},
])
def test_sampler_changes_a_seeded_run_and_is_echoed(base_url: str, change: dict[str, Any]) -> None:
    body = complete(base_url, {**STORY, **change})
    assert body["tokens"] != tokens(base_url, STORY)
    settings = body["generation_settings"]
    assert {key: settings[key] for key in change} == change


def test_top_k_alone_with_k_1_is_greedy(base_url: str) -> None:
    greedy = tokens(base_url, GREEDY)
    assert tokens(base_url, {**STORY, "samplers": ["top_k"], "top_k": 1}) == greedy
    assert tokens(base_url, {**STORY, "seed": 7, "samplers": ["nonsense", "Top-K"], "top_k": 1}) == greedy
    assert tokens(base_url, {**STORY, "samplers": "k", "top_k": 1}) == greedy  # llama.cpp's one-letter codes


def test_without_samplers_the_pick_is_unrestricted(base_url: str) -> None:
    # an empty chain (only the random pick) differs from the default one on the same seed
    assert tokens(base_url, {**STORY, "samplers": []}) != tokens(base_url, STORY)


def test_a_banned_token_never_comes(base_url: str) -> None:
    greedy = tokens(base_url, GREEDY)
    banned = sorted(set(greedy))
    # llama.cpp's array form (`false` bans the token) and OpenAI's object form (-100 bans it)
    for ban in ([[token, False] for token in banned], {str(token): -100 for token in banned}):
        generated = tokens(base_url, {**GREEDY, "logit_bias": ban})
        assert len(generated) == len(greedy) and not set(generated) & set(banned), (ban, generated)


def test_xtc_removes_the_top_choice(base_url: str) -> None:
    """With probability 1, XTC drops every token above the threshold but the least likely of them:
    the greedy pick is never the likeliest token. Above a threshold of 0.5 it does nothing."""
    greedy = tokens(base_url, {**GREEDY, "n_predict": 1})
    xtc = complete(base_url, {**GREEDY, "n_predict": 1, "xtc_probability": 1.0, "xtc_threshold": 0.01})
    assert xtc["tokens"] != greedy
    assert (xtc["generation_settings"]["xtc_probability"], xtc["generation_settings"]["xtc_threshold"]) == (1.0, 0.01)
    assert tokens(base_url, {**GREEDY, "n_predict": 1, "xtc_probability": 1.0, "xtc_threshold": 0.6}) == greedy


def test_dry_breaks_a_repetition(base_url: str) -> None:
    """The greedy model continues the loop; DRY penalises the token that would repeat it again."""
    plain = tokens(base_url, {**REPEATING, "n_predict": 6})
    three = httpx.post(base_url + "/tokenize", json={"content": " three"}, timeout=30).json()["tokens"]
    assert plain[:len(three)] == three  # the loop goes on: "... one two" -> " three"
    dry = tokens(base_url, {**REPEATING, "n_predict": 6, "dry_multiplier": 2.0, "dry_allowed_length": 1,
                            "dry_penalty_last_n": 64})
    assert dry[0] != three[0]


def test_penalties_see_the_prompt(base_url: str) -> None:
    """The first generated token already avoids prompt tokens: llama-server feeds the prompt to
    the penalty sampler before sampling, and kinetic does the same."""
    plain = tokens(base_url, {**REPEATING, "n_predict": 1})
    penalised = tokens(base_url, {**REPEATING, "n_predict": 1, "repeat_penalty": 3.0, "repeat_last_n": 64})
    assert penalised != plain
    off = tokens(base_url, {**REPEATING, "n_predict": 1, "repeat_penalty": 3.0, "repeat_last_n": 0})
    assert off == plain  # a window of 0 tokens penalises nothing
    without_penalties = {**REPEATING, "n_predict": 1, "repeat_penalty": 3.0,
                         "samplers": ["top_k", "typ_p", "top_p", "min_p", "temperature"]}
    assert tokens(base_url, without_penalties) == plain  # not in the chain: no effect


def test_generation_settings_echo_every_sampler_field(base_url: str) -> None:
    sent = {"dynatemp_range": 0.5, "dynatemp_exponent": 2.0, "top_n_sigma": 1.5, "xtc_probability": 0.25,
            "xtc_threshold": 0.2, "dry_multiplier": 0.8, "dry_base": 2.0, "dry_allowed_length": 3,
            "dry_penalty_last_n": 32, "dry_sequence_breakers": ["\n", "."], "mirostat": 0, "mirostat_tau": 4.0,
            "mirostat_eta": 0.2, "min_keep": 2, "n_keep": 4, "adaptive_target": 0.5, "adaptive_decay": 0.5}
    settings = complete(base_url, {**STORY, "n_predict": 2, **sent,
                                   "samplers": ["top-k", "temp", "nucleus"]})["generation_settings"]
    assert {key: settings[key] for key in sent} == sent
    assert settings["samplers"] == ["top_k", "temperature", "top_p"]


def test_sampler_defaults_are_llama_servers(base_url: str) -> None:
    settings = complete(base_url, {**STORY, "n_predict": 1})["generation_settings"]
    assert settings["samplers"] == ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                                    "temperature"]
    assert (settings["dry_multiplier"], settings["dry_base"], settings["dry_allowed_length"],
            settings["dry_penalty_last_n"]) == (0.0, 1.75, 2, 64)
    assert settings["dry_sequence_breakers"] == ["\n", ":", "\"", "*"]
    assert (settings["xtc_probability"], settings["xtc_threshold"], settings["top_n_sigma"]) == (0.0, 0.1, -1.0)
    assert (settings["mirostat"], settings["mirostat_tau"], settings["mirostat_eta"]) == (0, 5.0, 0.1)


def test_out_of_range_values_are_clamped_as_llama_server_does(base_url: str) -> None:
    settings = complete(base_url, {**STORY, "n_predict": 1, "mirostat": 7, "xtc_probability": 3.0,
                                   "dry_base": 0.5})["generation_settings"]
    assert (settings["mirostat"], settings["xtc_probability"], settings["dry_base"]) == (2, 1.0, 1.75)


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"dry_sequence_breakers": []}, "dry_sequence_breakers",
     "Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array of strings"),
    ({"dry_sequence_breakers": [1]}, "dry_sequence_breakers", None),
    ({"dry_allowed_length": -1}, "dry_allowed_length", None),
    ({"dry_penalty_last_n": -2}, "dry_penalty_last_n", None),
    ({"min_keep": -1}, "min_keep", None),
    ({"n_keep": -2}, "n_keep", None),
    ({"adaptive_decay": 1.5}, "adaptive_decay", None),
])
def test_bad_sampler_values_are_400_naming_the_field(base_url: str, body: dict[str, Any], field: str,
                                                     message: str | None) -> None:
    response = httpx.post(base_url + "/completion", json={"prompt": "x", "n_predict": 1, **body}, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and field in error["message"]
    if message is not None:
        assert error["message"] == message


def test_sampler_fields_work_on_the_openai_routes_too(base_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 8, "seed": 42,
            "temperature": 1.0, "logprobs": False}
    def content(extra: dict[str, Any]) -> str:
        reply = httpx.post(base_url + "/v1/chat/completions", json={**body, **extra}, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["message"]["content"]

    greedy = content({"temperature": 0})
    assert content({}) != greedy  # seeded sampling is not greedy here...
    assert content({"mirostat": 2, "mirostat_tau": 0.0}) == greedy  # ...and mirostat with no surprise allowed is
    assert content({"min_p": 1.0}) == greedy
