"""kinetic against llama-server (and in-process llama-cpp-python) on the same model and flags.

Four modes, each measured in one run with the servers taking turns (never decoding together):

  streams     1, 2, 4 and 8 concurrent streams (fixed prompt, fixed max_tokens, ignore_eos):
              aggregate tokens/s, per-stream decode tokens/s, TTFT p50/p95, and the ratios
              kinetic/llama-server (and kinetic/in-process for one stream); --constrained holds
              the output to a JSON schema (grammar sampling)
  classroom   N students send the lab's request (a shared system prompt, their own question) a
              fraction of a second apart: TTFT p50/p95/max, cache_n, wall time
  class-size  students who think 2-5 s between the lab's request, plus one who loops without
              pause, growing until the p95 TTFT passes 2 s: the largest class each server keeps
  ttft        the time to the first streamed token seen from a bare socket (a new connection a request,
              no HTTP library): the servers alternate round by round, so each round has its pair, and
              the run prints each server's TTFT p50 and the median of the pairs' differences, and (up to
              8 streams) each rank's TTFT in its round with the prompt_ms its server reported. The
              streams mode's client (httpx) adds its own milliseconds and noise to a TTFT of ~10 ms;
              this one measures the server's side of it.

    python bench/bench_streams.py streams [--llama-server PATH] [--rounds 3] [--constrained]
    python bench/bench_streams.py classroom [--students 16] [--spacing 0.25] [--rounds 3]  # replays, pooled
    python bench/bench_streams.py classroom --model tiny:lfm2 -np 16 --history 600  # after an hour of questions
    python bench/bench_streams.py class-size [--sizes 8,12,16,20,24] [--duration 40] [--defaults]
    python bench/bench_streams.py classroom --model tiny:lfm2     # a hybrid model (docs/models.md)
    python bench/bench_streams.py classroom --model bench:qwen35  # the course's family at its cost (bench_model.py)
    python bench/bench_streams.py class-size --no-kinetic "--llama-server-flags=-c 8192 -np 1"  # its best flags
    python bench/bench_streams.py streams --json streams.json  # the tables also as JSON (bench/gpu/report.py)
    python bench/bench_streams.py ttft --model tiny:lfm2 --defaults --streams 1,4 --rounds 300
    python bench/bench_streams.py ttft --chat --model tiny:lfm2 --defaults --streams 1,4  # the lab's chat route
    python bench/bench_streams.py ttft --model tiny:lfm2 --gap 0.2  # each round after 0.2 s of quiet (default 0.02)
    git worktree add /tmp/before HEAD~1; python bench/bench_streams.py ttft --baseline /tmp/before  # before/after

llama-server comes from --llama-server, PATH, or /tmp/lsbuild/bin/llama-server (built from the
vendored llama.cpp by shared/peer/build_llama_server.sh); without one, only kinetic is measured.
With --baseline, the other server is kinetic from another checkout, started with the same flags: the
two take turns as above, so a change is measured before and after in one run, on the same machine's
noise (two runs minutes apart differed by more than most changes do).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import (  # noqa: E402
    MODEL_LOCK_PATH,
    QUESTIONS,
    LoadRun,
    Server,
    Student,
    Timed,
    gather_streams,
    kinetic_baseline,
    kinetic_server,
    lab_request,
    llama_server,
    llama_server_default_flags,
    median,
    percentile,
    run_students,
    stream_request,
    table,
)

PROMPT = "The history of the printing press begins"


def model_path(given: str | None) -> str:
    """A GGUF path, `tiny:lfm2` or `tiny:mamba` (the tests' hybrid and recurrent models, written on first
    use: tests/hybrid_model.py), `bench:qwen35` or `bench:lfm2` (hybrids as costly as the course's models:
    bench/bench_model.py), or the bundled model."""
    if given and given.startswith("bench:"):
        from bench_model import bench_model

        return str(bench_model(given.removeprefix("bench:")))
    if given and given.startswith("tiny:"):
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.hybrid_model import tiny_model

        return str(tiny_model(given.removeprefix("tiny:")))
    if given:
        return given
    from kinetic.backends.bundled import gemma_model_path

    return str(gemma_model_path())


# --constrained: output held to a JSON schema, a list of records too long to end within max_tokens
# (with ignore_eos, a grammar that is done can only stop: llama-server answers that with a 500)
RECORDS_SCHEMA = {"type": "array", "minItems": 40, "items": {"type": "object", "properties": {
    "name": {"type": "string"}, "year": {"type": "integer"}}, "required": ["name", "year"]}}


def concurrent(url: str, n: int, tokens: int, constrained: bool = False) -> list[Timed]:
    """n streams sent at the same instant (one asyncio loop: no thread starts one before the others)."""
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
    if constrained:
        body["json_schema"] = RECORDS_SCHEMA
    return gather_streams(url, [(0.0, "/v1/completions", body)] * n)[0]


class FirstToken(NamedTuple):
    ttft_s: float  # from connecting to the first streamed token's bytes
    prompt_ms: float  # the server's own `timings.prompt_ms` for the request (nan where it sent none)


PROMPT_MS = re.compile(rb'"prompt_ms":\s*([0-9.eE+-]+)')


async def _first_token(host: str, port: int, request: bytes) -> FirstToken:
    """One stream's TTFT; the rest of the stream is read after it, for the last `prompt_ms` it reports."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    seen = b""
    while b"data: {" not in seen:
        chunk = await reader.read(65536)
        if not chunk:
            raise RuntimeError(f"the stream ended before its first token: {seen[:200]!r}")
        seen = seen[-16:] + chunk
    first = time.perf_counter() - start
    rest = [seen]
    while chunk := await reader.read(65536):
        rest.append(chunk)
    writer.close()
    reported = PROMPT_MS.findall(b"".join(rest))
    return FirstToken(first, float(reported[-1]) if reported else math.nan)


