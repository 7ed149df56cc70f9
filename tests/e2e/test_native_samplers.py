"""llama-server's sampler fields reach llama.cpp's chain: each one changes what a seeded (or greedy)
run of the bundled model generates, or is echoed in `generation_settings`. The base model writes
nonsense, so the tests compare runs with each other, never with expected wording."""

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


def test_seeded_run_repeats(base_url: str) -> None:
    # the precondition of every comparison below
    assert tokens(base_url, STORY) == tokens(base_url, STORY)


@pytest.mark.parametrize("change", [
    {"mirostat": 1}, {"mirostat": 2}, {"mirostat": 2, "mirostat_tau": 1.0},
    {"top_n_sigma": 0.5}, {"dynatemp_range": 0.9}, {"temperature": 2.0, "samplers": ["temperature"]},
])
def test_sampler_changes_a_seeded_run(base_url: str, change: dict[str, Any]) -> None:
    assert tokens(base_url, {**STORY, **change}) != tokens(base_url, STORY)


def test_top_k_alone_with_k_1_is_greedy(base_url: str) -> None:
    greedy = tokens(base_url, {**STORY, "temperature": 0})
    assert tokens(base_url, {**STORY, "samplers": ["top_k"], "top_k": 1}) == greedy
    assert tokens(base_url, {**STORY, "seed": 7, "samplers": ["nonsense", "Top-K"], "top_k": 1}) == greedy
    assert tokens(base_url, {**STORY, "samplers": "k", "top_k": 1}) == greedy  # llama.cpp's one-letter codes


def test_without_samplers_the_pick_is_unrestricted(base_url: str) -> None:
    # an empty chain (only the random pick) differs from the default one on the same seed
    assert tokens(base_url, {**STORY, "samplers": []}) != tokens(base_url, STORY)


def test_xtc_removes_the_top_choices(base_url: str) -> None:
    greedy = {**STORY, "temperature": 0}
    assert tokens(base_url, {**greedy, "xtc_probability": 1.0, "xtc_threshold": 0.01}) != tokens(base_url, greedy)


def test_dry_breaks_a_repetition(base_url: str) -> None:
    plain = tokens(base_url, {**REPEATING, "n_predict": 6})
    dry = tokens(base_url, {**REPEATING, "n_predict": 6, "dry_multiplier": 2.0, "dry_allowed_length": 1,
                            "dry_penalty_last_n": 64})
    assert dry != plain


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
    plain = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=60).json()
    mirostat = httpx.post(base_url + "/v1/chat/completions", json={**body, "mirostat": 2}, timeout=60).json()
    assert plain["choices"][0]["message"]["content"] != mirostat["choices"][0]["message"]["content"]
