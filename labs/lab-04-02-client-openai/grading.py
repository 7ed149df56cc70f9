"""Lab 04-02 (OpenAI-compatible clients): what `kinetic grade lab-04-02` checks, and for how many points.

The outputs are found by their shape anywhere in the file (the lines chat.py and chat.mjs print),
whatever headings, labels, fences or prose surround them; only the answer to the question is
found by its heading or label. Italian labels are the scripts' own; English ones are accepted
(`generation`, `first token after`, `total`, `[end]`). Numbers are printed rounded, so every
comparison allows for that rounding.

Three levels of evidence, each stated in the report:
- the file alone: every output is there and its numbers agree with each other;
- `--ledger` (the class server's request ledger): every pasted number is a request of this
  student, exactly where the server printed the number and within the client's own clock;
- `--server` (a running server): the prompt count is this model's, and the speeds are within a
  stated factor of the grader's own measurement.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from kinetic.grading import Context, Failure, Fingerprint, Lab, Skip, Unchecked
from kinetic.grading.deliverable import Deliverable
from kinetic.grading.ledger_view import (
    Record,
    author_ledger,
    describe_record,
    printed_alike,
    timing,
    whose,
)
from kinetic.grading.usage_lines import (
    CHAT_ROUTES,
    NUM,
    SERVER_RE,
    USAGE_RE,
    UsageRun,
    numbers_problem,
    served_as_printed,
    within_clock,
)

lab = Lab("lab-04-02", "OpenAI-compatible clients", deliverable_min_outputs=2, copy_weight=3, copy_points=1)

# chat.py's messages and extra body: the live check counts their tokens through the server's template.
# tests/e2e/test_lab_04_02.py keeps them equal to chat.py.
CHAT_PY_MESSAGES = [
    {"role": "system", "content": "Rispondi in italiano, in modo breve."},
    {"role": "user", "content": "Che cos'è llama.cpp?"},
]
CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}
MAX_TOKENS = 80  # chat.py's and chat.mjs's max_tokens
# Reported speeds must lie within these factors (either way) of the grader's own measurement: the
# same server varies with load, and a made-up number is usually off by far more. Prompt speed gets
# more room: over a ~30-token prompt it is dominated by fixed per-batch costs, and a fresh server's
# first request (the student's first run) is several times slower than the next ones.
GENERATION_SPEED_FACTOR = 4.0
PROMPT_SPEED_FACTOR = 10.0
# chat.py and chat.mjs ran against the same server minutes apart: their generation speeds agree
# within this factor (different prompts, same model and machine). Wide on purpose: a fresh server's
# first request (chat.py, step 4) is several times slower than the next ones, and a machine busy with
# other work swings further (measured on the course machine: 16.9 then 92.6 t/s; more than 10x apart
# under load). It catches numbers from different machines or invented ones, not a slow moment.
SAME_SERVER_FACTOR = 25.0
STREAM_RE = re.compile(rf"\[(\d+) chunks?, (?:primo token dopo|first token after) {NUM}s, (?:totale|total) {NUM}s\]")
TOKENS_RE = re.compile(rf"\[(\d+) tokens?, {NUM} t/s\]")
END_RE = re.compile(r"^\W*\[(?:fine|end)\]\W*$")
ERROR_RE = re.compile(r"(?:openai\.)?AuthenticationError: Error code: (\d+) - (.*)$")
EXPECTED_401 = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
ANSWER_HEADING = re.compile(r"answer|risposta|question|domanda|openai api|api (?:di |reale|vera)|real api|"
                            r"which lines|quali righe", re.I)
# "Risposta completa di chat.py" is an output, not the answer.
OUTPUT_HEADING = re.compile(r"chat\.py|chat\.mjs|node|stream|401|error", re.I)
ANSWER_TERMS = {
    "base_url": re.compile(r"base[_ ]?url", re.I),
    "api_key": re.compile(r"api[_ ]?key", re.I),
    "model": re.compile(r"\bmodel", re.I),
}


@dataclass(frozen=True)
class StreamRun:
    chunks: int
    ttft: float
    total: float
    line: str


@dataclass(frozen=True)
class TokensLine:
    tokens: int
    tps: float
    line: str


@dataclass
class Outputs:
    full: list[UsageRun]
    stray_usage: bool  # a usage line without its [server: ...] line, or the reverse
    stream: list[StreamRun]
    tokens: list[TokensLine]
    end: bool
    error_line: str | None
    answer: list[str] | None  # None: no answer heading or label


def parse_outputs(deliverable: Deliverable) -> Outputs:
    lines = deliverable.lines
    full: list[UsageRun] = []
    usage = None
    stray = False
    for line in lines:
        if (match := USAGE_RE.search(line)) is not None:
            stray = stray or usage is not None
            usage = match
        elif (server := SERVER_RE.search(line)) is not None:
            if usage is None:
                stray = True
                continue
            full.append(UsageRun.read(usage, server))
            usage = None
    stray = stray or usage is not None
    stream = [StreamRun(int(m[1]), float(m[2]), float(m[3]), m[0]) for m in map(STREAM_RE.search, lines) if m]
    tokens = [TokensLine(int(m[1]), float(m[2]), m[0]) for m in map(TOKENS_RE.search, lines) if m]
    error = next((m[0].strip("` ") for m in map(ERROR_RE.search, lines) if m), None)
    if error is None:
        error = next((text.strip() for text in lines if "Error code" in text or "AuthenticationError" in text), None)
    answers = [s for s in deliverable.sections if ANSWER_HEADING.search(s.heading)
               and not OUTPUT_HEADING.search(s.heading)]
    answer = answers[-1].prose if answers else None
    return Outputs(full, stray, stream, tokens, any(END_RE.match(text) for text in lines), error, answer)


def outputs(ctx: Context) -> Outputs:
    return ctx.parsed("outputs", lambda: parse_outputs(ctx.deliverable))


@lab.outputs_found
def count_outputs(deliverable: Deliverable) -> int:
    found = parse_outputs(deliverable)
    return sum(map(bool, (found.full, found.stream, found.tokens, found.error_line, found.answer)))


@lab.fingerprints
def fingerprints(ctx: Context) -> list[Fingerprint]:
    found = outputs(ctx)
    prints = []
    for run in found.full:
        prints.append(Fingerprint("the [server: ...] line", f"{run.cache_n} {run.prompt_tps} {run.generation_tps}", 2))
        prints.append(Fingerprint("the usage line", f"{run.finish_reason} {run.prompt} {run.completion} {run.seconds}"))
    prints += [Fingerprint("the stream line", f"{s.chunks} {s.ttft} {s.total}") for s in found.stream]
    prints += [Fingerprint(f"the {t.line} line", f"{t.tokens} {t.tps}") for t in found.tokens]
    return prints


def parse_error_payload(line: str) -> tuple[int, Any] | None:
    """`Error code: 401 - {...}` -> (401, the dict), or (401, "message") for newer SDKs."""
    match = ERROR_RE.search(line)
    if match is None:
        return None
    payload = match[2].strip().strip("`").strip()
    try:
        return int(match[1]), ast.literal_eval(payload)
    except (ValueError, SyntaxError):
        return int(match[1]), payload


def error_matches(payload: Any, body: Any) -> bool:
    """The SDK prints the whole JSON body (openai 3.x) or only its error message (newer SDKs)."""
    if payload == body:
        return True
    message = body.get("error", {}).get("message") if isinstance(body, dict) else None
    return isinstance(message, str) and payload == message


def ratio_off(reported: float, measured: float) -> float:
    if reported <= 0 or measured <= 0:
        return float("inf")
    return max(reported / measured, measured / reported)


def _full_runs(ctx: Context) -> list[UsageRun]:
    runs = outputs(ctx).full
    if not runs:
        raise Skip("chat.py's usage and [server: ...] lines are missing (see outputs_present)")
    return runs


# ---------------------------------------------------------------------------------------------
# The file alone

@lab.check(points=2)
def outputs_present(ctx: Context) -> None:
    """lab-04-02.md holds every output: chat.py (usage and server lines), chat.py --stream, chat.mjs
    (token line and [fine]), the 401 error line and the answer."""
    found = outputs(ctx)
    missing = []
    if not found.full:
        missing.append("chat.py's [finish_reason=...] line with the [server: cache_n=...] line after it")
    if not found.stream:
        missing.append("chat.py --stream's [N chunk, primo token dopo ...] line")
    if not found.tokens:
        missing.append("chat.mjs's [N token, X t/s] line")
    if not found.end:
        missing.append("the [fine] line of node chat.mjs --stream")
    if found.error_line is None:
        missing.append("the openai.AuthenticationError line of step 8")
    if not found.answer:
        missing.append("the answer (under a heading or label such as 'Answer' or 'Risposta')")
    if missing:
        raise Failure("missing: " + "; ".join(missing),
                      "paste each whole output as the script printed it; start from the lab-04-02.md template")


@lab.check()
def chat_py_numbers_agree(ctx: Context) -> None:
    """the numbers in chat.py's full output agree with each other."""
    for run in _full_runs(ctx):
        problem = numbers_problem(run, MAX_TOKENS)
        if problem:
            raise Failure(*problem)
        if run.finish_reason == "length" and run.completion != MAX_TOKENS:
            raise Failure(f"finish_reason=length after {run.completion} tokens, but chat.py stops at {MAX_TOKENS}",
                          "copy the usage line of one run without editing it")