def raw_ttfts(url: str, n: int, chat: bool = False) -> list[FirstToken]:
    """n two-token streams sent at once from bare sockets (a raw prompt, or with `chat` the same text as the user's
    message): each one's TTFT, and the prompt time its server reported."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    fields: dict[str, Any] = {"messages": [{"role": "user", "content": PROMPT}]} if chat else {"prompt": PROMPT}
    body = json.dumps({**fields, "max_tokens": 2, "temperature": 0, "stream": True}).encode()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body

    async def every() -> list[FirstToken]:
        return list(await asyncio.gather(*(_first_token(host, int(port), request) for _ in range(n))))

    return asyncio.run(every())


def mode_ttft(args: argparse.Namespace, servers: list[Server]) -> dict[str, Any]:
    counts = [int(n) for n in args.streams.split(",")]
    ranked: dict[tuple[str, int], list[list[FirstToken]]] = {}  # each round's streams, the first token's first
    pairs: dict[int, list[float]] = {n: [] for n in counts}  # the first server's round median less the other's, ms
    for server in servers:  # both start warm
        for _ in range(20):
            raw_ttfts(server.url, 1, args.chat)
    for i in range(args.rounds):
        for n in counts:
            medians = {}
            for server in servers if i % 2 == 0 else servers[::-1]:  # who goes first alternates
                run = raw_ttfts(server.url, n, args.chat)
                ranked.setdefault((server.name, n), []).append(sorted(run))
                medians[server.name] = median([r.ttft_s for r in run])
                time.sleep(args.gap)
            if len(medians) == 2:
                pairs[n].append(1000 * (medians[servers[0].name] - medians[servers[1].name]))
    ttfts = {key: [r.ttft_s for run in rounds for r in run] for key, rounds in ranked.items()}
    rows = [[name, n, 1000 * percentile(v, 0.1), 1000 * percentile(v, 0.5), 1000 * percentile(v, 0.9)]
            for (name, n), v in ttfts.items()]
    headers = ["server", "streams", "TTFT p10 ms", "TTFT p50 ms", "TTFT p90 ms"]
    print(table(headers, rows))
    result: dict[str, Any] = {"rounds": args.rounds, "rows": records(headers, rows)}
    # Rank by rank (up to 8 streams): which of a round's streams waited, and whether its prompt was read with the
    # others (the same prompt_ms) or in a later step
    rank_rows = [[name, n, ", ".join(f"{1000 * median([r[k].ttft_s for r in rounds]):.1f}" for k in range(n)),
                  ", ".join(f"{median([r[k].prompt_ms for r in rounds]):.1f}" for k in range(n))]
                 for (name, n), rounds in ranked.items() if 1 < n <= 8]
    if rank_rows:
        rank_headers = ["server", "streams", "TTFT p50 by rank in its round, ms", "its prompt_ms p50, ms"]
        print()
        print(table(rank_headers, rank_rows))
        result["ranks"] = records(rank_headers, rank_rows)
    if len(servers) > 1:
        first, other = servers[0].name, servers[1].name
        ratio_rows = [[n, percentile(ttfts[(first, n)], 0.5) / percentile(ttfts[(other, n)], 0.5),
                       median(pairs[n])] for n in counts]
        ratio_headers = ["streams", f"TTFT p50, {first} / {other}", "round pairs' difference, median ms"]
        print()
        print(table(ratio_headers, ratio_rows))
        result["ratios"] = records(ratio_headers, ratio_rows)
    return result


def in_process(model: str, tokens: int, threads: int, ctx: int) -> tuple[float, float]:
    """(TTFT s, decode tokens/s) of one stream with llama_cpp.Llama in this process."""
    from llama_cpp import Llama

    llm = Llama(model_path=model, n_ctx=ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
    try:
        started = time.perf_counter()
        stamps = [time.perf_counter() for _ in llm.create_completion(
            PROMPT, max_tokens=tokens, temperature=0.0, stream=True, logit_bias={llm.token_eos(): float("-inf")})]
        return stamps[0] - started, (len(stamps) - 1) / (stamps[-1] - stamps[0])
    finally:
        llm.close()


def aggregate_tps(run: list[Timed]) -> float:
    """Tokens per second of a set of concurrent streams, from the first start to the last end."""
    return sum(r.tokens for r in run) / (max(r.ended for r in run) - min(r.started for r in run))


def records(headers: list[str], rows: list[list[Any]]) -> list[dict[str, Any]]:
    """A printed table's rows as JSON objects keyed by its column names (NaN, which JSON lacks, as null)."""
    return [{h: None if isinstance(v, float) and math.isnan(v) else v for h, v in zip(headers, row, strict=True)}
            for row in rows]


