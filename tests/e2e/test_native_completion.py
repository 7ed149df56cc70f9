"""llama-server's /completion (and /completions) on the live server: prompt shapes, several prompts,
streamed extras (progress, per-token timings, tokens_evaluated), probabilities before and after
sampling, json_schema, the full generation_settings; /infill and native /embedding."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx

# llama-server's long generation_settings keys (tools/server/server-task.cpp task_params::to_json)
LONG_SETTINGS = {
    "seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p", "top_n_sigma",
    "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "mirostat", "mirostat_tau", "mirostat_eta", "adaptive_target", "adaptive_decay", "stop",
    "max_tokens", "n_predict", "n_keep", "n_discard", "ignore_eos", "stream", "logit_bias", "n_probs", "min_keep",
    "grammar", "grammar_lazy", "grammar_triggers", "preserved_tokens", "chat_format", "reasoning_format",
    "reasoning_in_content", "generation_prompt", "samplers", "speculative.types", "timings_per_token",
    "post_sampling_probs", "backend_sampling", "lora"}
SHORT_ONLY_DROPS = {"dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers",
                    "preserved_tokens"}


def post(base_url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(base_url + path, json=body, timeout=120)


def stream_events(base_url: str, body: dict[str, Any], path: str = "/completion") -> list[dict[str, Any]]:
    with httpx.stream("POST", base_url + path, json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]


def test_json_schema_constrains_the_completion(base_url: str) -> None:
    schema = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}
    body = post(base_url, "/completion", {"prompt": "JSON:", "n_predict": 40, "temperature": 0,
                                          "json_schema": schema}).json()
    value = json.loads(body["content"])
    assert isinstance(value["count"], int) and body["stop_type"] == "eos"


def test_grammar_holds_when_sampling_at_random(base_url: str) -> None:
    # The grammar checks the chain's pick and filters the vocabulary only when it refuses it (as
    # llama-server): at a high temperature most picks are refused, so both paths run here.
    grammar = 'root ::= ("yes" | "no" | "maybe") ("." | "!")'
    for seed in range(8):
        body = post(base_url, "/completion", {"prompt": "Answer:", "n_predict": 8, "temperature": 1.8,
                                              "top_k": 0, "top_p": 1.0, "seed": seed, "grammar": grammar}).json()
        assert body["content"] in {f"{w}{p}" for w in ("yes", "no", "maybe") for p in ".!"}, body["content"]
        assert body["stop_type"] == "eos"


def test_grammar_dead_ends_answer_and_the_server_lives(base_url: str) -> None:
    # llama.cpp's grammar aborts the process when handed a token it refuses; llama-server answers 500.
    # A finished grammar with ignore_eos simply stops; a logit_bias that bans every allowed token is a 400.
    done = post(base_url, "/completion", {"prompt": "Answer:", "n_predict": 12, "temperature": 0,
                                          "grammar": 'root ::= "yes"', "ignore_eos": True}).json()
    assert done["content"] == "yes" and done["stop_type"] == "eos" and done["tokens_predicted"] <= 2
    banned = post(base_url, "/completion", {"prompt": "Answer:", "n_predict": 4, "grammar": "root ::= [\\x01]",
                                            "logit_bias": [[t, False] for t in tokens_spelled(b"\x01")]})
    assert banned.status_code == 400 and "logit_bias" in banned.json()["error"]["message"], banned.text
    assert httpx.get(base_url + "/health").json() == {"status": "ok"}


def tokens_spelled(piece: bytes) -> list[int]:
    """Every token of the bundled model's vocabulary whose text is exactly `piece`."""
    from kinetic.backends.bundled import gemma_model_path
    from kinetic.engine.llama.model import LoadedModel

    model = LoadedModel(gemma_model_path())  # weights are mmapped: shared with the server's copy
    return [t for t in range(model.n_vocab) if model.token_piece(t) == piece]


