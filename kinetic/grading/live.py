"""What the grader asks the student's server (given with --server): the grader starts no server."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import httpx

TIMEOUT_S = 120.0
# One request of the grader's own measures the server's speed; enough tokens to average a little.
PROBE_MAX_TOKENS = 32


@dataclass(frozen=True)
class Speeds:
    prompt_per_second: float
    predicted_per_second: float


@dataclass
class LiveServer:
    url: str
    api_key: str | None = None
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=TIMEOUT_S)

    def healthy(self) -> bool:
        try:
            return self._client.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    def _post(self, path: str, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        response = self._client.post(path, json=body, **kwargs)
        response.raise_for_status()
        return response.json()

    def count_prompt_tokens(self, messages: list[dict[str, str]], template_kwargs: dict[str, Any]) -> int:
        """Tokens of the chat prompt as the server builds it: its template, then its tokenizer."""
        prompt = self._post("/apply-template", {"messages": messages, "chat_template_kwargs": template_kwargs})
        # The rendered prompt already holds the BOS text, so no extra special tokens are added here.
        tokens = self._post("/tokenize", {"content": prompt["prompt"], "add_special": False, "parse_special": True})
        return len(tokens["tokens"])

    @cached_property
    def speeds(self) -> Speeds:
        """One measured request; a random prefix keeps the prompt cache from hiding prompt time."""
        nonce = secrets.token_hex(4)
        body = {
            "model": "local", "max_tokens": PROBE_MAX_TOKENS, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"[{nonce}] Che cos'è llama.cpp? Rispondi in italiano."}],
            "chat_template_kwargs": {"enable_thinking": False},
        }
        timings = self._post("/v1/chat/completions", body)["timings"]
        return Speeds(float(timings["prompt_per_second"]), float(timings["predicted_per_second"]))

    @cached_property
    def unauthorized_body(self) -> Any | None:
        """The body the server sends for a wrong key, or None when it accepts any key."""
        response = httpx.post(self.url + "/v1/chat/completions", timeout=TIMEOUT_S,
                              headers={"Authorization": "Bearer kinetic-grade-wrong-key"},
                              json={"model": "local", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
        if response.status_code != 401:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    def close(self) -> None:
        self._client.close()
