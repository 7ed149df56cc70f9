"""A class for hours: does kinetic stay flat? (issue 46 part 3). Not a test: run it for an hour or more.

Sixty students with their own keys, each a client library of the course, think 20-40 s between requests:
- a multi-turn chat with the lab's system prompt (the openai SDK, streamed; the chat starts over after six turns),
- a chat about an image (the openai SDK, streamed; the tiny gemma3 projector on the bundled Gemma),
- a chat that has called a tool and gives its result back (the openai SDK, streamed, with `tools`),
- the Responses API (the openai SDK, streamed),
- Ollama's /api/chat (the ollama client, streamed),
- Anthropic's Messages (the anthropic SDK, streamed),
and one greedy student loops without pause on four connections (`--max-in-flight 2`, so it meets 429s).

Every minute it samples the server's RSS and open file descriptors. At the end it reads the ledger back and
prints: requests answered and errors by kind, ledger lines against answered requests, each student's usage
(GET /v1/me, read from the ledger's sink) against the ledger's sum and the client's, the minute samples, and
TTFT p50/p95 per window (ten minutes by default). The goals it checks are issue 46's: RSS flat within 5%
after the first window, no more fds open later than in the first window, no error but the limits' own
429/503, ledger lines equal to answered requests, and the last window's p95 within 10% of the second's.

    python bench/bench_soak.py [--minutes 60] [--students 60] [--window 10] [-np 4] [--think 20,40]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anthropic  # noqa: E402
import httpx  # noqa: E402
import ollama  # noqa: E402
import openai  # noqa: E402
from load import LAB_SYSTEM, MODEL_LOCK_PATH, QUESTIONS, kinetic_server, percentile, table  # noqa: E402

from kinetic.backends.bundled import gemma_model_path  # noqa: E402
from kinetic.classroom.ledger import read_ledger  # noqa: E402
from tests.projector_model import png_image, tiny_projector  # noqa: E402

KINDS = ("chat", "image", "tools", "responses", "ollama", "anthropic")
ADMIN = "sk-soak-teacher"
GREEDY = "sk-soak-greedy"
LIMIT_STATUSES = {429, 503}  # the class limits' own refusals: not errors of the server
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@dataclass
class Done:
    """One request as its client saw it."""

    key: str
    kind: str
    started: float  # seconds since the run began
    status: int  # 200, an HTTP error's status, or 0 for a transport error
    ttft: float = float("nan")
    tokens: int = 0  # prompt and completion tokens, as the answer's usage said
    error: str = ""


class Class:
    def __init__(self, url: str, keys: list[str], tokens: int, think: tuple[float, float], image: bytes):
        self.url = url
        self.keys = keys
        self.tokens = tokens
        self.think = think
        self.image_url = "data:image/png;base64," + base64.b64encode(image).decode()
        self.done: list[Done] = []
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def student(self, index: int, key: str, until: float) -> None:
        kind = KINDS[index % len(KINDS)]
        rng = random.Random(index)
        history: list[dict[str, Any]] = []
        oai = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=600)
        claude = anthropic.AsyncAnthropic(base_url=self.url, api_key=key, max_retries=0, timeout=600)
        llama = ollama.AsyncClient(host=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=600)
        await asyncio.sleep(rng.uniform(0, self.think[1]))  # the class does not arrive in one second
        while self.now() < until:
            question = rng.choice(QUESTIONS)
            if len(history) >= 12:
                history = []
            started = self.now()
            record = Done(key, kind, started, 0)
            try:
                if kind == "chat":
                    answer = await self._openai_chat(oai, record, [*history, {"role": "user", "content": question}])
                    history += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
                elif kind == "image":
                    content = [{"type": "image_url", "image_url": {"url": self.image_url}},
                               {"type": "text", "text": "Descrivi l'immagine."}]
                    await self._openai_chat(oai, record, [{"role": "user", "content": content}])
                elif kind == "tools":
                    await self._openai_chat(oai, record, self._tool_turns(question), tools=[WEATHER_TOOL])
                elif kind == "responses":
                    await self._responses(oai, record, question)
                elif kind == "ollama":
                    await self._ollama(llama, record, question)
                else:
                    await self._anthropic(claude, record, question)
                record.status = 200
            except (openai.APIStatusError, anthropic.APIStatusError) as exc:
                record.status, record.error = exc.status_code, str(exc)[:200]
            except ollama.ResponseError as exc:
                record.status, record.error = exc.status_code, exc.error[:200]
            except (openai.APIConnectionError, anthropic.APIConnectionError, httpx.HTTPError, ConnectionError) as exc:
                record.error = f"{type(exc).__name__}: {exc}"[:200]
            except (openai.APIError, anthropic.APIError) as exc:  # an error event inside a 200 stream
                record.status, record.error = 200, f"in the stream: {exc}"[:200]
            self.done.append(record)
            await asyncio.sleep(rng.uniform(*self.think))
        await oai.close()
        await claude.close()

    async def greedy(self, until: float) -> None:
        """Loops without pause: its limit's 429s are expected, and retried at once."""
        oai = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=GREEDY, max_retries=0, timeout=600)
        while self.now() < until:
            record = Done(GREEDY, "greedy", self.now(), 0)
            try:
                await self._openai_chat(oai, record, [{"role": "user", "content": random.choice(QUESTIONS)}])
                record.status = 200
            except openai.APIStatusError as exc:
                record.status, record.error = exc.status_code, str(exc)[:200]
                await asyncio.sleep(0.2)
            except openai.APIConnectionError as exc:
                record.error = f"{type(exc).__name__}: {exc}"[:200]
            except openai.APIError as exc:
                record.status, record.error = 200, f"in the stream: {exc}"[:200]
            self.done.append(record)
        await oai.close()

    @staticmethod
    def _tool_turns(question: str) -> list[dict[str, Any]]:
        call = {"id": "call_weather", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Roma"}'}}
        return [{"role": "system", "content": LAB_SYSTEM}, {"role": "user", "content": "Che tempo fa a Roma?"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_weather", "content": '{"sky": "sereno", "celsius": 18}'},
                {"role": "user", "content": question}]

    async def _openai_chat(self, client: openai.AsyncOpenAI, record: Done, messages: list[dict[str, Any]],
                           **more: Any) -> str:
        if messages[0]["role"] != "system":
            messages = [{"role": "system", "content": LAB_SYSTEM}, *messages]
        stream = await client.chat.completions.create(
            model="local", messages=messages, max_tokens=self.tokens, stream=True,  # type: ignore[call-overload]
            stream_options={"include_usage": True}, **more)
        text: list[str] = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if not text:
                    record.ttft = self.now() - record.started
                text.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                record.tokens = chunk.usage.total_tokens
        return "".join(text)

    async def _responses(self, client: openai.AsyncOpenAI, record: Done, question: str) -> None:
        stream = await client.responses.create(model="local", instructions=LAB_SYSTEM, input=question,
                                               max_output_tokens=self.tokens, stream=True)
        async for event in stream:
            if event.type == "response.output_text.delta" and record.ttft != record.ttft:
                record.ttft = self.now() - record.started
            elif event.type == "response.completed" and event.response.usage is not None:
                record.tokens = event.response.usage.total_tokens

    async def _ollama(self, client: ollama.AsyncClient, record: Done, question: str) -> None:
        messages = [{"role": "system", "content": LAB_SYSTEM}, {"role": "user", "content": question}]
        async for part in await client.chat(model="local", messages=messages, stream=True,
                                            options={"num_predict": self.tokens}):
            if part.message.content and record.ttft != record.ttft:
                record.ttft = self.now() - record.started
            if part.done:
                record.tokens = (part.prompt_eval_count or 0) + (part.eval_count or 0)

    async def _anthropic(self, client: anthropic.AsyncAnthropic, record: Done, question: str) -> None:
        stream = await client.messages.create(model="local", system=LAB_SYSTEM, max_tokens=self.tokens, stream=True,
                                              messages=[{"role": "user", "content": question}])
        prompt = 0
        async for event in stream:
            if event.type == "message_start":
                prompt = event.message.usage.input_tokens
            elif event.type == "content_block_delta" and record.ttft != record.ttft:
                record.ttft = self.now() - record.started
            elif event.type == "message_delta":
                record.tokens = prompt + event.usage.output_tokens


def is_error(done: Done) -> bool:
    """Anything but an answer or the class limits' own refusals (429, 503)."""
    return bool(done.error) and done.status not in LIMIT_STATUSES


def process_sample(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open file descriptors) of the server process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def sample_every_minute(group: Class, pid: int, until: float, samples: list[list[Any]]) -> None:
    while True:
        rss, fds = process_sample(pid)
        answered = sum(d.status != 0 for d in group.done)
        samples.append([round(group.now() / 60, 1), round(rss, 1), fds, answered,
                        sum(is_error(d) for d in group.done)])
        if group.now() >= until:
            return
        await asyncio.sleep(min(60.0, until - group.now() + 0.5))


async def run_class(url: str, pid: int, keys: list[str], args: argparse.Namespace) -> tuple[Class, list[list[Any]]]:
    group = Class(url, keys, args.tokens, args.think, png_image(64, 64, 7))
    until = args.minutes * 60
    samples: list[list[Any]] = []
    sampler = asyncio.create_task(sample_every_minute(group, pid, until, samples))
    await asyncio.gather(*(group.student(i, key, until) for i, key in enumerate(keys)),
                         *(group.greedy(until) for _ in range(4)))
    await sampler
    return group, samples


def usage_by_key(url: str, keys: list[str]) -> dict[str, int]:
    """Each key's usage today as the budget sees it (GET /v1/me)."""
    return {key: int(httpx.get(url + "/v1/me", headers={"Authorization": f"Bearer {key}"}, timeout=30)
                     .json()["budget"]["used"]) for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--students", type=int, default=60)
    parser.add_argument("--window", type=float, default=10.0, help="minutes per TTFT row")
    parser.add_argument("--tokens", type=int, default=16, help="max tokens an answer")
    parser.add_argument("--think", type=lambda s: tuple(float(x) for x in s.split(",")), default=(20.0, 40.0),
                        help="a student's pause between requests, seconds: MIN,MAX")
    parser.add_argument("-np", "--parallel", type=int, default=4)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--model", default=str(gemma_model_path()))
    args = parser.parse_args()

    import fcntl

    folder = Path(tempfile.mkdtemp(prefix="kinetic-soak-"))
    keys = [f"sk-soak-{i:02d}" for i in range(args.students)]
    (folder / "keys.txt").write_text("* tokens=100000000/day\n" + "".join(f"{k} student{i:02d}\n"
                                                                         for i, k in enumerate(keys))
                                     + f"{GREEDY} greedy\n", encoding="utf-8")
    ledger = folder / "ledger.jsonl"
    flags = ["-mm", str(tiny_projector("gemma3")), "-c", str(2048 * args.parallel), "-np", str(args.parallel),
             "-t", str(args.threads), "-a", "local", "--api-key-file", str(folder / "keys.txt"), "--admin-key", ADMIN,
             "--ledger", str(ledger), "--max-in-flight", "2", "--metrics"]
    with open(MODEL_LOCK_PATH, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with kinetic_server(args.model, flags) as server:
            assert server.proc is not None
            group, samples = asyncio.run(run_class(server.url, server.proc.pid, keys, args))
            # the requests' own lines: not the start's /health polls, read before /v1/me adds its own
            records = [r for r in read_ledger(ledger) if r.method == "POST"]
            usage = usage_by_key(server.url, [*keys, GREEDY])
    report(group, samples, usage, records, args)


def report(group: Class, samples: list[list[Any]], usage: dict[str, int], records: list[Any],
           args: argparse.Namespace) -> None:
    done = group.done
    answered = [d for d in done if d.status != 0]
    kinds = Counter(f"{d.status}" + (f" ({d.error[:60]})" if is_error(d) else "") for d in done)
    ledger_sum: dict[str, int] = defaultdict(int)
    for record in records:
        ledger_sum[record.client or ""] += (record.prompt_tokens or 0) + (record.completion_tokens or 0)
    client_sum: dict[str, int] = defaultdict(int)
    for d in done:
        client_sum[d.key] += d.tokens
    names = {f"sk-soak-{i:02d}": f"student{i:02d}" for i in range(args.students)} | {GREEDY: "greedy"}
    mismatched = [k for k, used in usage.items() if used != ledger_sum[names[k]]]
    print(f"\n{args.minutes:.0f} min, {args.students} students (+ greedy on 4 connections), -np {args.parallel}, "
          f"{args.tokens} tokens an answer, think {args.think[0]:.0f}-{args.think[1]:.0f} s; CPU: {cpu()}\n")
    print(f"requests: {len(done)}; answered (any HTTP status): {len(answered)}; their ledger lines: {len(records)}")
    print("by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())))
    print(f"usage (GET /v1/me) equal to the ledger's sum for {len(usage) - len(mismatched)} of {len(usage)} keys"
          + (f"; differing: {mismatched[:5]}" if mismatched else ""))
    print(f"client-seen tokens {sum(client_sum.values())}, ledger {sum(ledger_sum.values())}\n")
    print(table(["minute", "RSS MiB", "open fds", "answered", "errors (not 429/503)"], samples))
    windows: dict[int, list[float]] = defaultdict(list)
    for d in done:
        if d.status == 200 and d.ttft == d.ttft and d.key != GREEDY:  # what the class feels
            windows[int(d.started // (args.window * 60))].append(d.ttft * 1000)
    rows = [[f"{w * args.window:.0f}-{(w + 1) * args.window:.0f}", len(v), round(percentile(v, 0.5)),
             round(percentile(v, 0.95))] for w, v in sorted(windows.items())]
    print("\n" + table(["minutes", "students' answers", "TTFT p50 ms", "TTFT p95 ms"], rows))
    goals(samples, rows, sum(is_error(d) for d in done), answered, records, args)


def goals(samples: list[list[Any]], rows: list[list[Any]], errors: int, answered: list[Done],
          records: list[Any], args: argparse.Namespace) -> None:
    after_first = [s for s in samples if s[0] >= args.window]
    rss = [s[1] for s in after_first] or [0.0]
    first_fds = [s[2] for s in samples if s[0] < args.window] or [0]
    later_fds = [s[2] for s in after_first] or first_fds
    checks = [
        ("RSS flat within 5% after the first window", max(rss) <= min(rss) * 1.05,
         f"{min(rss):.1f}-{max(rss):.1f} MiB"),
        ("no fd growth after the first window", max(later_fds) <= max(first_fds),
         f"first window up to {max(first_fds)}, later up to {max(later_fds)}"),
        ("0 errors but the limits' 429/503", errors == 0, str(errors)),
        ("ledger lines = answered requests", len(records) == len(answered), f"{len(records)} vs {len(answered)}"),
    ]
    if len(rows) >= 3:
        checks.append(("last window's p95 within 10% of the second's", rows[-1][3] <= rows[1][3] * 1.10,
                       f"{rows[-1][3]} vs {rows[1][3]} ms"))
    print()
    for name, ok, value in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {value}")


def cpu() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "?"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    return f"{model}, {os.cpu_count()} cores, {'AVX-512' if 'avx512f' in info else 'AVX2'}"


if __name__ == "__main__":
    main()
