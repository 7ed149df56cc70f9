"""A key's limits in the key file, and the budget arithmetic: periods, reset, carryover, lesson hours,
read back from a ledger, on an injected clock (no sleeps)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime, time, timedelta, timezone
from pathlib import Path

import pytest

from kinetic.backends.upstream.line import WaitingLine
from kinetic.classroom.budgets import Budgets, go_duration
from kinetic.classroom.caller import ADMIN_PRIORITY, Caller
from kinetic.classroom.keys import KeyFileError, KeyRing, parse_key_lines
from kinetic.classroom.ledger import LedgerRecord
from kinetic.classroom.limits import Budget, LessonHours, Limits
from kinetic.classroom.roles import Role
from kinetic.errors import QueueFullError
from kinetic.scheduling.fairqueue import FairQueue

ROME = timezone(timedelta(hours=1))
WEDNESDAY = datetime(2026, 12, 2, 10, 30, tzinfo=ROME)  # 2026-12-02 is a Wednesday

CLASS_FILE = """\
# COMP-style class: one defaults line, then the keys
* tokens=1000/week carryover=yes from=2026-09-01 until=2026-12-18 hours=mon-fri@09:00-12:00 models=qwen-0.8b
sk-a alice
sk-b bob tokens=50/day
sk-t tina priority=1 tokens=none hours=always models=all
sk-old                       # an unnamed key keeps its position name
"""


class Clock:
    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def test_a_defaults_line_applies_to_the_keys_below_it_and_a_line_overrides_it() -> None:
    alice, bob, tina, old = parse_key_lines(CLASS_FILE)
    assert (alice.name, old.name) == ("alice", "key-4")
    assert alice.limits == old.limits
    assert alice.limits.budget == Budget(1000, "week", carryover=True)
    assert alice.limits.valid_from == date(2026, 9, 1) and alice.limits.valid_until == date(2026, 12, 18)
    assert alice.limits.hours == (LessonHours(frozenset(range(5)), time(9), time(12)),)
    assert alice.limits.models == frozenset({"qwen-0.8b"}) and alice.limits.priority is None
    assert bob.limits.budget == Budget(50, "day", carryover=True)  # the defaults' carryover stays
    assert tina.limits.budget is None and tina.limits.hours == () and tina.limits.models is None
    assert tina.limits.priority == 1
    assert parse_key_lines("sk-plain plain\n")[0].limits == Limits()  # `KEY name` lines are what they were


@pytest.mark.parametrize("line, words", [
    ("k a tokens=10/month", "tokens: '10/month' is not N/day or N/week"),
    ("k a tokens=ten/day", "is not N/day or N/week"),
    ("k a hours=mon-fri@9-12", "hours: '9' is not a time of day"),
    ("k a hours=noday@09:00-10:00", "'noday' is not a day"),
    ("k a hours=mon@12:00-09:00", "ends before it starts"),
    ("k a from=2026-13-01", "from: '2026-13-01' is not a date"),
    ("k a from=2026-12-01 until=2026-11-01", "until (2026-11-01) is before from (2026-12-01)"),
    ("k a priority=high", "priority: 'high' is not a whole number"),
    ("k a carryover=maybe", "carryover: 'maybe' is not yes or no"),
    ("k a budget=10/day", "'budget=10/day' is not one of the limit fields"),
    ("k a tokens=1/day tokens=2/day", "tokens is given twice"),
])
def test_a_bad_limit_names_the_line_and_the_field(line: str, words: str) -> None:
    with pytest.raises(KeyFileError, match="line 2: ") as caught:
        parse_key_lines(f"sk-ok ok\n{line}\n")
    assert words in str(caught.value)


def test_a_week_resets_on_monday_and_carries_over_only_the_week_before() -> None:
    clock = Clock(WEDNESDAY)
    budgets = Budgets(clock)
    alice = Caller("alice", Role.STUDENT, Limits(budget=Budget(1000, "week", carryover=True)))
    budgets.record(LedgerRecord(**{"client": "alice", "prompt_tokens": 100, "completion_tokens": 200}),
                   when=WEDNESDAY - timedelta(days=7))  # last week: 300 of 1000 used
    budgets.record(LedgerRecord(**{"client": "alice", "prompt_tokens": 400, "completion_tokens": 0}),
                   when=WEDNESDAY - timedelta(days=14))  # the week before that does not carry
    budgets.record(LedgerRecord(**{"client": "alice", "prompt_tokens": 500, "completion_tokens": 100}))
    standing = budgets.standing(alice)
    assert standing is not None
    assert (standing.allowance, standing.used, standing.left) == (1000 + 700, 600, 1100)
    assert standing.resets_at == datetime(2026, 12, 7, 0, 0, tzinfo=ROME)
    clock.now = datetime(2026, 12, 7, 0, 0, 1, tzinfo=ROME)  # next Monday: this week's 400 unused carry
    after = budgets.standing(alice)
    assert after is not None and (after.allowance, after.used) == (1000 + 400, 0)


def test_over_budget_is_a_429_that_says_which_limit_and_when_it_resets() -> None:
    clock = Clock(WEDNESDAY)
    budgets = Budgets(clock)
    bob = Caller("bob", Role.STUDENT, Limits(budget=Budget(50, "day")))
    assert budgets.refusal(bob, "POST", "/v1/chat/completions") is None
    budgets.record(LedgerRecord(**{"client": "bob", "prompt_tokens": 30, "completion_tokens": 25}))
    refusal = budgets.refusal(bob, "POST", "/v1/chat/completions")
    assert refusal is not None and refusal.status == 429
    assert "55 of 50 tokens this day" in refusal.message and "2026-12-03 00:00 (in 13h30m0s)" in refusal.message
    assert refusal.headers == {"Retry-After": str(13 * 3600 + 30 * 60)}
    assert budgets.refusal(bob, "POST", "/tokenize") is None  # runs no model: free
    assert budgets.refusal(bob, "GET", "/v1/models") is None
    assert dict(budgets.headers(bob)) == {b"x-ratelimit-limit-tokens": b"50", b"x-ratelimit-remaining-tokens": b"0",
                                          b"x-ratelimit-reset-tokens": b"13h30m0s"}
    clock.now = WEDNESDAY + timedelta(days=1)
    assert budgets.refusal(bob, "POST", "/v1/chat/completions") is None  # a new day


def test_lesson_hours_and_dates_are_403s_that_say_when_the_key_opens() -> None:
    clock = Clock(datetime(2026, 12, 2, 12, 0, tzinfo=ROME))  # Wednesday noon: the window has just closed
    budgets = Budgets(clock)
    limits = parse_key_lines("k s hours=mon+wed@09:00-12:00,fri@14:00-16:00 until=2026-12-18\n")[0].limits
    student = Caller("s", Role.STUDENT, limits)
    refusal = budgets.refusal(student, "GET", "/v1/models")
    assert refusal is not None and refusal.status == 403
    assert refusal.message == ("outside this key's lesson hours (mon+wed@09:00-12:00,fri@14:00-16:00); "
                               "they open again at 2026-12-04 14:00")
    assert budgets.refusal(student, "GET", "/v1/me") is None  # where the student reads why
    clock.now = datetime(2026, 12, 4, 14, 0, tzinfo=ROME)
    assert budgets.refusal(student, "POST", "/v1/chat/completions") is None
    clock.now = datetime(2026, 12, 21, 9, 30, tzinfo=ROME)  # a Monday, in hours, after the term
    late = budgets.refusal(student, "POST", "/v1/chat/completions")
    assert late is not None and late.message == "this key was valid until 2026-12-18"


def test_usage_is_read_back_from_the_ledger(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    now = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    lines = [{"time": (now - timedelta(hours=1)).isoformat().replace("+00:00", "Z"), "client": "alice",
              "route": "/v1/chat/completions", "status": 200, "prompt_tokens": 7, "completion_tokens": 5},
             {"time": (now - timedelta(days=30)).isoformat(), "client": "alice", "prompt_tokens": 900},
             {"time": now.isoformat(), "client": None, "status": 401}]
    ledger.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n", encoding="utf-8")
    budgets = Budgets(Clock(now))
    assert budgets.load_ledger(ledger) == 2
    alice = Caller("alice", Role.STUDENT, Limits(budget=Budget(100, "day")))
    standing = budgets.standing(alice)
    assert standing is not None and standing.used == 12
    assert [r["route"] for r in budgets.recent("alice")] == ["/v1/chat/completions"]
    assert budgets.recent("bob") == [] and budgets.load_ledger(tmp_path / "none.jsonl") == 0


def test_a_model_list_matches_ids_and_aliases_and_the_ollama_tag() -> None:
    limits = parse_key_lines("k s models=qwen-0.8b,gemma\n")[0].limits
    assert limits.allows_model(("Qwen/whatever.gguf", "qwen-0.8b"))
    assert limits.allows_model(("gemma:latest",))
    assert not limits.allows_model(("llama-3",))
    assert Limits().allows_model(("anything",))


def test_the_admin_is_served_first_unless_the_key_file_says_otherwise(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-a alice\nsk-t tina priority=1\n", encoding="utf-8")
    ring = KeyRing(file=keys, admin="sk-admin")
    admin = ring.entry_for("sk-admin")
    assert admin is not None and Caller(admin.name, Role.ADMIN, admin.limits).priority == ADMIN_PRIORITY
    assert Caller("alice", Role.STUDENT).priority == 0
    keys.write_text("sk-a alice tokens=5/day\n", encoding="utf-8")  # SIGHUP: the limits change with the file
    ring.reload()
    alice = ring.entry_for("sk-a")
    assert alice is not None and alice.limits.budget == Budget(5, "day")


def test_a_higher_priority_is_served_before_any_lower_one_fair_or_not() -> None:
    for fair in (True, False):
        queue: FairQueue[str] = FairQueue(fair=fair)
        for item in ("a1", "a2", "b1"):
            queue.push(item[0], item)
        queue.push("t", "t1", priority=1)
        queue.push("t", "t2", priority=1)
        order = []
        while queue:
            client, item = next(queue.in_order())
            queue.served(client, item)
            order.append(item)
        assert order[:2] == ["t1", "t2"] and sorted(order[2:]) == ["a1", "a2", "b1"]


def test_reset_durations_read_as_openai_writes_them() -> None:
    assert go_duration(timedelta(seconds=1)) == "1s"
    assert go_duration(timedelta(minutes=6)) == "6m0s"
    assert go_duration(timedelta(days=2, seconds=61)) == "48h1m1s"


def test_an_upstreams_line_past_its_cap_is_a_503_at_once_and_gives_back_its_place() -> None:
    async def flow() -> None:
        line = WaitingLine(1, fair=True, own_limit=0, shared=None, max_queue=1)
        await line.take_turn("a")  # the one connection
        waiting = asyncio.ensure_future(line.take_turn("b"))
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError) as refused:
            await line.take_turn("c")
        assert refused.value.status == 503 and refused.value.headers == {"Retry-After": "2"}
        assert len(line) == 1
        line.end_turn()  # a's answer is done: b goes on
        await waiting
        assert len(line) == 0 and line.running == 1

    asyncio.run(flow())
