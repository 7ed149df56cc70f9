"""Each protocol's generation route with a request that works there, and its error envelope: shared by
the live error contract (tests/e2e/test_error_contract.py) and the scripted engine's faults
(tests/unit/test_stream_faults_in_clients.py)."""

from __future__ import annotations

from typing import Any

ROUTES = {  # protocol -> (generation route, a request that works there)
    "openai": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    "llamacpp": ("/completion", {"prompt": "hi", "n_predict": 2}),
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 2}),
    "ollama": ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": False,
                             "options": {"num_predict": 2}}),
}
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                   408: "timeout_error", 413: "request_too_large", 503: "overloaded_error"}
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                408: "timeout_error", 413: "invalid_request_error", 501: "not_supported_error",
                503: "unavailable_error"}


def check_envelope(protocol: str, status: int, body: dict[str, Any], *, kind: str | None = None) -> None:
    if protocol == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == (kind or ANTHROPIC_TYPES[status]), body
        assert body["error"]["message"]
    elif protocol == "ollama":  # Ollama's envelope is the message alone, whatever the kind
        assert list(body) == ["error"] and isinstance(body["error"], str) and body["error"], body
    else:
        assert body["error"]["code"] == status and body["error"]["type"] == (kind or OPENAI_TYPES[status]), body
        assert body["error"]["message"]
