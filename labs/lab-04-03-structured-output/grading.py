"""Lab 04-03 (structured output and tool calls): what `kinetic grade lab-04-03` checks, and for how many points.

The outputs are found by their shape anywhere in the file (the lines structured.py and tools.py
print, the JSON /completion answers), whatever headings, labels or fences surround them; only the
answer to the question is found by its heading or label. Each request the scripts send prints
`[id=...]`, then lab 04-02's usage and `[server: ...]` lines: a run. What comes right before a run
says which step it was: `[valido: ...]` (the schema), `[json: ...]` (json_object), `[tool_call ...]`
lines (a call), and after it `[risultato inviato con tool_call_id=...]` (the round trip) or
`[tool_calls: N]` (auto).

Three levels of evidence, each stated in the report:
- the file alone: every output is there, the constrained answers satisfy the lab's schema, tool
  parameters and grammar, the tool result goes back with the call's own id, the numbers agree;
- `--ledger` (the class server's request ledger, with `--ledger-content` for the text): every run is
  a request of this student, number for number; the answer satisfies the schema the student sent;
  the tool result request carries the id of the call the server made.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kinetic.grading import Context, Failure, Fingerprint, Lab, Skip, Unchecked
from kinetic.grading.deliverable import Deliverable
from kinetic.grading.ledger_view import (
    Record,
    StudentLedger,
    author_ledger,
    describe_record,
    whose,
)
from kinetic.grading.schema import UnsupportedSchema, schema_errors
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

lab = Lab("lab-04-03", "Structured output and tool calls", deliverable_min_outputs=2, copy_weight=3, copy_points=1)

# structured.py's Citta as openai's parse sends it (strict: every field required, no others);
# tests/unit/test_grading_lab_04_03.py keeps it equal to the script's pydantic model.
CITTA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "nome": {"type": "string", "maxLength": 24},
        "regione": {"type": "string", "maxLength": 24},
        "abitanti_milioni": {"type": "integer", "minimum": 0, "maximum": 20},
        "sul_mare": {"type": "boolean"},
    },
    "required": ["nome", "regione", "abitanti_milioni", "sul_mare"],
    "additionalProperties": False,
}
# tools.py's one tool.
TOOL_NAME = "meteo"
TOOL_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {"citta": {"type": "string", "maxLength": 24}},
                                   "required": ["citta"], "additionalProperties": False}
# grammar.json's GBNF written as the regular expression it is.
GRAMMAR_ANSWER = re.compile(r"(lunedì|martedì|mercoledì|giovedì|venerdì|sabato|domenica) alle "
                            r"([01][0-9]|2[0-3]):[0-5][0-9]")
MAX_TOKENS = 120  # the most any of the scripts asks for (structured.py; tools.py asks for 60)
COMPLETION_ROUTES = ("/completion", "/completions")

ID_RE = re.compile(r"\[id=(\S+?)\]")
VALID_RE = re.compile(r"\[(?:valido|valid): (.*)\][`\s]*$")
JSON_RE = re.compile(r"\[json(?:: (\w+)| non valido| not valid)")
CALL_RE = re.compile(r"\[tool_call id=(\S+) (?:nome|name)=(\S+?)(?: (?:argomenti|arguments)=(.*))?\][`\s]*$")
RESULT_RE = re.compile(r"\[(?:risultato inviato con|result sent with) tool_call_id=(\S+?): (.*)\][`\s]*$")
COUNT_RE = re.compile(r"\[tool_calls: (\d+)\]")
STREAM_RE = re.compile(rf"\[(\d+) chunks?, (?:primo token dopo|first token after) {NUM}s, (?:totale|total) {NUM}s, "
                       r"finish_reason=(\w+)\]")
ERROR_RE = re.compile(r"\[(?:errore|error) (\d+) param=(\S*): (.*)\][`\s]*$")
ANSWER_HEADING = re.compile(r"answer|risposta|question|domanda|perch|why", re.I)
OUTPUT_HEADING = re.compile(r"structured\.py|tools\.py|curl|grammar|grammatica|400|json_object|--", re.I)


@dataclass(frozen=True)
class Run(UsageRun):
    """One request: its id, usage line and server line, and the calls the script printed before them."""

    id: str = ""
    calls: list[tuple[str, str, str | None]] = field(default_factory=list)  # (id, name, arguments)


@dataclass
class Outputs:
    runs: list[Run]
    schema: list[tuple[Any, Run | None]]  # (the parsed answer or None, its run)
    json_object: list[tuple[Any, bool, Run | None]]  # (the answer, whether it parsed, its run)
    round_trips: list[tuple[Run, str, Run | None]]  # (the call's run, the id sent back, the answer's run)
    auto: list[tuple[Run, int]]
    stream_calls: list[dict[str, Any]]
    grammar: list[dict[str, Any]]
    errors: list[tuple[int, str, str]]
    answer: list[str] | None


def _json_tail(lines: list[str]) -> Any:
    """The JSON a script printed just above its marker line: the longest run of lines that parses."""
    cleaned = [line for line in lines if line.strip() not in ("```", "~~~")]
    for start in range(len(cleaned)):
        try:
            return json.loads("\n".join(cleaned[start:]))
        except ValueError:
            continue
    raise ValueError("no JSON")


def parse_outputs(deliverable: Deliverable) -> Outputs:
    lines = deliverable.lines
    out = Outputs([], [], [], [], [], [], [], [], None)
    buffer: list[str] = []  # lines since the last recognised one: an answer's text
    pending_calls: list[tuple[str, str, str | None]] = []
    pending_kind: tuple[str, Any] | None = None
    streaming: dict[str, Any] | None = None
    after_result: str | None = None
    index = 0
    while index < len(lines):
        line = lines[index]
        if (match := ID_RE.search(line)) and index + 2 < len(lines) \
                and (usage := USAGE_RE.search(lines[index + 1])) and (server := SERVER_RE.search(lines[index + 2])):
            run = Run.read(usage, server, id=match[1], calls=pending_calls)
            out.runs.append(run)
            pending_calls = []
            if pending_kind is not None:
                kind, value = pending_kind
                if kind == "schema":
                    out.schema.append((value, run))
                else:
                    out.json_object.append((value[0], value[1], run))
                pending_kind = None
            if after_result is not None and out.round_trips and out.round_trips[-1][2] is None:
                first, sent, _ = out.round_trips[-1]
                out.round_trips[-1] = (first, sent, run)
            after_result = None
            buffer = []
            index += 3
            continue
        index += 1
        if VALID_RE.search(line):
            try:
                value = _json_tail(buffer)
            except ValueError:
                value = None
            pending_kind = ("schema", value)
        elif (match := JSON_RE.search(line)) is not None:
            try:
                value, parsed = _json_tail(buffer), True
            except ValueError:
                value, parsed = "\n".join(buffer), False
            pending_kind = ("json_object", (value, parsed and match[1] is not None))
        elif (match := CALL_RE.search(line)) is not None:
            if match[3] is None:  # tools.py --stream: the arguments follow in pieces
                streaming = {"id": match[1], "name": match[2]}
            else:
                pending_calls.append((match[1], match[2], match[3]))
        elif (match := RESULT_RE.search(line)) is not None:
            if out.runs:
                out.round_trips.append((out.runs[-1], match[1], None))
                after_result = match[1]
        elif (match := COUNT_RE.search(line)) is not None:
            if out.runs:
                out.auto.append((out.runs[-1], int(match[1])))
        elif (match := STREAM_RE.search(line)) is not None:
            call = streaming or {"id": None, "name": None}
            out.stream_calls.append({**call, "arguments": "".join(b.strip() for b in buffer if b.strip() not in
                                                                ("```", "~~~")),
                                     "chunks": int(match[1]), "ttft": float(match[2]), "total": float(match[3]),
                                     "finish_reason": match[4]})
            streaming = None
        elif (match := ERROR_RE.search(line)) is not None:
            out.errors.append((int(match[1]), match[2], match[3]))
        else:
            buffer.append(line)
            continue
        buffer = []
    out.grammar = [obj for obj in deliverable.json_objects()
                   if isinstance(obj.get("content"), str) and isinstance(obj.get("timings"), dict)
                   and "tokens_predicted" in obj]
    answers = [s for s in deliverable.sections if ANSWER_HEADING.search(s.heading)
               and not OUTPUT_HEADING.search(s.heading)]
    out.answer = answers[-1].prose if answers else None
    return out


def outputs(ctx: Context) -> Outputs:
    return ctx.parsed("outputs", lambda: parse_outputs(ctx.deliverable))


@lab.outputs_found
def count_outputs(deliverable: Deliverable) -> int:
    found = parse_outputs(deliverable)
    return sum(map(bool, (found.schema, found.json_object, found.round_trips, found.auto, found.grammar,
                          found.errors, found.answer)))


@lab.fingerprints
def fingerprints(ctx: Context) -> list[Fingerprint]:
    found = outputs(ctx)
    prints = [Fingerprint(f"the id {run.id}", run.id, 3) for run in found.runs]
    prints += [Fingerprint(f"the tool call id {call[0]}", call[0], 3) for run in found.runs for call in run.calls]
    prints += [Fingerprint("the /completion timings", f"{g['timings'].get('predicted_ms')}", 3) for g in found.grammar]
    return prints


def _call_problem(name: str, arguments: str | None) -> str | None:
    """Why a call is not a valid call of tools.py's tool, or None."""
    if name != TOOL_NAME:
        return f"the call is to {name!r}, but tools.py forces {TOOL_NAME!r}"
    try:
        args = json.loads(arguments or "")
    except ValueError:
        return f"its arguments {arguments!r} are not JSON"
    errors = schema_errors(args, TOOL_PARAMETERS)
    return f"its arguments break the tool's parameters: {'; '.join(errors)}" if errors else None


