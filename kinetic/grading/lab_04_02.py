"""Lab 04-02 (OpenAI-compatible clients): parsers for the lab's output lines and the checks.

Italian labels are the lab's; English equivalents are accepted (`generation`, `first token after`,
`total`, `[end]`). Numbers are printed rounded, so every comparison allows for that rounding.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from kinetic.grading.checks import Checklist, Failure, Skip
from kinetic.grading.deliverable import Deliverable, Section
from kinetic.grading.live import LiveServer

LAB = "lab-04-02"
# chat.py's messages and extra body: the live check counts their tokens through the server's template.
# tests/e2e/test_lab_04_02.py keeps them equal to labs/lab-04-02-client-openai/chat.py.
CHAT_PY_MESSAGES = [
    {"role": "system", "content": "Rispondi in italiano, in modo breve."},
    {"role": "user", "content": "Che cos'è llama.cpp?"},
]
CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}
# Reported speeds must lie within these factors (either way) of the grader's own measurement: the
# same server varies with load, and a made-up number is usually off by far more. Prompt speed gets
# more room: over a ~30-token prompt it is dominated by fixed per-batch costs, and a fresh server's
# first request (the student's first run) is several times slower than the next ones.
GENERATION_SPEED_FACTOR = 4.0
PROMPT_SPEED_FACTOR = 10.0
# The wall time chat.py prints may exceed what the server's speeds account for by HTTP and client
# overhead: allowed up to this factor plus a fixed margin.
WALL_FACTOR = 3.0
WALL_MARGIN_S = 2.0

# Which section is which: the first heading that matches, in this order (stream before full).
SECTIONS = {
    "chat_py_stream": ("chat.py --stream", re.compile(r"chat\.py.*stream", re.I)),
    "chat_py": ("chat.py", re.compile(r"chat\.py", re.I)),
    "chat_mjs": ("chat.mjs", re.compile(r"chat\.mjs|node", re.I)),
    "error_401": ("401 error", re.compile(r"401|errore|error", re.I)),
    "answer": ("answer", re.compile(r"answer|risposta|question|domanda|openai api", re.I)),
}

NUM = r"(\d+(?:\.\d+)?)"
USAGE_RE = re.compile(rf"\[finish_reason=(\w+) prompt=(\d+) tok, completion=(\d+) tok, {NUM}s\]")
SERVER_RE = re.compile(rf"\[server: cache_n=(\d+) prompt {NUM} t/s, (?:generazione|generation) {NUM} t/s\]")
STREAM_RE = re.compile(rf"\[(\d+) chunks?, (?:primo token dopo|first token after) {NUM}s, (?:totale|total) {NUM}s\]")
TOKENS_RE = re.compile(rf"\[(\d+) tokens?, {NUM} t/s\]")
END_RE = re.compile(r"^\s*\[(?:fine|end)\]\s*$")
ERROR_RE = re.compile(r"(?:openai\.)?AuthenticationError: Error code: (\d+) - (.*)$")
EXPECTED_401 = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
ANSWER_TERMS = {
    "base_url": re.compile(r"base[_ ]?url", re.I),
    "api_key": re.compile(r"api[_ ]?key", re.I),
    "model": re.compile(r"\bmodel", re.I),
}


@dataclass(frozen=True)
class FullRun:
    finish_reason: str
    prompt: int
    completion: int
    seconds: float
    cache_n: int
    prompt_tps: float
    generation_tps: float


@dataclass(frozen=True)
class StreamRun:
    chunks: int
    ttft: float
    total: float


@dataclass
class Submission:
    deliverable: Deliverable
    server: LiveServer | None = None
    sections: dict[str, Section] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sections = find_sections(self.deliverable)

    def section(self, key: str) -> Section:
        if key not in self.sections:
            raise Skip(f"the {SECTIONS[key][0]} section is missing")
        return self.sections[key]


def find_sections(deliverable: Deliverable) -> dict[str, Section]:
    found: dict[str, Section] = {}
    for section in deliverable.sections:
        for key, (_, pattern) in SECTIONS.items():
            if key not in found and pattern.search(section.heading):
                found[key] = section
                break
    return found


def _search(pattern: re.Pattern[str], lines: list[str]) -> re.Match[str] | None:
    return next((m for m in map(pattern.search, lines) if m), None)


def parse_full_run(lines: list[str]) -> FullRun | None:
    usage, server = _search(USAGE_RE, lines), _search(SERVER_RE, lines)
    if usage is None or server is None:
        return None
    return FullRun(usage[1], int(usage[2]), int(usage[3]), float(usage[4]),
                   int(server[1]), float(server[2]), float(server[3]))


def parse_stream_run(lines: list[str]) -> StreamRun | None:
    match = _search(STREAM_RE, lines)
    return None if match is None else StreamRun(int(match[1]), float(match[2]), float(match[3]))


def parse_error_payload(line: str) -> tuple[int, Any] | None:
    """`Error code: 401 - {...}` → (401, the dict), or (401, "message") for newer SDKs."""
    match = ERROR_RE.search(line)
    if match is None:
        return None
    payload = match[2].strip()
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


def server_seconds(run: FullRun, slack: float) -> float:
    """Seconds the server's own speeds imply, with each speed moved by `slack` (rounding)."""
    prompt_tokens = max(run.prompt - run.cache_n, 0)
    prompt_s = prompt_tokens / max(run.prompt_tps + slack, 1e-3) if prompt_tokens else 0.0
    return prompt_s + run.completion / max(run.generation_tps + slack, 1e-3)