def test_post_sampling_probs_obey_the_grammar(base_url: str) -> None:
    body = post(base_url, "/completion", {"prompt": "Answer:", "n_predict": 1, "temperature": 1.0, "seed": 3,
                                          "grammar": 'root ::= "yes" | "no"', "n_probs": 5,
                                          "post_sampling_probs": True}).json()
    candidates = body["completion_probabilities"][0]["top_probs"]
    assert candidates and all(("yes".startswith(c["token"]) or "no".startswith(c["token"])) and c["token"]
                              for c in candidates), candidates


def test_mixed_prompt_is_one_prompt(base_url: str) -> None:
    text = httpx.post(base_url + "/tokenize", json={"content": " and then"}).json()["tokens"]
    body = post(base_url, "/completion", {"prompt": [2, 9259, " and then", 236761], "n_predict": 2}).json()
    assert isinstance(body, dict) and body["tokens_evaluated"] == 3 + len(text)
    leading = post(base_url, "/completion", {"prompt": ["Hello", 236761], "n_predict": 1}).json()
    assert leading["prompt"].startswith("<bos>Hello")  # BOS when the text leads, as llama-server
    as_object = post(base_url, "/completion", {"prompt": {"prompt_string": "Hello"}, "n_predict": 1}).json()
    assert as_object["prompt"] == "<bos>Hello"
    bad = post(base_url, "/completion", {"prompt": [1, 2.5]})
    assert bad.status_code == 400 and '"prompt" elements must be' in bad.json()["error"]["message"]


def test_several_prompts_give_several_results(base_url: str) -> None:
    body = post(base_url, "/completion", {"prompt": ["The sky is", [2, 818, 5866, 563], "Dogs"],
                                          "n_predict": 3, "temperature": 0}).json()
    assert isinstance(body, list) and [r["index"] for r in body] == [0, 1, 2]
    assert all(r["stop"] and r["tokens_predicted"] <= 3 for r in body)
    alone = post(base_url, "/completion", {"prompt": "The sky is", "n_predict": 3, "temperature": 0}).json()
    assert body[0]["content"] == alone["content"]


def test_one_prompt_as_text_as_tokens_or_twice_gives_one_greedy_text(base_url: str) -> None:
    # llama.cpp's test_completion_with_tokens_input: the prompts of one request start in the same decode
    # step and advance together, so a near tie cannot part two copies of one prompt (it did when the
    # second started a step later, on a batch of another shape).
    text = "I believe the meaning of life is"
    tokens = post(base_url, "/tokenize", {"content": text, "add_special": True}).json()["tokens"]
    greedy = {"n_predict": 48, "temperature": 0}
    alone = post(base_url, "/completion", {"prompt": tokens, **greedy}).json()["content"]
    twice = post(base_url, "/completion", {"prompt": [tokens, tokens], **greedy}).json()
    mixed = post(base_url, "/completion", {"prompt": [tokens, text], **greedy}).json()
    assert [r["content"] for r in twice] == [alone, alone]
    assert [r["content"] for r in mixed] == [alone, alone]
    assert all(r["tokens_predicted"] == 48 for r in twice + mixed)  # long enough to part ways, had they


def test_n_cmpl_gives_copies_of_each_prompt(base_url: str) -> None:
    body = post(base_url, "/completion", {"prompt": ["The sky is", "Dogs"], "n_cmpl": 2, "n_predict": 6,
                                          "temperature": 0}).json()
    assert [r["index"] for r in body] == [0, 1, 2, 3]
    assert body[0]["content"] == body[1]["content"] and body[2]["content"] == body[3]["content"]
    assert body[0]["prompt"] == body[1]["prompt"] != body[2]["prompt"]
    seeded = post(base_url, "/completion", {"prompt": "Once", "n": 2, "n_predict": 4, "seed": 5}).json()
    assert isinstance(seeded, list) and [r["index"] for r in seeded] == [0, 1]  # `n` is n_cmpl's alias here
    assert [r["generation_settings"]["seed"] for r in seeded] == [5, 6]