# ---------------------------------------------------------------------------------------------
# The file alone

@lab.check(points=2)
def outputs_present(ctx: Context) -> None:
    """lab-04-03.md holds every output: structured.py (schema, --json-object, --invalid), tools.py
    (the round trip and --auto), the /completion answer with the grammar, and the answer."""
    found = outputs(ctx)
    missing = []
    if not found.schema:
        missing.append("structured.py's answer with its [valido: ...] line and the [id=...] lines after it")
    if not found.json_object:
        missing.append("structured.py --json-object's answer with its [json: ...] line and the [id=...] lines")
    if not found.round_trips:
        missing.append("tools.py's [tool_call ...], [id=...] and [risultato inviato con tool_call_id=...] lines")
    if not found.auto:
        missing.append("tools.py --auto's [id=...] lines and its [tool_calls: N] line")
    if not found.grammar:
        missing.append("the JSON curl printed for grammar.json (with content, tokens_predicted and timings)")
    if not found.errors:
        missing.append("structured.py --invalid's [errore 400 ...] line")
    if not found.answer:
        missing.append("the answer (under a heading or label such as 'Answer' or 'Risposta')")
    if missing:
        raise Failure("missing: " + "; ".join(missing),
                      "paste each whole output as the script printed it; start from the lab-04-03.md template")