@lab.check()
def stream_ttft(ctx: Context) -> None:
    """chat.py --stream reports chunks, time to first token and total time, with TTFT below the total
    and no more chunks than tokens asked for."""
    runs = outputs(ctx).stream
    if not runs:
        raise Skip("chat.py --stream's line is missing (see outputs_present)")
    for run in runs:
        if not 1 <= run.chunks <= MAX_TOKENS:
            raise Failure(f"{run.chunks} chunks: chat.py --stream asks for at most {MAX_TOKENS} tokens, one chunk each",
                          "run python chat.py --stream against a running server and paste its output")
        if run.ttft > run.total + 0.05:  # the total is rounded to 0.1s
            raise Failure(f"the first token after {run.ttft}s comes later than the total {run.total}s",
                          "TTFT is measured inside the same request: it must be smaller than the total")


@lab.check()
def chat_mjs_lines(ctx: Context) -> None:
    """chat.mjs's [N token, X t/s] lines report a generation, and agree with chat.py's speed on the same server."""
    found = outputs(ctx)
    if not found.tokens:
        raise Skip("chat.mjs's line is missing (see outputs_present)")
    for line in found.tokens:
        if not 1 <= line.tokens <= MAX_TOKENS or line.tps <= 0:
            raise Failure(f"{line.line} reports no generation chat.mjs can produce (1 to {MAX_TOKENS} tokens)",
                          "paste the numbers of a run that produced text")
    for run in found.full:
        for line in found.tokens:
            if ratio_off(line.tps, run.generation_tps) > SAME_SERVER_FACTOR:
                raise Failure(f"chat.mjs generated at {line.tps} t/s and chat.py at {run.generation_tps} t/s: "
                              f"more than {SAME_SERVER_FACTOR:g}x apart on the same server",
                              "paste runs of both scripts against the same server")


