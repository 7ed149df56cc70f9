"""A key's limits, declared beside it in the key file: a token budget per day or week, the dates the
key is valid, its lesson hours, the models it may use and its priority in the waiting line.

A key-file line is `KEY [name] [field=value ...]`; a line `* field=value ...` sets the defaults of
every key line below it (until the next `*` line), and a key's own fields override them. So a class
of two hundred is one defaults line and two hundred `KEY name` lines:

    * tokens=20000/week carryover=yes from=2026-09-01 until=2026-12-18 hours=mon-fri@09:00-12:00
    sk-aaa alice
    sk-ta1 tina priority=1 tokens=none hours=always

The fields (docs/classroom.md has the instructor's version):
- `tokens=N/day` or `tokens=N/week` (prompt and completion tokens together); `tokens=none` lifts it.
- `carryover=yes`: what a key left unused in the period just before adds to this one (one period's
  worth at most: unused tokens do not pile up over a term).
- `from=YYYY-MM-DD`, `until=YYYY-MM-DD`: the first and last day the key works (both included).
- `hours=DAYS@HH:MM-HH:MM[,...]`: when it works, in the server's local time; DAYS is `mon-fri`,
  `tue+thu`, `sat` or `daily`; `hours=always` lifts it.
- `models=a,b`: the model ids or aliases it may use (`models=all` lifts it).
- `priority=N`: higher is served first while waiting (the admin's key is 1 unless set; students 0).

Pure: parsing and the calendar arithmetic only; the usage itself is kept in budgets.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta
from typing import Literal

Period = Literal["day", "week"]
DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
FIELDS = ("tokens", "carryover", "from", "until", "hours", "models", "priority")


class LimitError(ValueError):
    """A limit field that cannot be read; the key file's parser adds the file and line."""


@dataclass(frozen=True)
class Budget:
    tokens: int
    period: Period
    carryover: bool = False

    def start_of(self, now: datetime) -> datetime:
        """The start of the period `now` falls in: local midnight, or Monday's for a week."""
        day = now.date() - timedelta(days=now.weekday() if self.period == "week" else 0)
        return datetime.combine(day, time(0), tzinfo=now.tzinfo)

    def length(self) -> timedelta:
        return timedelta(days=7 if self.period == "week" else 1)

    def allowance(self, used_before: int) -> int:
        """This period's tokens, given what the period just before used (counted only with carryover)."""
        if not self.carryover:
            return self.tokens
        return self.tokens + max(0, self.tokens - used_before)

    def describe(self) -> str:
        return f"{self.tokens} tokens a {self.period}" + (" with carryover" if self.carryover else "")


@dataclass(frozen=True)
class LessonHours:
    days: frozenset[int]  # 0 is Monday, as datetime.weekday()
    start: time
    end: time

    def holds(self, now: datetime) -> bool:
        return now.weekday() in self.days and self.start <= now.time().replace(tzinfo=None) < self.end

    def describe(self) -> str:
        days = "daily" if len(self.days) == 7 else "+".join(DAY_NAMES[d] for d in sorted(self.days))
        return f"{days}@{self.start:%H:%M}-{self.end:%H:%M}"


@dataclass(frozen=True)
class Limits:
    budget: Budget | None = None
    valid_from: date | None = None
    valid_until: date | None = None
    hours: tuple[LessonHours, ...] = ()
    models: frozenset[str] | None = None  # None: every model
    priority: int | None = None  # None: the role's (roles.Role)

    def allows_model(self, names: tuple[str, ...]) -> bool:
        """Whether a model known by `names` (its id and aliases) is one this key may use."""
        return self.models is None or any(name.removesuffix(":latest") in self.models for name in names)

    def window_refusal(self, now: datetime) -> str | None:
        """Why the key may not be used at `now` (its dates, its lesson hours), or None."""
        today = now.date()
        if self.valid_from is not None and today < self.valid_from:
            return f"this key is valid from {self.valid_from.isoformat()}"
        if self.valid_until is not None and today > self.valid_until:
            return f"this key was valid until {self.valid_until.isoformat()}"
        if self.hours and not any(window.holds(now) for window in self.hours):
            hours = ",".join(window.describe() for window in self.hours)
            opens = next_opening(self.hours, now)
            return f"outside this key's lesson hours ({hours})" + \
                (f"; they open again at {opens:%Y-%m-%d %H:%M}" if opens is not None else "")
        return None

    def describe(self) -> dict[str, object]:
        """The limits as the key's own standing shows them (GET /v1/me)."""
        return {
            "tokens": self.budget.tokens if self.budget else None,
            "period": self.budget.period if self.budget else None,
            "carryover": self.budget.carryover if self.budget else False,
            "valid_from": self.valid_from.isoformat() if self.valid_from else None,
            "valid_until": self.valid_until.isoformat() if self.valid_until else None,
            "hours": [window.describe() for window in self.hours],
            "models": sorted(self.models) if self.models is not None else None,
        }


