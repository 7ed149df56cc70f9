"""The class since the server started, in memory: what the instructor's dashboard shows.

`ClassStats` is a sink of the request recorder (ledger.LedgerMiddleware): it is fed the same
per-request records (`LedgerRecord`) the ledger writes, so the dashboard works with or without `--ledger`, and its
numbers are what the clients received. Per key name: requests, tokens in and out, errors, mean
time to first token, the last request, and whether the lab's three requests were made (a streamed
chat, a full chat, a 401). Plus the tokens per second over the last minutes.

Who is who, never by key: a key's name from `--api-key-file`; a rejected call (401) carries no
valid key, so it counts under "unknown", and also as the 401 of every student who called from the
same address (the grader ties rejected calls to students the same way). On a server without keys
the caller's address stands in for a name (`addr:10.0.0.7`), as in the fair queue.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kinetic.classroom.ledger import LedgerRecord

UNKNOWN = "unknown"
CHAT_ROUTES = frozenset({"/v1/chat/completions", "/chat/completions"})
BUCKET_S = 5.0
WINDOW_S = 600.0  # ten minutes of tokens/s


@dataclass
class KeyTotals:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    ttft_sum_s: float = 0.0
    ttft_n: int = 0
    last_time: float | None = None
    last_route: str = ""
    last_status: int = 0
    streamed_chat: bool = False
    full_chat: bool = False
    addresses: set[str] = field(default_factory=set)


def name_of(record: LedgerRecord) -> str | None:
    """Whose request this is: the key's name, "unknown" for a rejected key, the address on an open
    server; None for an unnamed call the key gate let through (a public route such as /health)."""
    if record.client:
        return record.client
    if record.status == 401:
        return UNKNOWN
    if record.auth == "open":
        return f"addr:{record.addr or '?'}"
    return None


def tokens_of(record: LedgerRecord) -> tuple[int, int]:
    """Tokens in and out, as the client was told them (each protocol's encoder hands them to the
    record, a stream without usage in its frames included); else the timings (a line of an older
    server), else for tokens out the chunks received (a stream its client stopped before the end)."""
    prompt = record.prompt_tokens
    if prompt is None:
        prompt = int((record.timing("prompt_n") or 0) + (record.timing("cache_n") or 0))
    completion = record.completion_tokens
    if completion is None:
        completion = int(record.timing("predicted_n") or 0) if record.timings else record.chunks or 0
    return prompt, completion


def ttft_of(record: LedgerRecord) -> float | None:
    """Seconds to the first token: as the client saw it for a stream; for a full answer, which
    arrives whole, the prompt time the server reports (timings.prompt_ms)."""
    if record.ttft_s is not None:
        return record.ttft_s
    prompt_ms = record.timing("prompt_ms")
    return prompt_ms / 1000 if prompt_ms is not None else None


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class ClassStats:
    """Per-key totals and a tokens/s history, fed one record at a time (thread-safe)."""

    def __init__(self, *, clock: Callable[[], float] = time.time, bucket_s: float = BUCKET_S,
                 window_s: float = WINDOW_S):
        self.clock = clock
        self.bucket_s = bucket_s
        self.window_s = window_s
        self.started = clock()
        self._lock = threading.Lock()
        self._totals: dict[str, KeyTotals] = {}
        self._rejected_by_addr: dict[str, int] = {}
        self._tokens: dict[int, float] = {}  # bucket index -> tokens generated in it

    def __call__(self, record: LedgerRecord) -> None:  # a LedgerMiddleware sink
        self.record(record)

    def record(self, record: LedgerRecord, *, now: float | None = None) -> None:
        """Counts one finished request; `now` is when it finished (default: the clock)."""
        now = self.clock() if now is None else now
        name = name_of(record)
        status = record.status
        with self._lock:
            if status == 401:
                self._rejected_by_addr[record.addr] = self._rejected_by_addr.get(record.addr, 0) + 1
            if name is None:
                return
            totals = self._totals.setdefault(name, KeyTotals())
            totals.requests += 1
            prompt, completion = tokens_of(record)
            totals.prompt_tokens += prompt
            totals.completion_tokens += completion
            if status >= 400 or record.error is not None:
                totals.errors += 1
            ttft = ttft_of(record)
            if ttft is not None and status < 400:
                totals.ttft_sum_s += ttft
                totals.ttft_n += 1
            totals.last_time, totals.last_route, totals.last_status = now, record.route, status
            if record.addr and name != UNKNOWN:
                totals.addresses.add(record.addr)
            if record.route in CHAT_ROUTES and status == 200 and record.error is None:
                if record.stream:
                    totals.streamed_chat = totals.streamed_chat or (record.chunks or 0) > 0
                else:
                    totals.full_chat = True
            self._add_tokens(record, now)

    def _add_tokens(self, record: LedgerRecord, end: float) -> None:
        """Spreads the request's generated tokens evenly over the time it spent generating them."""
        tokens = int(record.timing("predicted_n") or 0) or record.completion_tokens or 0
        if tokens <= 0:
            return
        seconds = (record.timing("predicted_ms") or 0.0) / 1000 or record.duration_s
        start = end - max(seconds, 1e-6)
        first, last = math.floor(start / self.bucket_s), math.floor(end / self.bucket_s)
        for index in range(first, last + 1):
            overlap = min(end, (index + 1) * self.bucket_s) - max(start, index * self.bucket_s)
            if overlap > 0:
                self._tokens[index] = self._tokens.get(index, 0.0) + tokens * overlap / (end - start)
        oldest = math.floor((end - self.window_s) / self.bucket_s)
        for index in [i for i in self._tokens if i < oldest]:
            del self._tokens[index]

    def figures_by_key(self) -> dict[str, dict[str, int]]:
        """Requests, prompt and completion tokens and errors of every caller seen, by name (/metrics)."""
        with self._lock:
            return {name: {"requests": t.requests, "prompt_tokens": t.prompt_tokens,
                           "completion_tokens": t.completion_tokens, "errors": t.errors}
                    for name, t in self._totals.items()}

    def snapshot(self, roster: Iterable[str] = (), *, now: float | None = None) -> dict[str, Any]:
        """JSON for the dashboard: every name of the roster (the key file, even who has not asked
        anything yet), then every other caller seen, "unknown" last."""
        now = self.clock() if now is None else now
        with self._lock:
            names = [n for n in dict.fromkeys([*roster, *self._totals]) if n != UNKNOWN]
            if UNKNOWN in self._totals:
                names.append(UNKNOWN)
            students = [self._row(name, self._totals.get(name, KeyTotals())) for name in names]
            current = math.floor(now / self.bucket_s)
            count = int(self.window_s / self.bucket_s)
            throughput = [{"t": (index) * self.bucket_s,
                           "tokens_per_s": round(self._tokens.get(index, 0.0) / self.bucket_s, 3)}
                          for index in range(current - count + 1, current + 1)]
        totals = {key: sum(row[key] for row in students)
                  for key in ("requests", "prompt_tokens", "completion_tokens", "errors")}
        return {"started": _iso(self.started), "now": _iso(now), "bucket_s": self.bucket_s,
                "students": students, "totals": totals, "throughput": throughput}

    def _row(self, name: str, totals: KeyTotals) -> dict[str, Any]:
        rejected = sum(self._rejected_by_addr.get(addr, 0) for addr in totals.addresses)
        if name == UNKNOWN:
            rejected = totals.requests
        return {
            "name": name,
            "requests": totals.requests,
            "prompt_tokens": totals.prompt_tokens,
            "completion_tokens": totals.completion_tokens,
            "errors": totals.errors,
            "mean_ttft_s": round(totals.ttft_sum_s / totals.ttft_n, 4) if totals.ttft_n else None,
            "last": None if totals.last_time is None else {
                "time": _iso(totals.last_time), "route": totals.last_route, "status": totals.last_status},
            "lab": {"streamed_chat": totals.streamed_chat, "full_chat": totals.full_chat, "rejected_401": rejected},
        }