def test_n_cmpl_is_at_most_the_slot_count(base_url: str) -> None:
    res = post(base_url, "/completion", {"prompt": "Once", "n_cmpl": 3, "n_predict": 2})  # the live server has 2
    assert res.status_code == 400
    assert res.json()["error"]["message"] == "Field 'n_cmpl': Value must be between 1 <= value <= 2, but got 3"


def test_several_prompts_stream_with_their_index(base_url: str) -> None:
    events = stream_events(base_url, {"prompt": ["The sky is", "Dogs"], "n_predict": 4, "temperature": 0})
    finals = {e["index"]: e for e in events if e["stop"]}
    assert set(finals) == {0, 1}
    full = post(base_url, "/completion", {"prompt": ["The sky is", "Dogs"], "n_predict": 4, "temperature": 0}).json()
    for index in (0, 1):
        streamed = "".join(e["content"] for e in events if e["index"] == index and not e["stop"])
        assert streamed == full[index]["content"]


def test_stream_chunks_carry_tokens_evaluated_and_timings(base_url: str) -> None:
    events = stream_events(base_url, {"prompt": "Counting: one, two,", "n_predict": 5, "timings_per_token": True})
    partial, final = events[:-1], events[-1]
    assert partial and all(e["tokens_evaluated"] == final["tokens_evaluated"] for e in partial)
    assert [e["timings"]["predicted_n"] for e in partial] == [e["tokens_predicted"] for e in partial]
    assert final["generation_settings"]["timings_per_token"] is True
    quiet = stream_events(base_url, {"prompt": "Counting: one, two,", "n_predict": 2})
    assert not any("timings" in e for e in quiet[:-1])


def test_return_progress_reports_the_prompt_batches(base_url: str) -> None:
    events = stream_events(base_url, {"prompt": "A fresh prompt about progress " * 4, "n_predict": 2,
                                      "return_progress": True, "timings_per_token": True, "cache_prompt": False})
    progress = [e["prompt_progress"] for e in events if "prompt_progress" in e]
    first_timings = next(e["timings"] for e in events if "prompt_progress" in e)
    assert (first_timings["prompt_n"], first_timings["prompt_ms"], first_timings["predicted_n"]) == (0, 0.0, 0)
    first_text = next(i for i, e in enumerate(events) if e["tokens"])
    assert progress and all("prompt_progress" not in e for e in events[first_text:])
    assert progress[0]["processed"] == progress[0]["cache"] and progress[-1]["processed"] == progress[-1]["total"]
    assert progress[-1]["total"] == events[-1]["tokens_evaluated"]


def test_n_probs_before_sampling(base_url: str) -> None:
    body = post(base_url, "/completion", {"prompt": "Hello", "n_predict": 3, "n_probs": 4}).json()
    probs = body["completion_probabilities"]
    assert len(probs) == body["tokens_predicted"]
    assert all(len(p["top_logprobs"]) == 4 and p["logprob"] <= 0 for p in probs)
    events = stream_events(base_url, {"prompt": "Hello", "n_predict": 3, "n_probs": 2})
    assert all(len(e["completion_probabilities"]) == 1 and len(e["completion_probabilities"][0]["top_logprobs"]) == 2
               for e in events[:-1])


def test_post_sampling_probs(base_url: str) -> None:
    body = post(base_url, "/completion", {"prompt": "Hello", "n_predict": 3, "n_probs": 5, "top_k": 3,
                                          "post_sampling_probs": True}).json()
    for entry in body["completion_probabilities"]:
        assert "logprob" not in entry and 0 < entry["prob"] <= 1
        top = [alt["prob"] for alt in entry["top_probs"]]
        assert 1 <= len(top) <= 3 and top == sorted(top, reverse=True)  # top_k 3 leaves at most 3 candidates
        assert math.isclose(sum(top), 1.0, rel_tol=1e-3)  # the kept candidates share all the probability
        assert entry["id"] in [alt["id"] for alt in entry["top_probs"]]
    events = stream_events(base_url, {"prompt": "Hello", "n_predict": 2, "n_probs": 2, "post_sampling_probs": True})
    assert all("prob" in e["completion_probabilities"][0] for e in events[:-1])