@lab.check(points=2)
def schema_answer_valid(ctx: Context) -> str:
    """structured.py's answer is JSON that satisfies the Citta schema (every field, within its bounds,
    nothing else), and the request ended by itself (finish_reason=stop)."""
    answers = outputs(ctx).schema
    if not answers:
        raise Skip("structured.py's output is missing (see outputs_present)")
    for value, run in answers:
        if value is None:
            raise Failure("the text above [valido: ...] is not JSON",
                          "paste the answer line of python structured.py as it printed it")
        errors = schema_errors(value, CITTA_SCHEMA)
        if errors:
            raise Failure(f"the answer breaks the Citta schema: {'; '.join(errors)}",
                          "the server holds the answer to the schema: paste the output of one run, unedited")
        if run is not None and run.finish_reason != "stop":
            raise Failure(f"finish_reason={run.finish_reason}: an answer held to the schema ends by itself",
                          "paste the usage line of the same run")
    return f"{len(answers)} answer(s) satisfy Citta"


@lab.check()
def json_object_answer(ctx: Context) -> None:
    """structured.py --json-object's answer is JSON whenever it ended by itself (finish_reason=stop)."""
    answers = outputs(ctx).json_object
    if not answers:
        raise Skip("structured.py --json-object's output is missing (see outputs_present)")
    for value, parsed, run in answers:
        if run is not None and run.finish_reason == "stop" and not parsed:
            raise Failure(f"the answer {str(value)[:80]!r} is not JSON, yet the request ended with stop",
                          "json_object holds the answer to JSON syntax: paste the output of one run, unedited")