def ratio_off(reported: float, measured: float) -> float:
    if reported <= 0 or measured <= 0:
        return float("inf")
    return max(reported / measured, measured / reported)


def _full_run(sub: Submission) -> FullRun:
    run = parse_full_run(sub.section("chat_py").output_lines())
    if run is None:
        raise Skip("chat.py's output lines are not complete (see chat_py_full_lines)")
    return run


def _error_line(sub: Submission) -> str | None:
    return next((l for l in sub.section("error_401").output_lines() if "Error code" in l or "Error:" in l), None)


checks: Checklist[Submission] = Checklist(LAB)


@checks.check()
def sections_present(sub: Submission) -> None:
    """lab-04-02.md has all five sections: chat.py, chat.py --stream, chat.mjs, the 401 error and the answer."""
    missing = [title for key, (title, _) in SECTIONS.items() if key not in sub.sections]
    empty = [SECTIONS[k][0] for k, s in sub.sections.items() if not s.output_lines()]
    if missing:
        raise Failure(f"missing section(s): {', '.join(missing)}",
                      "keep the headings of the lab-04-02.md template and paste each output under its heading")
    if empty:
        raise Failure(f"empty section(s): {', '.join(empty)}", "paste the output (or write the answer) under each heading")


@checks.check()
def chat_py_full_lines(sub: Submission) -> None:
    """chat.py's full output has the usage line and the [server: ...] timings line."""
    lines = sub.section("chat_py").output_lines()
    if _search(USAGE_RE, lines) is None:
        raise Failure("no line like [finish_reason=stop prompt=41 tok, completion=39 tok, 12.7s]",
                      "paste the whole output of python chat.py, usage line included")
    if _search(SERVER_RE, lines) is None:
        raise Failure("no line like [server: cache_n=0 prompt 12.4 t/s, generazione 4.2 t/s]",
                      "the timings come from r.model_extra['timings']: paste the line chat.py prints last")


@checks.check()
def chat_py_numbers_agree(sub: Submission) -> None:
    """the numbers in chat.py's full output agree with each other."""
    run = _full_run(sub)
    if run.cache_n > run.prompt:
        raise Failure(f"cache_n={run.cache_n} is larger than prompt={run.prompt}",
                      "the server can reuse at most the prompt's own tokens: paste the numbers of one run")
    if run.completion < 1 or run.generation_tps <= 0:
        raise Failure(f"completion={run.completion} tok at {run.generation_tps} t/s: nothing was generated",
                      "run python chat.py again and paste that run's output")
    fastest = server_seconds(run, slack=0.05)  # speeds rounded to 0.1: the real ones may be 0.05 higher
    if fastest > run.seconds + 0.1:
        raise Failure(f"at the speeds you report the server needs at least {fastest:.1f}s, "
                      f"but the whole request took {run.seconds}s",
                      "copy the usage and server lines of the same run, without editing the numbers")
    slowest = server_seconds(run, slack=-0.05)
    if run.seconds > WALL_FACTOR * slowest + WALL_MARGIN_S:
        raise Failure(f"the request took {run.seconds}s but the server's speeds account for only {slowest:.1f}s",
                      "copy the usage and server lines of the same run, without editing the numbers")


@checks.check()
def stream_ttft(sub: Submission) -> None:
    """chat.py --stream reports chunks, time to first token and total time, with TTFT below the total."""
    run = parse_stream_run(sub.section("chat_py_stream").output_lines())
    if run is None:
        raise Failure("no line like [39 chunk, primo token dopo 1.11s, totale 15.4s]",
                      "paste the whole output of python chat.py --stream")
    if run.chunks < 1:
        raise Failure("0 chunks: no text arrived", "run python chat.py --stream again against a running server")
    if run.ttft > run.total + 0.05:  # the total is rounded to 0.1s
        raise Failure(f"the first token after {run.ttft}s comes later than the total {run.total}s",
                      "TTFT is measured inside the same request: it must be smaller than the total")


