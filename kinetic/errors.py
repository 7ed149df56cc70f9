"""The one exception tree of kinetic and the status each condition maps to.

Each condition is its own class with its own `status` (never patched onto an instance) and
`kind` (llama-server's error type string, which OpenAI-shaped bodies carry). Protocol adapters
render these into their own envelopes through one table each; nothing else in the code base
raises HTTP errors directly.
"""

from __future__ import annotations

from typing import Any


class KineticError(Exception):
    """Base of every error a client may see. `kind` is llama-server's error type string."""

    status: int = 500
    kind: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.extra = extra or {}

    @property
    def headers(self) -> dict[str, str]:
        """HTTP headers the answer carries besides the body."""
        return {}


class InvalidRequestError(KineticError):
    status = 400
    kind = "invalid_request_error"


class ContextOverflowError(InvalidRequestError):
    kind = "exceed_context_size_error"

    def __init__(self, n_prompt_tokens: int, n_ctx: int):
        super().__init__(
            f"request ({n_prompt_tokens} tokens) exceeds the available context size "
            f"({n_ctx} tokens), try increasing it",
            param="messages",
            extra={"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx},
        )


class ServerError(KineticError):
    """Something broke inside kinetic or llama.cpp (a bug, a failed decode): 500."""


class UnauthorizedError(KineticError):
    status = 401
    kind = "authentication_error"


class ForbiddenError(KineticError):
    """A valid key that may not do this (a student's key on the instructor's dashboard): 403."""

    status = 403
    kind = "permission_error"


class FeatureDisabledError(ForbiddenError):
    """A route whose feature is off on this server (llama-server's /cors-proxy without --ui-mcp-proxy)."""

    kind = "feature_disabled"


class RequestTimeoutError(KineticError):
    status = 408
    kind = "timeout_error"


class NotFoundError(KineticError):
    status = 404
    kind = "not_found_error"


class PayloadTooLargeError(KineticError):
    status = 413
    kind = "invalid_request_error"


class RateLimitError(KineticError):
    status = 429
    kind = "rate_limit_error"

    def __init__(self, message: str, *, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class HeadersTooLargeError(KineticError):
    status = 431
    kind = "invalid_request_error"


class NotSupportedError(KineticError):
    status = 501
    kind = "not_supported_error"


class InsufficientStorageError(KineticError):
    """The server's disk space for it is used up (--slot-save-max): 507."""

    status = 507
    kind = "insufficient_storage_error"


class UnavailableError(KineticError):
    status = 503
    kind = "unavailable_error"


class QueueFullError(UnavailableError):
    """--max-queue: the model's waiting line is full, so the request is refused at once, not queued."""

    def __init__(self, max_queue: int, *, retry_after: int = 2):
        super().__init__(f"the waiting line for this model is full ({max_queue} requests waiting, --max-queue); "
                         f"retry in {retry_after} s")
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ShuttingDownError(UnavailableError):
    """SIGTERM or Ctrl+C: a request still waiting for a slot is refused at once, with when to come back
    (a restart for an upgrade: the next server is up once this one has drained)."""

    def __init__(self, *, retry_after: int):
        super().__init__(f"the server is shutting down; retry in {retry_after} s")
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ClientDisconnected(Exception):
    """The client left before its answer was ready (a non-streamed generation, a wait for its model): no
    answer is written (the server funnels it to a bare 499)."""


class RecordUnwritableError(UnavailableError):
    """--ledger: the class record cannot be written (a full disk, an I/O error, a read-only file), so
    the request is refused before any answer is generated: an answer nobody can grade is worse than none."""

    def __init__(self, problem: str, *, retry_after: int = 10):
        super().__init__(f"{problem}; the request was refused before any answer was generated: "
                         "tell the instructor (the server serves again once the ledger can be written)")
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class ModelLoadError(Exception):
    """The model file is missing, unreadable or not a GGUF: raised before the server starts."""


def field_error(field: str, detail: str) -> InvalidRequestError:
    """A 400 whose message names the offending request field, in llama-server's wording."""
    return InvalidRequestError(f"Field '{field}': {detail}", param=field)


def range_error(field: str, low: float | int, high: float | int, got: Any) -> InvalidRequestError:
    return field_error(field, f"Value must be between {low} <= value <= {high}, but got {got}")
