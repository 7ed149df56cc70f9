"""Lab 04-02's two lines a request (the usage line and the `[server: ...]` line), which the later labs'
scripts print too: how they are read, how their numbers must agree, and which ledger record they are.

    [finish_reason=stop prompt=31 tok, completion=80 tok, 1.9s]
    [server: cache_n=0 prompt 210.4 t/s, generazione 45.2 t/s]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Self

from kinetic.grading.ledger_view import Record, printed_alike, timing

NUM = r"(\d+(?:\.\d+)?)"
USAGE_RE = re.compile(rf"\[finish_reason=(\w+) prompt=(\d+) tok, completion=(\d+) tok, {NUM}s\]")
SERVER_RE = re.compile(rf"\[server: cache_n=(\d+) prompt {NUM} t/s, (?:generazione|generation) {NUM} t/s\]")
CHAT_ROUTES = ("/v1/chat/completions", "/chat/completions")
# The wall time a script prints may exceed what the server's speeds account for by HTTP and client
# overhead: allowed up to this factor plus a fixed margin.
WALL_FACTOR = 3.0
WALL_MARGIN_S = 2.0


@dataclass(frozen=True)
class UsageRun:
    """One request as a script printed it: its usage line and the server line after it."""

    finish_reason: str
    prompt: int
    completion: int
    seconds: float
    cache_n: int
    prompt_tps: float
    generation_tps: float
    usage_line: str
    server_line: str

    @classmethod
    def read(cls, usage: re.Match[str], server: re.Match[str], **more: Any) -> Self:
        """From a USAGE_RE match and the SERVER_RE match of the line after it (`more`: a subclass's fields)."""
        return cls(usage[1], int(usage[2]), int(usage[3]), float(usage[4]), int(server[1]), float(server[2]),
                   float(server[3]), usage[0], server[0], **more)


def server_seconds(run: UsageRun, slack: float) -> float:
    """Seconds the server's own speeds imply, with each speed moved by `slack` (rounding). The fastest
    reading (slack > 0) leaves the first token out: the server's generation speed may be counted over
    the tokens after it, which weighs on answers of a few tokens."""
    prompt_tokens = max(run.prompt - run.cache_n, 0)
    prompt_s = prompt_tokens / max(run.prompt_tps + slack, 1e-3) if prompt_tokens else 0.0
    generated = max(run.completion - 1, 0) if slack > 0 else run.completion
    return prompt_s + generated / max(run.generation_tps + slack, 1e-3)


def numbers_problem(run: UsageRun, max_tokens: int) -> tuple[str, str] | None:
    """Why a run's numbers cannot all be true of one request, as (what is wrong, what to do), or None.

    cache_n within the prompt, the answer within the script's max_tokens, and the time the server's
    speeds imply (speeds printed to 0.1, so moved by 0.05 either way) within the script's own clock."""
    if run.cache_n > run.prompt:
        return (f"cache_n={run.cache_n} is larger than prompt={run.prompt}",
                "the server can reuse at most the prompt's own tokens: paste the numbers of one run")
    if not 1 <= run.completion <= max_tokens or run.generation_tps <= 0:
        return (f"completion={run.completion} tok at {run.generation_tps} t/s: the script asks for 1 to "
                f"{max_tokens} tokens", "paste the lines of a run that generated text")
    fastest = server_seconds(run, slack=0.05)
    if fastest > run.seconds + 0.1:
        return (f"at the speeds you report the server needs at least {fastest:.1f}s, "
                f"but the whole request took {run.seconds}s",
                "copy the usage and server lines of the same run, without editing the numbers")
    slowest = server_seconds(run, slack=-0.05)
    if run.seconds > WALL_FACTOR * slowest + WALL_MARGIN_S:
        return (f"the request took {run.seconds}s but the server's speeds account for only {slowest:.1f}s",
                "copy the usage and server lines of the same run, without editing the numbers")
    return None


def served_as_printed(record: Record, run: UsageRun) -> bool:
    """The ledger record is a chat request that got these very numbers (speeds as the script rounds them)."""
    return (record.route in CHAT_ROUTES and record.status == 200
            and record.prompt_tokens == run.prompt and record.completion_tokens == run.completion
            and record.finish_reason == run.finish_reason and timing(record, "cache_n") == run.cache_n
            and printed_alike(timing(record, "prompt_per_second"), run.prompt_tps)
            and printed_alike(timing(record, "predicted_per_second"), run.generation_tps))


def within_clock(record: Record, run: UsageRun) -> bool:
    """The server took no longer than the script's own clock says (printed to 0.1 s)."""
    return record.duration_s <= run.seconds + 0.05