@lab.check()
def runs_agree(ctx: Context) -> None:
    """each request's numbers agree with each other: cache_n within the prompt, the token count within
    max_tokens, and the time the server's speeds imply within the time the script measured."""
    runs = outputs(ctx).runs
    if not runs:
        raise Skip("no [id=...] run is pasted (see outputs_present)")
    for run in runs:
        problem = numbers_problem(run, MAX_TOKENS)
        if problem:
            raise Failure(f"{run.id}: {problem[0]}", problem[1])


@lab.check(points=2)
def tool_round_trip(ctx: Context) -> str:
    """tools.py's forced request got one call to meteo with arguments that fit its parameters and
    finish_reason=tool_calls, and the result went back with that call's own id."""
    trips = outputs(ctx).round_trips
    if not trips:
        raise Skip("tools.py's output is missing (see outputs_present)")
    for run, sent, answer in trips:
        if len(run.calls) != 1:
            raise Failure(f"{run.id} shows {len(run.calls)} [tool_call ...] lines: tools.py forces exactly one",
                          "paste the whole output of python tools.py")
        call_id, name, arguments = run.calls[0]
        problem = _call_problem(name, arguments)
        if problem:
            raise Failure(f"{run.id}: {problem}", "the grammar holds a forced call to its tool: paste it unedited")
        if run.finish_reason != "tool_calls":
            raise Failure(f"{run.id} ended with finish_reason={run.finish_reason}, not tool_calls",
                          "paste the usage line of the request that made the call")
        if sent != call_id:
            raise Failure(f"the result went back with tool_call_id={sent}, but the call's id is {call_id}",
                          "send the result with the id of the call the server made (call.id)")
        if answer is None:
            raise Failure("the request that sends the result back is missing its [id=...] lines",
                          "paste the whole output of python tools.py")
    return f"call {trips[0][0].calls[0][0]} answered with its own id"


@lab.check()
def auto_finish_reason(ctx: Context) -> None:
    """tools.py --auto's finish_reason says what the model did: tool_calls when it called a tool,
    stop or length when it wrote text."""
    autos = outputs(ctx).auto
    if not autos:
        raise Skip("tools.py --auto's output is missing (see outputs_present)")
    for run, count in autos:
        if count != len(run.calls):
            raise Failure(f"[tool_calls: {count}] but {len(run.calls)} [tool_call ...] lines above {run.id}",
                          "paste the whole output of python tools.py --auto")
        expected = ("tool_calls",) if count else ("stop", "length")
        if run.finish_reason not in expected:
            raise Failure(f"{run.id}: {count} call(s) with finish_reason={run.finish_reason}",
                          "paste the usage line of the same run")


@lab.check(points=2)
def grammar_answer(ctx: Context) -> str:
    """the /completion answer is what grammar.json's GBNF allows (a day, " alle ", a time), and its
    token counts agree with its timings."""
    answers = outputs(ctx).grammar
    if not answers:
        raise Skip("the /completion output is missing (see outputs_present)")
    for obj in answers:
        content, timings = obj["content"], obj["timings"]
        if not GRAMMAR_ANSWER.fullmatch(content.strip()):
            raise Failure(f"content {content!r} is not what the grammar allows (e.g. 'martedì alle 09:30')",
                          "send grammar.json as it is and paste the JSON curl printed")
        if obj.get("tokens_predicted") != timings.get("predicted_n"):
            raise Failure(f"tokens_predicted={obj.get('tokens_predicted')} but timings.predicted_n="
                          f"{timings.get('predicted_n')}", "paste the JSON of one request, unedited")
        n, ms, tps = timings.get("predicted_n"), timings.get("predicted_ms"), timings.get("predicted_per_second")
        # the server counts the first token in the generation time or not: both are its count over its time
        if not all(isinstance(v, (int, float)) for v in (n, ms, tps)) or ms <= 0 \
                or min(abs(k / ms * 1000 - tps) for k in (n - 1, n)) > 0.01 * tps:
            raise Failure(f"predicted_per_second={tps} is not predicted_n={n} over predicted_ms={ms}",
                          "paste the JSON of one request, unedited")
    return ", ".join(repr(obj["content"].strip()) for obj in answers)


