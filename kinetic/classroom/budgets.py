"""The keys' token budgets and time windows at run time: what each key has used, what the gate
refuses (429 over budget, 403 outside the key's dates or hours) and the `x-ratelimit-*` headers.

Usage is counted per key name and local day, from the finished request's record (the ledger's
sink, `record()`: the one place tokens are counted), so a week's or a day's budget, and carryover
from the period before, are sums over days. At start the ledger file is read back (`load_ledger`),
so a restart loses nothing. The limits themselves live on the Caller (the key file's fields): a
SIGHUP that rereads the key file changes them, and the usage stays.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from kinetic.classroom.caller import Caller
from kinetic.classroom.ledger import LedgerRecord, ledger_lines
from kinetic.classroom.limits import Budget
from kinetic.classroom.stats import tokens_of
from kinetic.errors import ForbiddenError, KineticError, RateLimitError

Clock = Callable[[], datetime]
KEPT_DAYS = 15  # two weeks and a day: a week's budget and the week before it (carryover)
RECENT = 20  # requests a key's standing lists
# Routes that run no model, or only look: a key over budget or outside its hours may still call them.
# Every other POST spends tokens, so a new generation route is counted without being listed here.
FREE_ROUTES = frozenset({"/tokenize", "/detokenize", "/apply-template", "/api/show", "/v1/messages/count_tokens",
                         "/v1/streams/lookup"})
# A key's own standing answers outside its hours too: that is where it reads why it is refused.
ALWAYS_OPEN = frozenset({"/v1/me"})
RECENT_FIELDS = ("time", "route", "status", "model", "prompt_tokens", "completion_tokens", "duration_s", "stream")


def local_now() -> datetime:
    return datetime.now().astimezone()


def go_duration(delta: timedelta) -> str:
    """`1h2m3s`, as OpenAI writes x-ratelimit-reset-tokens."""
    seconds = max(0, int(delta.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + f"{seconds}s"


@dataclass(frozen=True)
class Standing:
    """A key's budget now: its allowance this period (carryover included), used and left."""

    budget: Budget
    allowance: int
    used: int
    resets_at: datetime

    @property
    def left(self) -> int:
        return max(0, self.allowance - self.used)

    def describe(self, now: datetime) -> dict[str, Any]:
        return {"period": self.budget.period, "limit": self.allowance, "used": self.used, "left": self.left,
                "resets_at": self.resets_at.isoformat(), "resets_in": go_duration(self.resets_at - now)}


class Budgets:
    """Tokens used per key name and local day (thread-safe: the ledger's sinks run on the event loop,
    tests may feed it from anywhere)."""

    def __init__(self, clock: Clock = local_now):
        self.clock = clock
        self._lock = threading.Lock()
        self._days: dict[str, dict[date, int]] = {}
        self._recent: dict[str, deque[dict[str, Any]]] = {}

    def __call__(self, record: LedgerRecord) -> None:  # a LedgerMiddleware sink
        self.record(record)

    def record(self, record: LedgerRecord, *, when: datetime | None = None) -> None:
        """Counts one finished request's tokens (prompt and completion) against its key's name."""
        name = record.client
        if not name:
            return
        when = self.clock() if when is None else when
        tokens = sum(tokens_of(record))
        recent = {field: value for field in RECENT_FIELDS if (value := getattr(record, field)) is not None}
        with self._lock:
            self._recent.setdefault(name, deque(maxlen=RECENT)).append(recent)
            if tokens <= 0:
                return
            days = self._days.setdefault(name, {})
            days[when.date()] = days.get(when.date(), 0) + tokens
            for old in [day for day in days if day < when.date() - timedelta(days=KEPT_DAYS)]:
                del days[old]

    def load_ledger(self, path: str | Path) -> int:
        """Reads back the records of the last KEPT_DAYS from a ledger file (`client`, `time` and the
        token counts of each JSON line); a line that does not read is skipped. Returns the lines counted."""
        if not Path(path).exists():
            return 0
        since = self.clock() - timedelta(days=KEPT_DAYS)
        counted = 0
        for line in ledger_lines(path):  # one line at a time: a year's ledger is not held in memory
            record = LedgerRecord.from_line(line)
            if record is None:
                continue
            try:
                when = datetime.fromisoformat(str(record.time).replace("Z", "+00:00")).astimezone(since.tzinfo)
            except ValueError:
                continue
            if when >= since:
                self.record(record, when=when)
                counted += 1
        return counted

    def _used(self, name: str, start: date, end: date) -> int:
        with self._lock:
            return sum(n for day, n in self._days.get(name, {}).items() if start <= day < end)

    def standing(self, caller: Caller, now: datetime | None = None) -> Standing | None:
        """The caller's budget now, or None for a key without one."""
        budget = caller.limits.budget
        if budget is None or caller.name is None:
            return None
        now = self.clock() if now is None else now
        start = budget.start_of(now)
        end = start + budget.length()
        used = self._used(caller.name, start.date(), end.date())
        before = self._used(caller.name, (start - budget.length()).date(), start.date()) if budget.carryover else 0
        return Standing(budget, budget.allowance(before), used, end)

    def recent(self, name: str | None) -> list[dict[str, Any]]:
        """The key's last requests, newest first."""
        with self._lock:
            return list(reversed(self._recent.get(name or "", ())))

    def refusal(self, caller: Caller, method: str, path: str) -> KineticError | None:
        """The gate's answer for a caller its limits stop: outside its dates or hours a 403, over its
        budget a 429 (on routes that spend tokens), each saying which limit and when it opens again."""
        if path in ALWAYS_OPEN or caller.name is None:
            return None
        now = self.clock()
        if (why := caller.limits.window_refusal(now)) is not None:
            return ForbiddenError(why)
        if method != "POST" or path in FREE_ROUTES:
            return None
        standing = self.standing(caller, now)
        if standing is None or standing.left > 0:
            return None
        per = f"this {standing.budget.period}" + (" with carryover" if standing.budget.carryover else "")
        return RateLimitError(
            f"token budget used up: {standing.used} of {standing.allowance} tokens {per}; it resets at "
            f"{standing.resets_at:%Y-%m-%d %H:%M} (in {go_duration(standing.resets_at - now)})",
            retry_after=max(1, int((standing.resets_at - now).total_seconds())))

    def headers(self, caller: Caller) -> list[tuple[bytes, bytes]]:
        """OpenAI's x-ratelimit-*-tokens headers for a key with a budget (none without one)."""
        now = self.clock()
        standing = self.standing(caller, now)
        if standing is None:
            return []
        return [(b"x-ratelimit-limit-tokens", str(standing.allowance).encode()),
                (b"x-ratelimit-remaining-tokens", str(standing.left).encode()),
                (b"x-ratelimit-reset-tokens", go_duration(standing.resets_at - now).encode())]