@lab.check()
def error_401_line(ctx: Context) -> None:
    """the 401 line is the openai.AuthenticationError the SDK raises for a missing or wrong key."""
    line = outputs(ctx).error_line
    parsed = None if line is None else parse_error_payload(line)
    if parsed is None:
        raise Failure("no line like openai.AuthenticationError: Error code: 401 - {...}",
                      "paste the last line of the traceback python chat.py prints when the server has --api-key")
    status, payload = parsed
    if status != 401 or not error_matches(payload, EXPECTED_401):
        raise Failure(f"this is not the error kinetic serve sends for a wrong key: {line}",
                      "the local server answers {'error': {'message': 'Invalid API Key', ...}}: "
                      "paste the line you got from it, not from another provider")


@lab.check(points=2)
def answer_names_lines(ctx: Context) -> None:
    """your answer names base_url, api_key and the model as the lines to change."""
    answer = outputs(ctx).answer
    if not answer:
        raise Skip("no answer section (see outputs_present)")
    text = "\n".join(answer)
    missing = [term for term, pattern in ANSWER_TERMS.items() if not pattern.search(text)]
    if missing:
        raise Failure(f"the answer does not mention {', '.join(missing)}",
                      "moving to the real OpenAI API changes base_url (remove it), api_key (a real key) "
                      "and model (a real model name): name each one")