def test_post_sampling_probs_after_xtc_dropped_the_top(base_url: str) -> None:
    # XTC removes the likeliest tokens by moving the candidates' start past them: the probabilities
    # shown must be those of the tokens left, the chosen one among them.
    body = post(base_url, "/completion", {"prompt": "Hello", "n_predict": 4, "n_probs": 3, "temperature": 1.0,
                                          "seed": 5, "xtc_probability": 1.0, "xtc_threshold": 0.01,
                                          "post_sampling_probs": True}).json()
    plain = post(base_url, "/completion", {"prompt": "Hello", "n_predict": 1, "n_probs": 3, "temperature": 1.0,
                                           "seed": 5, "post_sampling_probs": True}).json()
    top_without_xtc = plain["completion_probabilities"][0]["top_probs"][0]["id"]
    first = body["completion_probabilities"][0]
    assert top_without_xtc not in [alt["id"] for alt in first["top_probs"]]
    for entry in body["completion_probabilities"]:
        assert entry["id"] in [alt["id"] for alt in entry["top_probs"]], entry
        assert entry["prob"] == next(alt["prob"] for alt in entry["top_probs"] if alt["id"] == entry["id"])


def test_generation_settings_has_llama_servers_keys(base_url: str) -> None:
    body = post(base_url, "/completion", {"prompt": "Hi", "n_predict": 1, "stop": ["\n"], "n_keep": 2}).json()
    settings = body["generation_settings"]
    assert set(settings) == LONG_SETTINGS
    assert settings["stop"] == ["\n"] and settings["n_keep"] == 2 and settings["stream"] is False


def test_completions_without_v1_is_native(base_url: str) -> None:
    body = post(base_url, "/completions", {"prompt": "Hi", "n_predict": 2}).json()
    assert "content" in body and "generation_settings" in body and "choices" not in body
    openai = post(base_url, "/v1/completions", {"prompt": "Hi", "max_tokens": 2}).json()
    assert openai["object"] == "text_completion"


def test_infill_needs_fim_tokens(base_url: str) -> None:
    # the bundled Gemma has no FIM tokens: llama-server's 501, before the body is even read
    response = post(base_url, "/infill", {"input_prefix": "def add(a, b):\n    return ", "input_suffix": "\n"})
    assert response.status_code == 501
    assert response.json()["error"] == {
        "code": 501, "type": "not_supported_error",
        "message": "Infill is not supported by this model: prefix token is missing. suffix token is missing. "
                   "middle token is missing. "}


def test_native_embedding_shape(base_url: str) -> None:
    body = post(base_url, "/embedding", {"content": "hello world"}).json()
    assert isinstance(body, list) and len(body) == 1 and body[0]["index"] == 0
    [vector] = body[0]["embedding"]
    assert len(vector) == 640 and math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, rel_tol=1e-4)
    several = post(base_url, "/embeddings", {"input": ["one", "two"], "embd_normalize": 1}).json()
    assert [e["index"] for e in several] == [0, 1]
    assert math.isclose(sum(abs(v) for v in several[0]["embedding"][0]), 1.0, rel_tol=1e-4)  # taxicab
    missing = post(base_url, "/embedding", {})
    assert missing.status_code == 400 and missing.json()["error"]["message"] == '"input" or "content" must be provided'


def test_embeddings_count_in_metrics(base_url: str) -> None:
    def values() -> dict[str, float]:
        return {line.split()[0].removeprefix("llamacpp:"): float(line.split()[1])
                for line in httpx.get(base_url + "/metrics").text.splitlines() if line.startswith("llamacpp:")}

    before = values()
    [entry] = post(base_url, "/embedding", {"content": [2, 9259, 1902]}).json()
    after = values()
    # as llama-server: the prompt is counted and decoded, nothing is predicted
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == 3
    assert after["n_decode_total"] - before["n_decode_total"] == 1
    assert after["tokens_predicted_total"] == before["tokens_predicted_total"]