def mode_streams(args: argparse.Namespace, servers: list[Server]) -> dict[str, Any]:
    counts = [int(n) for n in args.streams.split(",")]
    figures: dict[tuple[str, int], list[list[Timed]]] = {}
    for server in servers:  # both start equally warm: a server's first request pays its one-time costs
        concurrent(server.url, 1, 4, args.constrained)
    for _ in range(args.rounds):
        for n in counts:
            for server in servers:  # take turns: never two servers decoding at once
                figures.setdefault((server.name, n), []).append(
                    concurrent(server.url, n, args.tokens, args.constrained))
    rows = []
    summary: dict[tuple[str, int], tuple[float, float, float]] = {}
    for (name, n), rounds in figures.items():
        aggregate = median([aggregate_tps(run) for run in rounds if all(r.ok for r in run)])
        per_stream = median([r.decode_tps for run in rounds for r in run if r.ok])
        ttfts = [r.ttft for run in rounds for r in run if r.ok]
        summary[(name, n)] = (aggregate, per_stream, percentile(ttfts, 0.5))
        # what the server says its prompt took, and the rest of the TTFT: queueing, parsing, the first write
        prompt_ms = [r.prompt_ms for run in rounds for r in run if r.ok]
        waits = [1000 * r.ttft - r.prompt_ms for run in rounds for r in run if r.ok]
        rows.append([name, n, aggregate, per_stream, 1000 * percentile(ttfts, 0.5), 1000 * percentile(ttfts, 0.95),
                     percentile(prompt_ms, 0.5), percentile(waits, 0.5)])
    headers = ["server", "streams", "aggregate tok/s", "per-stream tok/s", "TTFT p50 ms", "TTFT p95 ms",
               "prompt_ms p50", "TTFT - prompt_ms p50"]
    print(table(headers, rows))
    result: dict[str, Any] = {"tokens": args.tokens, "rounds": args.rounds, "rows": records(headers, rows)}
    if len(servers) > 1:
        print()
        ratio_rows = []
        first, other = servers[0].name, servers[1].name
        for n in counts:
            k, ls = summary[(first, n)], summary[(other, n)]
            # each round's own ratio: how far one round can stray from the median (the run's noise)
            per_round = [aggregate_tps(a) / aggregate_tps(b)
                      for a, b in zip(figures[(first, n)], figures[(other, n)], strict=False)
                      if all(r.ok for r in a + b)]
            spread = f"{min(per_round):.2f}-{max(per_round):.2f}" if per_round else "-"
            ratio_rows.append([n, k[0] / ls[0], spread, k[1] / ls[1], k[2] / ls[2]])
        print(f"{first} / {other} (above 1 is {first} faster, except TTFT where below 1 is better)")
        ratio_headers = ["streams", "aggregate", "aggregate, rounds min-max", "per-stream decode", "TTFT p50"]
        print(table(ratio_headers, ratio_rows))
        result["ratios"] = records(ratio_headers, ratio_rows)
    if args.in_process:  # the servers are idle now: their threads do not spin
        ttft, tps = in_process(args.model, args.tokens, args.threads, args.ctx)
        k = summary[("kinetic", 1)]
        print()
        print(f"in-process llama-cpp-python, one stream: decode {tps:.1f} tok/s, TTFT {1000 * ttft:.0f} ms; "
              f"kinetic/in-process decode {k[1] / tps:.2f}, TTFT {k[2] / ttft:.2f}")
        result["in_process"] = {"decode tok/s": tps, "TTFT ms": 1000 * ttft}
    return result


