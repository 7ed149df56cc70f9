"""llama-server's native routes on the live server: /props, /slots, /metrics, /completion, tokenizer."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.conftest import MODEL_ALIAS


def test_props_describe_model_slots_and_template(base_url: str) -> None:
    props = httpx.get(base_url + "/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 2048
    assert props["model_alias"] == MODEL_ALIAS and props["model_ftype"] == "Q4_K - Medium"
    assert props["chat_template_origin"] == "builtin:gemma" and "<start_of_turn>" in props["chat_template"]
    assert props["bos_token"] == "<bos>" and props["build_info"].startswith("b")


def test_tokenize_detokenize_round_trip(base_url: str) -> None:
    tokens = httpx.post(base_url + "/tokenize", json={"content": "Hello world", "add_special": True}).json()["tokens"]
    assert tokens[0] == 2 and len(tokens) >= 3
    pieces = httpx.post(base_url + "/tokenize", json={"content": "Hello world", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello world"
    text = httpx.post(base_url + "/detokenize", json={"tokens": tokens[1:]}).json()["content"]
    assert text == "Hello world"


def test_apply_template_counts_match_usage(base_url: str) -> None:
    messages = [{"role": "user", "content": "Count my tokens"}]
    prompt = httpx.post(base_url + "/apply-template", json={"messages": messages}).json()["prompt"]
    assert prompt.startswith("<bos><start_of_turn>user\nCount my tokens")
    tokens = httpx.post(base_url + "/tokenize", json={"content": prompt}).json()["tokens"]
    usage = httpx.post(base_url + "/v1/chat/completions",
                       json={"messages": messages, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == len(tokens)


def test_native_completion_and_stream_agree(base_url: str) -> None:
    body = {"prompt": "The capital of France is", "n_predict": 6, "temperature": 0, "return_tokens": True,
            "cache_prompt": False}  # both runs evaluate the prompt whole: the same logits
    full = httpx.post(base_url + "/completion", json=body, timeout=60).json()
    assert full["stop"] is True and full["tokens_predicted"] == len(full["tokens"]) <= 6
    assert full["stop_type"] in {"eos", "limit"} and full["timings"]["predicted_n"] == full["tokens_predicted"]
    with httpx.stream("POST", base_url + "/completion", json={**body, "stream": True}, timeout=60) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1]["stop"] is True and "timings" in events[-1]
    assert "".join(e["content"] for e in events[:-1]) == full["content"]


def test_queue_serves_more_requests_than_slots(base_url: str) -> None:
    def ask(i: int) -> dict:
        return httpx.post(base_url + "/v1/chat/completions", timeout=120,
                          json={"messages": [{"role": "user", "content": f"Request number {i}"}],
                                "max_tokens": 6}).json()

    with ThreadPoolExecutor(max_workers=5) as pool:
        results = list(pool.map(ask, range(5)))
    assert all(r["usage"]["completion_tokens"] <= 6 and r["choices"][0]["message"]["role"] == "assistant"
               for r in results)
    slots = httpx.get(base_url + "/slots").json()
    assert len(slots) == 2 and not any(s["is_processing"] for s in slots)


def test_metrics_count_tokens(base_url: str) -> None:
    before = _metrics(base_url)
    r = httpx.post(base_url + "/v1/completions", json={"prompt": "Metrics please", "max_tokens": 3,
                                                        "cache_prompt": False}, timeout=60).json()
    after = _metrics(base_url)
    assert after["tokens_predicted_total"] - before["tokens_predicted_total"] == r["timings"]["predicted_n"]
    assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == r["timings"]["prompt_n"]


def _metrics(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics").text
    return {line.split()[0].split(":", 1)[1]: float(line.split()[1])
            for line in text.splitlines() if line.startswith("llamacpp:")}