# ---------------------------------------------------------------------------------------------
# Against the class server's ledger: every number is a request of this student

def _chat_ok(record: Record, *, stream: bool) -> bool:
    return record.route in CHAT_ROUTES and record.status == 200 and record.stream == stream


def _full_numbers(run: UsageRun, record: Record) -> bool:
    return not record.stream and served_as_printed(record, run)


@lab.check(points=2, needs="ledger")
def chat_py_in_ledger(ctx: Context) -> str:
    """chat.py's usage and server lines are one of your requests in the ledger, number for number,
    and it took the server no longer than chat.py's own clock says."""
    ledger = author_ledger(ctx.ledger)
    matched = []
    for run in _full_runs(ctx):
        record, others = ledger.find(lambda r, run=run: _full_numbers(run, r) and within_clock(r, run))
        if record is None:
            slow, _ = ledger.find(lambda r, run=run: _full_numbers(run, r))
            if slow is not None:
                raise Failure(f"{describe_record(slow)} has these numbers but took the server "
                              f"{slow.duration_s:.2f}s, more than the {run.seconds}s chat.py says",
                              "paste the lines of one run, unedited")
            raise Failure(f"no request of {ledger.name} matches {run.usage_line} {run.server_line}: {whose(others)}",
                          "run python chat.py yourself, with your key, and paste its output unedited")
        matched.append(describe_record(record))
    return "matches " + ", ".join(matched)


@lab.check(needs="ledger")
def stream_in_ledger(ctx: Context) -> str:
    """chat.py --stream's line is one of your streamed requests: same chunk count, and the server's
    first chunk and end come no later than the client's TTFT and total."""
    ledger = author_ledger(ctx.ledger)
    runs = outputs(ctx).stream
    if not runs:
        raise Skip("chat.py --stream's line is missing (see outputs_present)")

    def same(run: StreamRun, r: Record) -> bool:
        return _chat_ok(r, stream=True) and r.chunks == run.chunks \
            and (r.ttft_s or 0) <= run.ttft + 0.005 and r.duration_s <= run.total + 0.05

    return ledger.match_each(runs, same, lambda run: f"streamed request of {ledger.name} matches {run.line}",
                             "run python chat.py --stream yourself, with your key, and paste its output unedited")


@lab.check(needs="ledger")
def chat_mjs_in_ledger(ctx: Context) -> str:
    """chat.mjs's [N token, X t/s] lines are your requests: the same predicted_n and speed in their timings."""
    ledger = author_ledger(ctx.ledger)
    lines = outputs(ctx).tokens
    if not lines:
        raise Skip("chat.mjs's line is missing (see outputs_present)")

    def same(line: TokensLine, r: Record) -> bool:
        return r.route in CHAT_ROUTES and r.status == 200 and timing(r, "predicted_n") == line.tokens \
            and printed_alike(timing(r, "predicted_per_second"), line.tps)

    return ledger.match_each(lines, same, lambda line: f"request of {ledger.name} matches {line.line}",
                             "run node chat.mjs (with the Authorization header and your key) and paste its output")