def classroom(url: str, students: int, spacing: float, tokens: int) -> tuple[list[Timed], LoadRun]:
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(students)]
    return gather_streams(url, [(i * spacing, "/v1/chat/completions", lab_request(q, tokens))
                                for i, q in enumerate(questions)])


def class_history(url: str, questions: int) -> float:
    """A class's past on a fresh server: `questions` different 2-token lab chats, 8 at a time, as an hour of
    students leaves its checkpoints and saved prompts behind. Seconds they took."""
    async def answered(client: httpx.AsyncClient, i: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            body = {**lab_request(f"Domanda {i}: che cosa succede al passo {i * 7919 % 1000}?", 2), "stream": False}
            (await client.post(url + "/v1/chat/completions", json=body)).raise_for_status()

    async def every() -> None:
        gate = asyncio.Semaphore(8)
        async with httpx.AsyncClient(timeout=600) as client:
            await asyncio.gather(*(answered(client, i, gate) for i in range(questions)))

    begin = time.perf_counter()
    asyncio.run(every())
    return time.perf_counter() - begin


def mode_classroom(args: argparse.Namespace, servers: list[Server]) -> dict[str, Any]:
    # 16 requests give a p95 that is their second slowest: the replay runs --rounds times, the servers taking turns
    # (who goes first alternates), and each server's figures pool its rounds
    results: dict[str, list[Timed]] = {server.name: [] for server in servers}
    runs: dict[str, list[LoadRun]] = {server.name: [] for server in servers}
    history: dict[str, float] = {}
    for server in servers:
        if args.history:
            history[server.name] = class_history(server.url, args.history)
            print(f"{server.name}: {args.history} earlier questions answered in {history[server.name]:.1f} s")
        stream_request(server.url, "/v1/chat/completions", lab_request("warm up", 4))  # both start equally warm
    for i in range(args.rounds):
        for server in servers if i % 2 == 0 else servers[::-1]:
            replay, run = classroom(server.url, args.students, args.spacing, args.tokens)
            results[server.name] += replay
            runs[server.name].append(run)
            time.sleep(0.5)
    rows = []
    p95: dict[str, float] = {}
    for server in servers:
        pooled = results[server.name]
        ttfts = [r.ttft for r in pooled if r.ok]
        # each replay's first request finds the cache as the one before left it: the others are the class
        cached = [r.cache_n for k, r in enumerate(pooled) if k % args.students and r.ok and r.cache_n is not None]
        p95[server.name] = percentile(ttfts, 0.95)
        rows.append([server.name, sum(r.ok for r in pooled), 1000 * percentile(ttfts, 0.5), 1000 * p95[server.name],
                     1000 * max(ttfts, default=math.nan), min(cached, default=-1),
                     median([run.wall for run in runs[server.name]]),
                     f"{100 * max(run.cpu_share for run in runs[server.name]):.0f}%"])
    print(f"{args.students} students, {args.spacing}s apart, {args.tokens} tokens each, -np {args.parallel}, "
          f"{args.rounds} replays pooled" + (f", after {args.history} earlier questions" if args.history else ""))
    headers = ["server", "served", "TTFT p50 ms", "TTFT p95 ms", "TTFT max ms", "least cache_n after the first",
               "wall s (median replay)", "generator CPU (most)"]
    print(table(headers, rows))
    result: dict[str, Any] = {"students": args.students, "spacing s": args.spacing, "tokens": args.tokens,
                              "replays": args.rounds, "history": args.history, "history s": history,
                              "rows": records(headers, rows)}
    if len(servers) > 1:
        first, other = servers[0].name, servers[1].name
        result["TTFT p95 ratio"] = p95[first] / p95[other]
        print(f"{first}/{other} TTFT p95: {result['TTFT p95 ratio']:.2f}")
    return result


def mode_class_size(args: argparse.Namespace, servers: list[Server]) -> dict[str, Any]:
    sizes = sorted(int(n) for n in args.sizes.split(","))
    rows = []
    largest: dict[str, int] = {s.name: 0 for s in servers}
    still_fine = {s.name: True for s in servers}
    for server in servers:  # both start equally warm: the lab's prompt evaluated once
        stream_request(server.url, "/v1/chat/completions", lab_request("warm up", 4))
    for size in sizes:
        for server in servers:
            if not still_fine[server.name]:
                continue
            students = [Student(f"s{i}", None, (2.0, 5.0)) for i in range(size)] + [Student("greedy", None, (0, 0))]
            run = run_students(server.url, students, duration=args.duration, tokens=32)
            results = [r for s in students for r in s.results]
            ttfts = [r.ttft for r in results if r.ok]
            p95 = percentile(ttfts, 0.95)
            errors = Counter(r.error for r in results if not r.ok)
            rows.append([server.name, size, len(ttfts), ", ".join(f"{n} {e}" for e, n in errors.items()) or "-",
                         1000 * percentile(ttfts, 0.5), 1000 * p95, len(ttfts) / run.wall,
                         f"{100 * run.cpu_share:.0f}%"])
            # A class is kept while 95% of its requests start within 2 s and at most 1% fail.
            if p95 <= 2.0 and sum(errors.values()) <= 0.01 * len(results):
                largest[server.name] = size
            else:
                still_fine[server.name] = False
        if not any(still_fine.values()):
            break
    slots = ", ".join(f"{s.name} {s.slots()}" for s in servers)
    print(f"slots: {slots}; students think 2-5 s between 32-token streamed lab requests, plus one greedy; "
          f"{args.duration:.0f} s a size")
    headers = ["server", "students", "requests", "errors", "TTFT p50 ms", "TTFT p95 ms", "requests/s",
               "generator CPU"]
    print(table(headers, rows))
    print("largest class with p95 TTFT <= 2 s (and <= 1% errors): "
          + ", ".join(f"{k} {v}" for k, v in largest.items()))
    return {"duration s": args.duration, "rows": records(headers, rows), "largest class": largest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["streams", "classroom", "class-size", "ttft"])
    parser.add_argument("--model", help="GGUF, tiny:lfm2 / tiny:mamba, bench:qwen35 / bench:lfm2 "
                        "(default: the bundled model)")
    parser.add_argument("--llama-server", help="llama-server binary to compare with")
    parser.add_argument("--no-llama-server", action="store_true", help="measure kinetic alone")
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="compare with kinetic as another checkout has it (a git worktree of an earlier commit), "
                             "instead of llama-server: a change before and after, in one run, with the same flags")
    parser.add_argument("--no-kinetic", action="store_true", help="measure llama-server alone (e.g. other flags)")
    parser.add_argument("-c", "--ctx", type=int, default=8192)
    parser.add_argument("-np", "--parallel", type=int, default=None, help="slots (default: 8 for streams, 4 otherwise)")
    parser.add_argument("-t", "--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--kinetic-flags", default="", help="extra flags for kinetic serve only")
    parser.add_argument("--llama-server-flags", default="",
                        help="flags for llama-server only, replacing the shared -c/-np (its best for the load)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per request (96 streams, 24 classroom)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (3; ttft: 200; classroom: replays pooled)")
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--in-process", action="store_true", help="also time in-process llama-cpp-python")
    parser.add_argument("--constrained", action="store_true", help="streams: output held to a JSON schema")
    parser.add_argument("--chat", action="store_true", help="ttft: /v1/chat/completions instead of /v1/completions")
    parser.add_argument("--gap", type=float, default=0.02,
                        help="ttft: seconds of quiet after each server's round (a class's requests come seconds apart)")
    parser.add_argument("--students", type=int, default=16)
    parser.add_argument("--spacing", type=float, default=0.25)
    parser.add_argument("--history", type=int, default=0,
                        help="classroom: first answer this many different questions, as a class's past (600: an hour)")
    parser.add_argument("--sizes", default="8,12,16,20,24,28,32,40,48,56,64")
    parser.add_argument("--defaults", action="store_true",
                        help="start both servers with their own defaults (no -c, -np): what a bare start serves")
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--same-kernels", action="store_true",
                        help="both servers without repacked weights (default: each at its own defaults)")
    parser.add_argument("--json", type=Path, help="also write the tables to this file as JSON")
    args = parser.parse_args()
    args.model = model_path(args.model)
    if args.defaults and (args.parallel or args.ctx != parser.get_default("ctx")):
        print("--defaults: -c and -np are not passed; each server runs its own (slots: kinetic 16 over one cache, "
              "llama-server 4)")
    args.parallel = args.parallel or (8 if args.mode == "streams" else 4)
    args.tokens = args.tokens or (96 if args.mode == "streams" else 24)
    args.rounds = args.rounds or (200 if args.mode == "ttft" else 3)
    # Each server at its own defaults: llama-server repacks weights (except on AMX, where that crashes), kinetic
    # does not, since repacked kernels make a cached prompt's answer differ from a fresh one (docs/models.md).
    # --same-kernels loads both without repacking, to compare the servers rather than the kernels.
    flags = ["-t", str(args.threads)]
    if not args.defaults:
        flags += ["-c", str(args.ctx), "-np", str(args.parallel)]
    kernels = ["--no-repack"] if args.same_kernels else llama_server_default_flags()
    from filelock import FileLock

    with FileLock(str(MODEL_LOCK_PATH)):
        candidates = [] if args.no_kinetic else [kinetic_server(args.model, flags + args.kinetic_flags.split())]
        own = flags + kernels
        if args.llama_server_flags:  # its own -c/-np replace the shared ones
            own = ["-t", str(args.threads), *kernels, *args.llama_server_flags.split()]
        other: Server | None
        if args.baseline is not None:
            other = kinetic_baseline(args.baseline.resolve(), args.model, flags + args.kinetic_flags.split())
        else:
            other = None if args.no_llama_server else llama_server(args.llama_server, args.model, own)
        if other is not None:
            candidates.append(other)
        else:
            print("no llama-server binary: measuring kinetic alone")
        started: list[Server] = []
        try:
            for server in candidates:
                started.append(server.__enter__())
            run: dict[str, Any] = {"streams": mode_streams, "classroom": mode_classroom, "class-size": mode_class_size,
                                   "ttft": mode_ttft}
            result = run[args.mode](args, started)
            if args.json:
                servers = {s.name: " ".join(s.command) for s in started}
                args.json.write_text(json.dumps({"mode": args.mode, "model": args.model, "servers": servers,
                                                 "parallel": args.parallel, "ctx": args.ctx, **result}, indent=1))
        finally:
            for server in started:
                server.__exit__(None, None, None)


if __name__ == "__main__":
    main()