@lab.check()
def error_400_line(ctx: Context) -> None:
    """structured.py --invalid got a 400 that names the schema field it refused."""
    errors = outputs(ctx).errors
    if not errors:
        raise Failure("no [errore 400 param=...: ...] line", "paste what python structured.py --invalid printed")
    status, param, message = errors[0]
    if status != 400 or "response_format" not in param + message:
        raise Failure(f"[errore {status} param={param}] does not name response_format",
                      "paste the line structured.py --invalid printed against kinetic serve")


@lab.check(optional=True)
def stream_tool_call(ctx: Context) -> None:
    """(variant) tools.py --stream's arguments, joined, are a valid call of meteo, and the stream ended
    with finish_reason=tool_calls."""
    calls = outputs(ctx).stream_calls
    if not calls:
        raise Skip("the streamed variant is not pasted (optional)")
    for call in calls:
        problem = _call_problem(call["name"] or "", call["arguments"])
        if problem or call["finish_reason"] != "tool_calls" or call["ttft"] > call["total"] + 0.05:
            raise Failure(problem or f"finish_reason={call['finish_reason']}, first piece after {call['ttft']}s "
                          f"of {call['total']}s", "paste the whole output of python tools.py --stream")


@lab.check()
def answer_explains(ctx: Context) -> None:
    """your answer speaks of tool_calls (the finish_reason) and of the grammar or schema that holds the
    model to the form."""
    answer = outputs(ctx).answer
    if not answer:
        raise Skip("no answer section (see outputs_present)")
    text = "\n".join(answer)
    missing = [term for term, pattern in (("tool_calls", r"tool_calls"),
                                          ("the grammar or the schema", r"gramma|schema|gbnf"))
               if not re.search(pattern, text, re.I)]
    if missing:
        raise Failure(f"the answer does not mention {' or '.join(missing)}",
                      "say what finish_reason each tools.py run got, and what made the base model answer in form")


# ---------------------------------------------------------------------------------------------
# Against the class server's ledger

def _record_of(ledger: StudentLedger, run: Run) -> Record:
    """The student's request behind a run: same id, same numbers, no longer than the script's clock."""
    def same(r: Record) -> bool:
        return r.id == run.id and served_as_printed(r, run) and within_clock(r, run)
    record = next((r for r in ledger.mine if same(r)), None)
    if record is None:
        others = [r for r in ledger.view.records if r.client != ledger.name and same(r)]
        raise Failure(f"no request of {ledger.name} matches [id={run.id}] {run.usage_line}: {whose(others)}",
                      "run the scripts yourself, with your key, and paste their output unedited")
    return record


def _content(record: Record) -> tuple[Any, Any]:
    """(the request body, the answer text) the ledger kept with --ledger-content."""
    if record.request is None or record.answer is None:
        raise Unchecked("the class server was started without --ledger-content: the ledger has the numbers "
                        "but not the request and answer text this check compares")
    return record.request, record.answer


@lab.check(points=2, needs="ledger")
def runs_in_ledger(ctx: Context) -> str:
    """every pasted run ([id=...] and its two lines) is one of your requests, number for number, and it
    took the server no longer than the script's own clock says."""
    ledger = author_ledger(ctx.ledger)
    runs = outputs(ctx).runs
    if not runs:
        raise Skip("no [id=...] run is pasted (see outputs_present)")
    return "matches " + ", ".join(describe_record(_record_of(ledger, run)) for run in runs)