def next_opening(hours: tuple[LessonHours, ...], now: datetime) -> datetime | None:
    """The first start of a lesson window after `now` (within the coming week)."""
    starts = [datetime.combine(now.date() + timedelta(days=ahead), window.start, tzinfo=now.tzinfo)
              for ahead in range(8) for window in hours
              if (now.date() + timedelta(days=ahead)).weekday() in window.days]
    later = [start for start in starts if start > now]
    return min(later) if later else None


def _days(text: str) -> frozenset[int]:
    if text == "daily":
        return frozenset(range(7))
    days: set[int] = set()
    for part in text.split("+"):
        first, _, last = part.partition("-")
        if first not in DAY_NAMES or (last and last not in DAY_NAMES):
            raise LimitError(f"hours: {part!r} is not a day or a range of days (mon..sun, mon-fri, daily)")
        a, b = DAY_NAMES.index(first), DAY_NAMES.index(last or first)
        days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(days)


def _clock(text: str) -> time:
    try:
        return time.fromisoformat(text)
    except ValueError:
        raise LimitError(f"hours: {text!r} is not a time of day (HH:MM)") from None


def parse_hours(value: str) -> tuple[LessonHours, ...]:
    if value == "always":
        return ()
    windows = []
    for part in value.split(","):
        days, at, span = part.rpartition("@")
        start, dash, end = span.partition("-")
        if not dash:
            raise LimitError(f"hours: {part!r} is not DAYS@HH:MM-HH:MM (e.g. mon-fri@09:00-12:00)")
        window = LessonHours(_days(days if at else "daily"), _clock(start), _clock(end))
        if window.end <= window.start:
            raise LimitError(f"hours: {part!r} ends before it starts")
        windows.append(window)
    return tuple(windows)


def parse_budget(value: str, carryover: bool) -> Budget | None:
    if value == "none":
        return None
    count, slash, period = value.partition("/")
    if not slash or period not in ("day", "week") or not count.isdigit():
        raise LimitError(f"tokens: {value!r} is not N/day or N/week (e.g. tokens=20000/week)")
    return Budget(int(count), "day" if period == "day" else "week", carryover)


def _date(field: str, value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise LimitError(f"{field}: {value!r} is not a date (YYYY-MM-DD)") from None


def _yes(value: str) -> bool:
    if value.lower() in ("yes", "true", "1", "on"):
        return True
    if value.lower() in ("no", "false", "0", "off"):
        return False
    raise LimitError(f"carryover: {value!r} is not yes or no")


def parse_fields(words: list[str]) -> dict[str, str]:
    """`field=value` words, each field once."""
    fields: dict[str, str] = {}
    for word in words:
        field, eq, value = word.partition("=")
        if not eq:
            raise LimitError(f"expected `KEY [name] [field=value ...]`, and {word!r} is not field=value "
                             "(a name is one word)")
        if field not in FIELDS:
            raise LimitError(f"{word!r} is not one of the limit fields ({', '.join(f + '=' for f in FIELDS)})")
        if field in fields:
            raise LimitError(f"{field} is given twice")
        fields[field] = value
    return fields


def apply_fields(base: Limits, fields: dict[str, str]) -> Limits:
    """`base` (the defaults in force) with the fields of one line over it."""
    changes: dict[str, object] = {}
    kept = base.budget.carryover if base.budget else False
    carryover = _yes(fields["carryover"]) if "carryover" in fields else kept
    if "tokens" in fields:
        changes["budget"] = parse_budget(fields["tokens"], carryover)
    elif "carryover" in fields and base.budget is not None:
        changes["budget"] = replace(base.budget, carryover=carryover)
    if "from" in fields:
        changes["valid_from"] = _date("from", fields["from"])
    if "until" in fields:
        changes["valid_until"] = _date("until", fields["until"])
    if "hours" in fields:
        changes["hours"] = parse_hours(fields["hours"])
    if "models" in fields:
        names = [name.strip() for name in fields["models"].split(",") if name.strip()]
        changes["models"] = None if names == ["all"] else frozenset(name.removesuffix(":latest") for name in names)
    if "priority" in fields:
        try:
            changes["priority"] = int(fields["priority"])
        except ValueError:
            raise LimitError(f"priority: {fields['priority']!r} is not a whole number") from None
    limits = replace(base, **changes)  # type: ignore[arg-type]  # the keys are Limits' own fields
    if limits.valid_from and limits.valid_until and limits.valid_until < limits.valid_from:
        raise LimitError(f"until ({limits.valid_until}) is before from ({limits.valid_from})")
    return limits