def test_post_props_and_slot_actions_are_off_by_default(base_url: str) -> None:
    props = post(base_url, "/props", {})
    assert props.status_code == 501 and "--props" in props.json()["error"]["message"]
    slots = post(base_url, "/slots/0?action=save", {"filename": "x.bin"})
    assert slots.status_code == 501 and "--slot-save-path" in slots.json()["error"]["message"]


def test_slots_show_the_last_task(base_url: str) -> None:
    post(base_url, "/completion", {"prompt": "Slot parameters", "n_predict": 1, "top_k": 7, "id_slot": 1})
    slot = httpx.get(base_url + "/slots").json()[1]
    assert isinstance(slot["id_task"], int) and slot["params"]["top_k"] == 7
    assert set(slot["params"]) == LONG_SETTINGS - SHORT_ONLY_DROPS
    defaults = httpx.get(base_url + "/props").json()["default_generation_settings"]["params"]
    assert set(defaults) == LONG_SETTINGS - SHORT_ONLY_DROPS


def test_metrics_have_every_llama_server_name(base_url: str) -> None:
    response = httpx.get(base_url + "/metrics")
    # spelled as llama-server spells it (its suite reads it case-sensitively)
    assert any(name == b"Process-Start-Time-Unix" and int(value) > 0 for name, value in response.headers.raw)
    types = [line.split()[2:4] for line in response.text.splitlines() if line.startswith("# TYPE")]
    names = [name.removeprefix("llamacpp:") for name, _ in types]
    # llama-server's metrics in its order; kinetic's own (requests waiting by key) come after them
    assert names[:15] == ["prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total",
                     "tokens_predicted_total", "tokens_predicted_seconds_total", "n_decode_total", "n_tokens_max",
                     "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
                     "spec_decode_num_drafts_total", "prompt_tokens_seconds", "predicted_tokens_seconds",
                     "requests_processing", "requests_deferred", "n_busy_slots_per_decode"]
    assert [kind for _, kind in types][:15] == ["counter"] * 10 + ["gauge"] * 5
    post(base_url, "/completion", {"prompt": "Rates since the last scrape", "n_predict": 4})
    values = {line.split()[0].removeprefix("llamacpp:"): float(line.split()[1])
              for line in httpx.get(base_url + "/metrics").text.splitlines() if line.startswith("llamacpp:")}
    assert values["predicted_tokens_seconds"] > 0 and values["n_busy_slots_per_decode"] >= 1


def test_ignore_eos_shows_its_bans_in_generation_settings_logit_bias(base_url: str) -> None:
    """llama-server's test_ignore_eos.py: ignore_eos puts a null (-inf) bias per end-of-generation token in
    generation_settings.logit_bias; without it the list is empty."""
    body = {"prompt": "Once upon a time", "n_predict": 4, "temperature": 0.0}
    banned = post(base_url, "/completion", {**body, "ignore_eos": True}).json()["generation_settings"]["logit_bias"]
    assert banned and all(entry["bias"] is None for entry in banned)
    assert {1, 106} <= {entry["token"] for entry in banned}  # Gemma's EOS and <end_of_turn>
    plain = post(base_url, "/completion", {**body, "ignore_eos": False}).json()["generation_settings"]["logit_bias"]
    assert plain == []


def test_backend_sampling_is_taken_and_the_answer_is_the_same(base_url: str) -> None:
    # llama-server moves sampling into llama.cpp's graph with backend_sampling (-bs); kinetic takes the field, shows it,
    # and samples in its own sampler (the differences table says why): a greedy answer is the same either way.
    body = {"prompt": "The history of the printing press begins", "n_predict": 12, "temperature": 0}
    plain = post(base_url, "/completion", {**body, "backend_sampling": False}).json()
    backend = post(base_url, "/completion", {**body, "backend_sampling": True}).json()
    assert backend["generation_settings"]["backend_sampling"] is True
    assert plain["generation_settings"]["backend_sampling"] is False
    assert backend["tokens"] == plain["tokens"] and backend["content"] == plain["content"]
    assert backend["tokens_predicted"] == 12