@lab.check(points=2, needs="ledger")
def schema_answer_in_ledger(ctx: Context) -> str:
    """structured.py's answer is the server's answer to your request, and it satisfies the schema that
    request sent."""
    ledger = author_ledger(ctx.ledger)
    answers = [(value, run) for value, run in outputs(ctx).schema if run is not None]
    if not answers:
        raise Skip("structured.py's output is missing (see outputs_present)")
    for value, run in answers:
        request, answer = _content(_record_of(ledger, run))
        try:
            served = json.loads(answer)
        except ValueError:
            raise Failure(f"the server's answer to {run.id} is not JSON: {answer[:80]!r}",
                          "paste the output of a run of structured.py (without --json-object)") from None
        if served != value:
            raise Failure(f"the answer pasted above [valido: ...] is not the server's answer to {run.id}",
                          "paste the answer as the script printed it")
        fmt = request.get("response_format") if isinstance(request, dict) else None
        spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise Failure(f"{run.id} sent no response_format json_schema",
                          "run python structured.py, which sends Citta's schema")
        try:
            errors = schema_errors(served, schema)
        except UnsupportedSchema as exc:
            raise Unchecked(f"the schema {run.id} sent cannot be checked here: {exc}") from None
        if errors:
            raise Failure(f"the answer breaks the schema {run.id} sent: {'; '.join(errors)}",
                          "this should not happen with kinetic serve: tell the instructor")
    return f"{answers[0][1].id}'s answer satisfies the schema it sent"


@lab.check(points=2, needs="ledger")
def tool_call_in_ledger(ctx: Context) -> str:
    """the tool result request carries the id of the call the server made in your forced request."""
    ledger = author_ledger(ctx.ledger)
    trips = [(run, sent, answer) for run, sent, answer in outputs(ctx).round_trips if answer is not None]
    if not trips:
        raise Skip("tools.py's output is missing (see outputs_present)")
    notes = []
    for run, sent, answer in trips:
        record = _record_of(ledger, run)
        if record.tool_calls is None and record.finish_reason == "tool_calls":
            raise Unchecked("this ledger does not record tool calls (a kinetic before lab 04-03)")
        made = [call.id for call in record.tool_calls or []]
        if sent not in made:
            raise Failure(f"the server's call in {run.id} has id {', '.join(map(str, made)) or 'none'}, "
                          f"not {sent}", "send the result back with the id of the call the server made")
        request, _ = _content(_record_of(ledger, answer))
        messages = request.get("messages") if isinstance(request, dict) else None
        returned = [m.get("tool_call_id") for m in messages or [] if isinstance(m, dict) and m.get("role") == "tool"]
        if sent not in returned:
            raise Failure(f"{answer.id} sent tool results for {returned or 'no call'}, not for {sent}",
                          "append {'role': 'tool', 'tool_call_id': call.id, ...} to the messages")
        notes.append(f"{run.id} made call {sent}; {answer.id} sent its result back")
    return "; ".join(notes)


@lab.check(needs="ledger")
def grammar_in_ledger(ctx: Context) -> str:
    """the /completion answer is one of your requests, with the same timings to the last digit."""
    ledger = author_ledger(ctx.ledger)
    answers = outputs(ctx).grammar
    if not answers:
        raise Skip("the /completion output is missing (see outputs_present)")
    return ledger.match_each(
        answers, lambda obj, r: r.route in COMPLETION_ROUTES and r.status == 200
        and r.timings == obj["timings"], lambda obj: f"/completion request of {ledger.name} has these timings",
        "send grammar.json to the class server with your key and paste what curl printed")


@lab.check(needs="ledger")
def error_400_in_ledger(ctx: Context) -> str:
    """the ledger holds your request that got the 400, with the same message."""
    ledger = author_ledger(ctx.ledger)
    errors = outputs(ctx).errors
    if not errors:
        raise Skip("the 400 line is missing (see error_400_line)")
    _, _, message = errors[0]
    record, others = ledger.find(lambda r: r.status == 400 and r.route in CHAT_ROUTES
                                 and r.error is not None and r.error.message == message)
    if record is None:
        raise Failure(f"no request of {ledger.name} got a 400 with this message: {whose(others)}",
                      "run python structured.py --invalid against the class server with your key")
    return f"matches {describe_record(record)}"