@lab.check(needs="ledger", optional=True)
def error_401_in_ledger(ctx: Context) -> str:
    """the ledger holds the rejected request (401) behind your error line, from an address you used."""
    ledger = author_ledger(ctx.ledger)
    if outputs(ctx).error_line is None:
        raise Skip("the 401 line is missing (see outputs_present)")
    if all(r.auth == "open" for r in ledger.view.records):
        raise Unchecked("the class server takes any key: it never answered 401")
    rejected = ledger.rejected()
    if not rejected:
        raise Failure(f"no 401 answer to any address {ledger.name} used ({', '.join(sorted(ledger.addresses)) or '-'})",
                      "run python chat.py against the class server without your key, and paste the error line")
    return f"matches {describe_record(rejected[0])} from {rejected[0].addr}"


# ---------------------------------------------------------------------------------------------
# Against a running server (--server): the grader's own requests, with the tolerances stated

def _server_prompt_count(ctx: Context) -> int:
    assert ctx.server is not None
    return ctx.server.count_prompt_tokens(CHAT_PY_MESSAGES, CHAT_TEMPLATE_KWARGS)


def _same_model(ctx: Context, run: UsageRun) -> None:
    counted = _server_prompt_count(ctx)
    if run.prompt != counted:
        raise Unchecked(f"you report prompt={run.prompt} tok where this server's model counts {counted} for "
                        "chat.py's messages: the outputs come from another model (or an edited chat.py), "
                        "so this server cannot judge them")


@lab.check(needs="server")
def prompt_tokens_match_server(ctx: Context) -> str:
    """the prompt token count you report is what the server counts for chat.py's messages."""
    for run in _full_runs(ctx):
        _same_model(ctx, run)
    return f"prompt={_server_prompt_count(ctx)} tok, as this server counts chat.py's messages"


@lab.check(needs="server")
def speeds_plausible(ctx: Context) -> str:
    """the speeds you report are plausible for this server (a tolerance, not a proof: see the note)."""
    assert ctx.server is not None
    run = _full_runs(ctx)[0]
    _same_model(ctx, run)
    measured = ctx.server.speeds
    pairs = [("generazione", run.generation_tps, measured.predicted_per_second, GENERATION_SPEED_FACTOR)]
    pairs += [("chat.mjs", t.tps, measured.predicted_per_second, GENERATION_SPEED_FACTOR) for t in outputs(ctx).tokens]
    if run.cache_n == 0:  # with a cached prompt the prompt speed is over a token or two: not comparable
        pairs.append(("prompt", run.prompt_tps, measured.prompt_per_second, PROMPT_SPEED_FACTOR))
    for label, reported, server, factor in pairs:
        if ratio_off(reported, server) > factor:
            raise Failure(f"{label} {reported} t/s is more than {factor:g}x away from the "
                          f"{server:.1f} t/s this server just measured",
                          "paste the numbers of a real run against this server (a run on another machine "
                          "cannot be judged by this check)")
    return (f"tolerance: generation within {GENERATION_SPEED_FACTOR:g}x and prompt within {PROMPT_SPEED_FACTOR:g}x "
            f"of this server's {measured.predicted_per_second:.1f} and {measured.prompt_per_second:.1f} t/s, "
            "measured once by the grader")


@lab.check(needs="server", optional=True)
def error_401_matches_server(ctx: Context) -> None:
    """the 401 line carries exactly the error body this server sends for a wrong key."""
    assert ctx.server is not None
    body = ctx.server.unauthorized_body
    if body is None:
        raise Skip("the server accepts any key: start it with --api-key to check the 401 line")
    line = outputs(ctx).error_line
    parsed = None if line is None else parse_error_payload(line)
    if parsed is None or parsed[0] != 401 or not error_matches(parsed[1], body):
        raise Failure(f"this server answers a wrong key with {body}, your line says: {line or '-'}",
                      "paste the error line python chat.py prints against this server without the key")
