"""What the grader asks a running server (given with --server); the grader starts none.

Every failure to get an answer (connection refused, timeout, an HTTP error such as a 401 from a
keyed server without --api-key) becomes `Unchecked` naming the cause: the check that needed the
answer is reported as "could not check" and the batch goes on.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import httpx

from kinetic.grading.outcomes import Unchecked

TIMEOUT_S = 120.0
# One request of the grader's own measures the server's speed; enough tokens to average a little.
PROBE_MAX_TOKENS = 32


@dataclass(frozen=True)
class Speeds:
    prompt_per_second: float
    predicted_per_second: float


def describe(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        body = exc.response.text.strip().replace("\n", " ")[:200]
        return f"HTTP {exc.response.status_code} from {exc.request.url.path}: {body}"
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {TIMEOUT_S:g} s ({type(exc).__name__})"
    if isinstance(exc, httpx.HTTPError):
        return f"cannot reach the server ({type(exc).__name__}: {exc})"
    return f"unexpected answer ({type(exc).__name__}: {exc})"


@dataclass
class LiveServer:
    url: str
    api_key: str | None = None
    timeout: float = TIMEOUT_S
    _client: httpx.Client = field(init=False, repr=False)
    _memo: dict[str, Any] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout)

    def _remember(self, key: str, fetch: Any) -> Any:
        """One answer per question for the whole batch; a failure is remembered too (and re-raised)."""
        if key not in self._memo:
            try:
                self._memo[key] = ("ok", fetch())
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                self._memo[key] = ("error", f"the server at {self.url} gave no usable answer: {describe(exc)}")
        outcome, value = self._memo[key]
        if outcome == "error":
            raise Unchecked(value)
        return value

    def health_problem(self) -> str | None:
        """None when /health answers 200, else why not (reported once, before the students)."""
        try:
            status = self._client.get("/health").status_code
        except httpx.HTTPError as exc:
            return describe(exc)
        return None if status == 200 else f"/health answered HTTP {status}"

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        response = self._client.post(path, json=body)
        response.raise_for_status()
        return response.json()

    def count_prompt_tokens(self, messages: list[dict[str, str]], template_kwargs: dict[str, Any]) -> int:
        """Tokens of the chat prompt as the server builds it: its template, then its tokenizer."""
        def fetch() -> int:
            prompt = self._post("/apply-template", {"messages": messages, "chat_template_kwargs": template_kwargs})
            # The rendered prompt already holds the BOS text, so no extra special tokens are added here.
            tokens = self._post("/tokenize", {"content": prompt["prompt"], "add_special": False, "parse_special": True})
            return len(tokens["tokens"])
        return self._remember(f"count {messages!r} {template_kwargs!r}", fetch)

    @property
    def speeds(self) -> Speeds:
        """One measured request; a random prefix keeps the prompt cache from hiding prompt time."""
        def fetch() -> Speeds:
            nonce = secrets.token_hex(4)
            body = {
                "model": "local", "max_tokens": PROBE_MAX_TOKENS, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"[{nonce}] Che cos'è llama.cpp? Rispondi in italiano."}],
                "chat_template_kwargs": {"enable_thinking": False},
            }
            timings = self._post("/v1/chat/completions", body)["timings"]
            return Speeds(float(timings["prompt_per_second"]), float(timings["predicted_per_second"]))
        return self._remember("speeds", fetch)

    @property
    def unauthorized_body(self) -> Any | None:
        """The body the server sends for a wrong key, or None when it accepts any key."""
        def fetch() -> Any | None:
            response = httpx.post(self.url + "/v1/chat/completions", timeout=self.timeout,
                                  headers={"Authorization": "Bearer kinetic-grade-wrong-key"},
                                  json={"model": "local", "max_tokens": 1,
                                        "messages": [{"role": "user", "content": "hi"}]})
            if response.status_code != 401:
                return None
            try:
                return response.json()
            except ValueError:
                return response.text
        return self._remember("unauthorized", fetch)

    def close(self) -> None:
        self._client.close()
