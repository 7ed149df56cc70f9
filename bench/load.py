"""What the benchmarks share: starting kinetic or llama-server the same way, streaming a request
while timing it, simulated students, and the statistics printed at the end.

Only one server decodes at a time (llama.cpp's threads spin: two decoding at once on 2 cores fall
to ~1 token/s), so benchmarks alternate between servers, and hold the model lock while they run.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import shutil
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kinetic.server.launch import MODEL_LOCK_PATH, free_port, stop_process, wait_until_healthy  # noqa: F401  MODEL_LOCK_PATH: re-exported to the bench scripts

LAB_SYSTEM = ("Rispondi in italiano, in modo breve. Sei l'assistente del corso di serving locale di modelli "
              "linguistici: spieghi llama.cpp, llama-server, kinetic, i token, la cache KV, il time to first "
              "token e la velocità di generazione con esempi concreti e senza formule inutili. ") * 4
QUESTIONS = ["Che cos'è llama.cpp?", "A cosa serve la cache KV?", "Che cos'è il TTFT?", "Perché il prompt costa?",
             "Che cosa misura cache_n?", "Che differenza c'è tra stream e risposta intera?",
             "Che cosa fa --parallel?", "Perché serve una chiave API?"]


class Server:
    """A server process (kinetic or llama-server) with llama-server's flags, ready when /health is 200."""

    def __init__(self, name: str, command: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None):
        self.name = name
        self.port = free_port()
        self.command = [*command, "--host", "127.0.0.1", "--port", str(self.port)]
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env,
                                     cwd=self.cwd)
        failure = wait_until_healthy(self.proc, self.url, 180)
        if failure is not None:
            stop_process(self.proc)
            raise SystemExit(f"{self.name} {failure}: {' '.join(self.command)}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def slots(self) -> int | str:
        """How many requests the server runs at once (/props total_slots)."""
        try:
            return int(httpx.get(self.url + "/props", timeout=10).json()["total_slots"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return "?"

    def rss_mib(self) -> float:
        """Resident memory of the server process (Linux /proc; 0 elsewhere)."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():  # type: ignore[union-attr]
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0


def kinetic_server(model: str, flags: list[str]) -> Server:
    import sys

    return Server("kinetic", [sys.executable, "-m", "kinetic", "serve", "-m", model, *flags])


def kinetic_baseline(checkout: Path, model: str, flags: list[str]) -> Server:
    """kinetic as another checkout has it (a git worktree of an earlier commit), to measure a change before and after
    in one run: `python -m kinetic` started in that folder imports its code, with this environment's packages. Named
    after the checkout's commit."""
    import sys

    if not (checkout / "kinetic" / "__main__.py").is_file():
        raise SystemExit(f"--baseline {checkout}: not a kinetic checkout (no kinetic/__main__.py)")
    described = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True, check=False)
    commit = described.stdout.strip() or checkout.name
    return Server(f"kinetic@{commit}", [sys.executable, "-m", "kinetic", "serve", "-m", model, *flags], cwd=checkout)


def llama_server_default_flags() -> list[str]:
    """What starts llama-server at its own defaults wherever they run: it repacks weights by default, but on a
    CPU with AMX its repacked kernels crash on the bundled Gemma's first decode (FACTS.md), so there it loads
    without them, as kinetic does by default everywhere."""
    try:
        amx = "amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux
        amx = False
    return ["--no-repack"] if amx else []


def llama_server(binary: str | None, model: str, flags: list[str]) -> Server | None:
    path = binary or shutil.which("llama-server") or ("/tmp/lsbuild/bin/llama-server"
                                                      if Path("/tmp/lsbuild/bin/llama-server").exists() else None)
    return Server("llama-server", [path, "-m", model, *flags]) if path else None


@dataclass
class Timed:
    """One streamed request as the client saw it."""

    ok: bool
    error: str = ""
    ttft: float = math.nan  # seconds to the first text
    total: float = math.nan
    tokens: int = 0  # text chunks received (one per token on both servers)
    decode_tps: float = math.nan
    cache_n: int | None = None
    prompt_ms: float = math.nan  # the server's own prompt time (timings.prompt_ms): TTFT less it is the wait
    started: float = 0.0
    ended: float = 0.0


class _StreamReader:
    """Reads one streamed answer's SSE lines, on either client: the first text's time, chunks, cache_n."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.stamps: list[float] = []
        self.cache_n: int | None = None
        self.prompt_ms = math.nan
        self.stream_error = ""  # the message of the error event that ended the stream

    def failed(self, error: str) -> Timed:
        return Timed(ok=False, error=error, started=self.started, ended=time.perf_counter())

    def line(self, line: str) -> bool:
        """Takes one line; False when the line is an error event (the stream has failed)."""
        if not line.startswith("data: ") or line == "data: [DONE]":
            return True
        data = json.loads(line[6:])
        if "error" in data:
            error = data["error"]
            self.stream_error = str(error.get("message", error) if isinstance(error, dict) else error)[:120]
            return False
        if "timings" in data:
            self.cache_n = data["timings"].get("cache_n")
            self.prompt_ms = float(data["timings"].get("prompt_ms", math.nan))
        choices = data.get("choices") or [{}]
        text = choices[0].get("text") or (choices[0].get("delta") or {}).get("content") or data.get("content")
        if text:
            self.stamps.append(time.perf_counter())
        return True

    def result(self) -> Timed:
        ended, stamps = time.perf_counter(), self.stamps
        if not stamps:
            return Timed(ok=False, error="no text", started=self.started, ended=ended)
        decode = ((len(stamps) - 1) / (stamps[-1] - stamps[0])
                  if len(stamps) > 1 and stamps[-1] > stamps[0] else math.nan)
        return Timed(ok=True, ttft=stamps[0] - self.started, total=ended - self.started, tokens=len(stamps),
                     decode_tps=decode, cache_n=self.cache_n, prompt_ms=self.prompt_ms, started=self.started,
                     ended=ended)


def stream_request(url: str, path: str, body: dict[str, Any], *, key: str | None = None,
                   client: httpx.Client | None = None) -> Timed:
    """Streams one request and times it: TTFT, chunks, per-stream decode speed, cache_n."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    reader = _StreamReader()
    http = client or httpx.Client(timeout=600)
    try:
        with http.stream("POST", url + path, json={**body, "stream": True}, headers=headers) as response:
            if response.status_code != 200:
                response.read()
                return reader.failed(f"HTTP {response.status_code}")
            for line in response.iter_lines():
                if not reader.line(line):
                    return reader.failed(f"in-stream error ({reader.stream_error})")
    except httpx.HTTPError as exc:
        return reader.failed(type(exc).__name__)
    finally:
        if client is None:
            http.close()
    return reader.result()


async def astream_request(client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any], *,
                          key: str | None = None) -> Timed:
    """stream_request on the async client: many at once in one thread."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    reader = _StreamReader()
    try:
        async with client.stream("POST", url + path, json={**body, "stream": True}, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                return reader.failed(f"HTTP {response.status_code}")
            async for line in response.aiter_lines():
                if not reader.line(line):
                    return reader.failed(f"in-stream error ({reader.stream_error})")
    except httpx.HTTPError as exc:
        return reader.failed(type(exc).__name__)
    return reader.result()


@dataclass
class LoadRun:
    """What a load run cost the generator itself."""

    wall: float  # seconds
    cpu_share: float  # the generator's CPU seconds over the wall time: 1.0 is one core busy all along


def _client() -> httpx.AsyncClient:
    # No kept-alive connections: each request opens its own, as each run of the lab's chat.py does (an
    # idle kept-alive connection that the server closes would also be a client error here).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    return httpx.AsyncClient(timeout=600, limits=limits)


async def _measured(work: Callable[[httpx.AsyncClient], Awaitable[object]]) -> LoadRun:
    async with _client() as client:
        cpu, begin = time.process_time(), time.perf_counter()
        await work(client)
        wall = time.perf_counter() - begin
        return LoadRun(wall=wall, cpu_share=(time.process_time() - cpu) / wall)


def gather_streams(url: str, requests: list[tuple[float, str, dict[str, Any]]]) -> tuple[list[Timed], LoadRun]:
    """Streams every (delay s, path, body) at once from one asyncio loop, each after its delay."""
    results: list[Timed] = [Timed(ok=False)] * len(requests)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        delay, path, body = requests[i]
        if delay > 0:
            await asyncio.sleep(delay)
        results[i] = await astream_request(client, url, path, body)

    async def every(client: httpx.AsyncClient) -> None:
        await asyncio.gather(*(one(client, i) for i in range(len(requests))))

    run = asyncio.run(_measured(every))
    return results, run


def lab_request(question: str, tokens: int) -> dict[str, Any]:
    """The lab's streamed chat request (chat.py --stream), with its own question."""
    return {"model": "local", "max_tokens": tokens, "ignore_eos": True,
            "messages": [{"role": "system", "content": LAB_SYSTEM}, {"role": "user", "content": question}],
            "chat_template_kwargs": {"enable_thinking": False}}


@dataclass
class Student:
    name: str
    key: str | None
    think: tuple[float, float]  # seconds between requests (0, 0: a greedy student)
    results: list[Timed] = field(default_factory=list)


def run_students(url: str, students: list[Student], *, duration: float, tokens: int,
                 connections: Callable[[Student], int] = lambda s: 1, seed: int = 1) -> LoadRun:
    """Each student sends the lab's request, thinks, and again, until `duration` is over; one asyncio task
    a connection in this one thread, so the generator's own CPU stays small beside the server's (its share
    is in the LoadRun). A student with more connections runs that many loops at once."""
    rng = random.Random(seed)
    stop_at = time.perf_counter() + duration

    async def loop(client: httpx.AsyncClient, student: Student, offset: float) -> None:
        await asyncio.sleep(offset)
        while time.perf_counter() < stop_at:
            body = lab_request(rng.choice(QUESTIONS), tokens)
            student.results.append(await astream_request(client, url, "/v1/chat/completions", body, key=student.key))
            low, high = student.think
            if high > 0:
                await asyncio.sleep(rng.uniform(low, high))

    async def everyone(client: httpx.AsyncClient) -> None:
        loops = []
        for student in students:
            for _ in range(connections(student)):
                offset = 0.0 if student.think == (0, 0) else rng.uniform(0, student.think[1])
                loops.append(loop(client, student, offset))
        await asyncio.gather(*loops)

    return asyncio.run(_measured(everyone))


def percentile(values: list[float], q: float) -> float:
    values = sorted(v for v in values if not math.isnan(v))
    if not values:
        return math.nan
    if len(values) == 1:
        return values[0]
    position = (len(values) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def jain_index(amounts: list[float]) -> float:
    """Jain's fairness index: 1 when everyone got the same, 1/n when one got everything."""
    if not amounts or not any(amounts):
        return math.nan
    return sum(amounts) ** 2 / (len(amounts) * sum(a * a for a in amounts))


def median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return "-" if math.isnan(value) else f"{value:.2f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