@checks.check()
def chat_mjs_lines(sub: Submission) -> None:
    """chat.mjs's output has the [N token, X t/s] line and the [fine] that follows data: [DONE]."""
    lines = sub.section("chat_mjs").output_lines()
    match = _search(TOKENS_RE, lines)
    if match is None:
        raise Failure("no line like [80 token, 4.3 t/s]", "paste the output of node chat.mjs and node chat.mjs --stream")
    if int(match[1]) < 1 or float(match[2]) <= 0:
        raise Failure(f"{match[0]} reports no generation", "paste the numbers of a run that produced text")
    if not any(END_RE.match(line) for line in lines):
        raise Failure("no [fine] line", "node chat.mjs --stream prints [fine] when data: [DONE] arrives: paste that run")


@checks.check()
def error_401_line(sub: Submission) -> None:
    """the 401 line is the openai.AuthenticationError the SDK raises for a missing or wrong key."""
    line = _error_line(sub)
    parsed = None if line is None else parse_error_payload(line)
    if parsed is None:
        raise Failure("no line like openai.AuthenticationError: Error code: 401 - {...}",
                      "paste the last line of the traceback python chat.py prints when the server has --api-key")
    status, payload = parsed
    if status != 401 or not error_matches(payload, EXPECTED_401):
        raise Failure(f"this is not the error kinetic serve sends for a wrong key: {line.strip()}",
                      "the local server answers {'error': {'message': 'Invalid API Key', ...}}: "
                      "paste the line you got from it, not from another provider")


@checks.check()
def answer_names_lines(sub: Submission) -> None:
    """your answer names base_url, api_key and the model as the lines to change."""
    text = "\n".join(sub.section("answer").output_lines())
    missing = [term for term, pattern in ANSWER_TERMS.items() if not pattern.search(text)]
    if missing:
        raise Failure(f"the answer does not mention {', '.join(missing)}",
                      "moving to the real OpenAI API changes base_url (remove it), api_key (a real key) "
                      "and model (a real model name): name each one")


def _server(sub: Submission) -> LiveServer:
    if sub.server is None:
        raise Skip("no --server given")
    return sub.server


@checks.check(live=True)
def prompt_tokens_match_server(sub: Submission) -> None:
    """the prompt token count you report is what the server counts for chat.py's messages."""
    run = _full_run(sub)
    counted = _server(sub).count_prompt_tokens(CHAT_PY_MESSAGES, CHAT_TEMPLATE_KWARGS)
    if run.prompt != counted:
        raise Failure(f"you report prompt={run.prompt} tok, but this server counts {counted} tokens "
                      "for chat.py's messages through its chat template",
                      "run the lab's chat.py unchanged against this server and paste its output")


@checks.check(live=True)
def speeds_plausible(sub: Submission) -> None:
    """the speeds you report are plausible for this server."""
    run = _full_run(sub)
    measured = _server(sub).speeds
    pairs = [("generazione", run.generation_tps, measured.predicted_per_second, GENERATION_SPEED_FACTOR)]
    mjs = _search(TOKENS_RE, sub.sections["chat_mjs"].output_lines()) if "chat_mjs" in sub.sections else None
    if mjs is not None:
        pairs.append(("chat.mjs", float(mjs[2]), measured.predicted_per_second, GENERATION_SPEED_FACTOR))
    if run.cache_n == 0:  # with a cached prompt the prompt speed is over a token or two: not comparable
        pairs.append(("prompt", run.prompt_tps, measured.prompt_per_second, PROMPT_SPEED_FACTOR))
    for label, reported, server, factor in pairs:
        if ratio_off(reported, server) > factor:
            raise Failure(f"{label} {reported} t/s is more than {factor:g}x away from the "
                          f"{server:.1f} t/s this server just measured",
                          "paste the numbers of a real run against this server")


@checks.check(live=True)
def error_401_matches_server(sub: Submission) -> None:
    """the 401 line carries exactly the error body this server sends for a wrong key."""
    body = _server(sub).unauthorized_body
    if body is None:
        raise Skip("the server accepts any key: start it with --api-key to check the 401 line")
    line = _error_line(sub)
    parsed = None if line is None else parse_error_payload(line)
    if parsed is None or parsed[0] != 401 or not error_matches(parsed[1], body):
        raise Failure(f"this server answers a wrong key with {body}, your line says: {(line or '').strip()}",
                      "paste the error line python chat.py prints against this server without the key")


def grade(deliverable: Deliverable, server: LiveServer | None = None):
    return checks.run(Submission(deliverable, server), live=server is not None)
