"""Lab 04-04 (one server, many clients): what `kinetic grade lab-04-04` checks, and for how many points.

load.py prints four lines a run: the server's -np with the clients, requests, tokens and wall time;
aggregate and per-stream tokens/s with TTFT p50/p95; the prompt cache; the requests' short ids.
They are found by their shape anywhere in the file; the table and the answers by their heading.

- The file alone: the runs agree with each other and with physics (tokens = requests x 32;
  aggregate x wall = tokens; aggregate >= per stream, and at most clients x per stream; p50 <= p95
  < wall), and the table is made of them. Never the lab text's examples.
- `--ledger` (a server run with `--api-key-file` and `--ledger`): the requests of each run the ledger
  holds are this student's, as many as the run says, at most `clients` of them at once (and that
  many at the start), with a first token and an end no later than the client's clock says.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime

from kinetic.grading import Context, Failure, Fingerprint, Lab, Skip
from kinetic.grading.deliverable import Deliverable
from kinetic.grading.ledger_view import Record, author_ledger
from kinetic.grading.usage_lines import CHAT_ROUTES, NUM

lab = Lab("lab-04-04", "One server, many clients", deliverable_min_outputs=2, copy_weight=3, copy_points=1)

MAX_TOKENS = 32  # load.py's max_tokens, with ignore_eos: every request generates exactly this many
RUN_RE = re.compile(rf"\[np=(\d+|\?), (\d+) clients?, (\d+) (?:richieste|requests), (\d+) token in {NUM}s\]")
SPEED_RE = re.compile(rf"\[(?:aggregato|aggregate) {NUM} t/s, per stream {NUM} t/s, TTFT p50 {NUM}s p95 {NUM}s\]")
CACHE_RE = re.compile(r"\[cache: prompt (\d+) tok, cache_n (?:medio|mean) (\d+)\]")
IDS_RE = re.compile(r"\[id: ([\w ]+)\]")
ROW_RE = re.compile(rf"^\s*\|\s*[^|\d]*(\d+)[^|]*\|\s*(\d+)\s*\|\s*{NUM}\s*\|\s*{NUM}\s*\|\s*{NUM}\s*\|\s*{NUM}\s*\|")
QUESTIONS = {
    "aggregate": re.compile(r"aggregat|why|perch", re.I),
    "memory": re.compile(r"memor", re.I),
    "class": re.compile(r"30|class", re.I),
}


@dataclass(frozen=True)
class LoadRun:
    np: int | None
    clients: int
    requests: int
    tokens: int
    wall: float
    aggregate: float
    per_stream: float
    p50: float
    p95: float
    prompt: int | None
    cache_n: int | None
    ids: tuple[str, ...]
    line: str


@dataclass
class Outputs:
    runs: list[LoadRun]
    rows: list[tuple[int, int, float, float, float, float]]
    answers: dict[str, list[str]]


def parse_outputs(deliverable: Deliverable) -> Outputs:
    lines = deliverable.lines
    runs = []
    for index, line in enumerate(lines):
        head = RUN_RE.search(line)
        if head is None or index + 1 >= len(lines) or (speed := SPEED_RE.search(lines[index + 1])) is None:
            continue
        cache = CACHE_RE.search(lines[index + 2]) if index + 2 < len(lines) else None
        ids = IDS_RE.search(lines[index + 3]) if index + 3 < len(lines) else None
        runs.append(LoadRun(None if head[1] == "?" else int(head[1]), int(head[2]), int(head[3]), int(head[4]),
                            float(head[5]), float(speed[1]), float(speed[2]), float(speed[3]), float(speed[4]),
                            int(cache[1]) if cache else None, int(cache[2]) if cache else None,
                            tuple(ids[1].split()) if ids else (), head[0]))
    rows = [(int(m[1]), int(m[2]), float(m[3]), float(m[4]), float(m[5]), float(m[6]))
            for m in map(ROW_RE.match, deliverable.lines) if m]
    answers: dict[str, list[str]] = {}
    for key, pattern in QUESTIONS.items():
        found = [s for s in deliverable.sections if pattern.search(s.heading) and not ROW_RE.match(s.heading)
                 and not re.search(r"-np \d|np 1|np 4|default|table|tabella", s.heading, re.I)]
        if found and found[-1].prose:
            answers[key] = found[-1].prose
    return Outputs(runs, rows, answers)


def outputs(ctx: Context) -> Outputs:
    return ctx.parsed("outputs", lambda: parse_outputs(ctx.deliverable))


@lab.outputs_found
def count_outputs(deliverable: Deliverable) -> int:
    found = parse_outputs(deliverable)
    return len(found.runs) + bool(found.rows) + len(found.answers)


@lab.fingerprints
def fingerprints(ctx: Context) -> list[Fingerprint]:
    prints = []
    for run in outputs(ctx).runs:
        if run.ids:
            prints.append(Fingerprint("the [id: ...] line", " ".join(run.ids), 3))
        prints.append(Fingerprint("a speeds line", f"{run.aggregate} {run.per_stream} {run.p50} {run.p95}", 2))
    return prints


def _runs(ctx: Context) -> list[LoadRun]:
    runs = outputs(ctx).runs
    if not runs:
        raise Skip("no load.py output is pasted (see outputs_present)")
    return runs


# ---------------------------------------------------------------------------------------------
# The file alone

@lab.check(points=2)
def outputs_present(ctx: Context) -> None:
    """lab-04-04.md holds load.py's runs against -np 1 and a server with more slots, the table and the
    three answers."""
    found = outputs(ctx)
    missing = []
    slots = {run.np for run in found.runs}
    if len(found.runs) < 3:
        missing.append(f"load.py's output of at least three runs (found {len(found.runs)})")
    if 1 not in slots:
        missing.append("a run against a server started with -np 1")
    if not any(n is not None and n > 1 for n in slots):
        missing.append("a run against a server with more slots (-np 4, or the default)")
    if len(found.rows) < 3:
        missing.append("the table, one row per run")
    missing += [f"the answer to the question on {key}" for key in QUESTIONS if key not in found.answers]
    if missing:
        raise Failure("missing: " + "; ".join(missing),
                      "paste each run as load.py printed it and answer under the template's headings")


@lab.check(points=2)
def load_numbers_agree(ctx: Context) -> None:
    """each run's numbers agree with each other and with physics: 32 tokens a request, aggregate x wall
    = tokens, per stream <= aggregate <= clients x per stream, TTFT p50 <= p95 < wall, one id a request."""
    for run in _runs(ctx):
        where = run.line
        if run.tokens != run.requests * MAX_TOKENS:
            raise Failure(f"{where}: {run.requests} requests of {MAX_TOKENS} tokens are {run.requests * MAX_TOKENS} "
                          f"tokens, not {run.tokens}", "paste the lines of one run, unedited")
        if abs(run.aggregate * run.wall - run.tokens) > 0.05 * run.aggregate + 0.05 * run.wall + 1:
            raise Failure(f"{where}: {run.aggregate} t/s for {run.wall}s is not {run.tokens} tokens",
                          "the aggregate is the tokens over the wall time: paste the lines of one run")
        if run.per_stream > run.aggregate * 1.05 + 0.1:
            raise Failure(f"{where}: per stream {run.per_stream} t/s is above the aggregate {run.aggregate} t/s",
                          "the streams together cannot be slower than one of them: paste the lines of one run")
        if run.aggregate > run.clients * run.per_stream * 1.05 + 0.1:
            raise Failure(f"{where}: aggregate {run.aggregate} t/s is more than {run.clients} streams at "
                          f"{run.per_stream} t/s", "paste the lines of one run, unedited")
        if not run.p50 <= run.p95 <= run.wall + 0.05:
            raise Failure(f"{where}: TTFT p50 {run.p50}s, p95 {run.p95}s, wall {run.wall}s are not in that order",
                          "p50 <= p95, and a first token comes before the run ends")
        if run.ids and len(run.ids) != run.requests:
            raise Failure(f"{where}: {len(run.ids)} ids for {run.requests} requests", "paste the [id: ...] line whole")
        if run.prompt is not None and run.cache_n is not None and run.cache_n > run.prompt:
            raise Failure(f"{where}: cache_n {run.cache_n} above the prompt's {run.prompt} tokens",
                          "paste the [cache: ...] line of the same run")


@lab.check()
def table_from_outputs(ctx: Context) -> None:
    """every row of the table is one of the pasted runs (np, clients, the four numbers)."""
    found = outputs(ctx)
    if not found.rows:
        raise Skip("no table (see outputs_present)")
    pasted = {(run.np, run.clients, run.aggregate, run.per_stream, run.p50, run.p95) for run in found.runs}
    for row in found.rows:
        if row not in pasted:
            raise Failure(f"the row np={row[0]}, {row[1]} clients, {row[2]} / {row[3]} t/s, TTFT {row[4]} / {row[5]} s "
                          "is none of the runs pasted above", "copy each row from the first two lines of its run")


@lab.check()
def answers_given(ctx: Context) -> None:
    """the three questions are answered, and the memory answer speaks of the KV cache or the context."""
    answers = outputs(ctx).answers
    if len(answers) < len(QUESTIONS):
        raise Skip("an answer is missing (see outputs_present)")
    if not re.search(r"\bkv\b|cache|context|contesto|-c\b", "\n".join(answers["memory"]), re.I):
        raise Failure("the memory answer names neither the KV cache nor the context",
                      "each slot holds its own KV cache: say what -c and -np share")


# ---------------------------------------------------------------------------------------------
# Against a ledger

def _time(record: Record) -> tuple[float, float] | None:
    """(start, end) of a request in seconds, on the server's clock."""
    try:
        end = datetime.fromisoformat(record.time.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return end - record.duration_s, end


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """Most requests in flight at once: an end at the very time of a start is not an overlap."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def percentile(values: list[float], q: float) -> float:
    """load.py's nearest rank."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def _by_short_id(records: list[Record], short: str) -> list[Record]:
    return [r for r in records if (r.id or "").removeprefix("chatcmpl-").startswith(short)]


@lab.check(points=2, needs="ledger")
def load_runs_in_ledger(ctx: Context) -> str:
    """the requests of every run the ledger holds are yours: as many as the run says, streamed, 32 tokens
    each, `clients` of them in flight at the start and never more, first tokens and ends within the
    client's clock. Runs on a server without this ledger (your own) are checked by the file alone."""
    ledger = author_ledger(ctx.ledger)
    notes, elsewhere = [], 0
    for run in _runs(ctx):
        if not run.ids:
            raise Failure(f"{run.line}: no [id: ...] line", "paste load.py's whole output")
        anyone = [_by_short_id(ledger.view.records, short) for short in run.ids]
        if not any(anyone):
            elsewhere += 1
            continue
        records = []
        for short, found in zip(run.ids, anyone, strict=True):
            mine = [r for r in found if r.client == ledger.name]
            if not mine:
                owner = found[0].client if found else None
                raise Failure(f"{run.line}: the request {short} is " + (f"a request of {owner}" if found else
                              "not in the ledger, where the others of this run are"),
                              "run load.py yourself, with your key, and paste its output unedited")
            records.append(mine[0])
        bad = [r for r in records if r.route not in CHAT_ROUTES or r.status != 200
               or not r.stream or r.timing("predicted_n") != MAX_TOKENS]
        if bad:
            raise Failure(f"{run.line}: {len(bad)} of its requests are not streamed answers of {MAX_TOKENS} tokens",
                          "run load.py as it is and paste its output")
        spans = [span for r in records if (span := _time(r)) is not None]
        at_once = max_overlap(spans)
        if at_once != min(run.clients, run.requests):
            raise Failure(f"{run.line}: of these requests the server had in flight at most {at_once}, not "
                          f"{min(run.clients, run.requests)}", "paste the --clients of the run you made")
        ttfts = [r.ttft_s or 0.0 for r in records]
        if percentile(ttfts, 0.5) > run.p50 + 0.01 or percentile(ttfts, 0.95) > run.p95 + 0.01:
            raise Failure(f"{run.line}: the server sent the first tokens later than your TTFT p50/p95 say",
                          "paste the lines of one run, unedited")
        span = max(end for _, end in spans) - min(start for start, _ in spans)
        if span > run.wall + 0.1:
            raise Failure(f"{run.line}: the server spent {span:.1f}s on these requests, more than the {run.wall}s "
                          "load.py measured", "paste the lines of one run, unedited")
        notes.append(f"{run.requests} requests, {at_once} at once")
    if not notes:
        raise Failure(f"none of the runs is in the ledger of {ctx.ledger.view.source}",
                      "run load.py once against the class server, with your key, and paste it")
    return "; ".join(notes) + (f"; {elapsed} run(s) on another server: file checks only"
                               if (elapsed := elsewhere) else "")
