"""A class of multi-turn chats against a pool of two upstream servers: cache-aware against
least-outstanding routing, in one run.

Each student holds one conversation of 3-5 turns (the lab's system prompt, then a question a turn,
each turn sending the whole history as chat clients do), thinking 2-5 s between turns. The pool is two
upstream servers on this machine (kinetic, or llama-server with --no-repack), `-t 1` each so that they
do not fight over the two cores, behind one keyed `kinetic serve --upstream`. For each policy the
servers start fresh (cold caches) and the class runs the same schedule (same seed, greedy sampling).
Printed per policy: TTFT p50/p95 (every turn, and follow-up turns alone), the share of prompt tokens
the servers' caches answered (`cache_n`), the follow-up turns that hit their server's cache (cache_n
covers the whole previous prompt), and the requests each server served.

    python bench/bench_pool.py [--students 10] [--tokens 32] [-np 4] [--rounds 2] [--paste 0]
                               [--upstream kinetic|llama-server] [--upstream-args "-sps 0"] [--dump FILE]

Give llama-server members `-sps 0` (docs/router.md: with its default slot choice a new conversation
takes the slot of another student's history, and about half the follow-ups miss however they are routed).
`--rounds N` runs both policies N times, their order reversed each round, and pools the turns.
`--paste N` has each question carry N lines of the student's own program output (its timings), as a
student asking a lab tutor about a run does; the histories grow by those lines each turn.

It holds the machine's model lock while it runs (do not wrap it in `flock` on the same lock).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import LAB_SYSTEM, QUESTIONS, Server, kinetic_server, llama_server, percentile, table  # noqa: E402

from kinetic.backends.bundled import gemma_model_path  # noqa: E402
from kinetic.server.launch import model_lock  # noqa: E402

POLICIES = ("least-outstanding", "cache-aware")
MODEL_ID = "gemma-up"
# A follow-up hits when the cache held the turn before's whole prompt but for its last few tokens: the
# bundled Gemma has no chat template, so llama-server's fallback chatml ends the prompt on ordinary text
# pieces ("assistant\n") that tokenize otherwise once the answer follows them (measured: 5 tokens short
# on every hit). A miss finds at most the shared system prompt, a whole question (12+ tokens) short.
BOUNDARY_TOKENS = 8


@dataclass
class Turn:
    index: int  # 0: the conversation's first turn
    ok: bool
    ttft: float = math.nan
    prompt_tokens: int = 0
    cache_n: int = 0
    previous_prompt: int = 0  # the turn before's whole prompt, which a hit finds in the cache
    sent_at: float = 0.0  # seconds since the class began

    @property
    def hit(self) -> bool:
        return self.ok and self.index > 0 and self.cache_n >= self.previous_prompt - BOUNDARY_TOKENS


@dataclass
class Conversation:
    key: str
    turns: int
    offset: float
    thinks: list[float]
    questions: list[str]
    results: list[Turn] = field(default_factory=list)


def ask(url: str, key: str, messages: list[dict[str, Any]], tokens: int) -> tuple[Turn, str]:
    """One streamed turn: its TTFT, usage and cache_n, and the answer's text for the history."""
    body = {"model": "class", "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    started = time.perf_counter()
    first = math.nan
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600,
                          headers={"Authorization": f"Bearer {key}"}) as response:
            if response.status_code != 200:
                return Turn(index=0, ok=False), ""
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
                for choice in chunk.get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        first = first if not math.isnan(first) else time.perf_counter() - started
                        pieces.append(text)
    except httpx.HTTPError:
        return Turn(index=0, ok=False), ""
    return Turn(index=0, ok=not math.isnan(first), ttft=first, prompt_tokens=int(usage.get("prompt_tokens", 0)),
                cache_n=int(timings.get("cache_n", 0))), "".join(pieces)


def run_conversation(url: str, chat: Conversation, tokens: int, begin: float) -> None:
    time.sleep(chat.offset)
    messages: list[dict[str, Any]] = [{"role": "system", "content": LAB_SYSTEM}]
    previous = 0
    for index in range(chat.turns):
        messages.append({"role": "user", "content": chat.questions[index]})
        sent_at = time.perf_counter() - begin
        turn, answer = ask(url, chat.key, messages, tokens)
        turn.index, turn.previous_prompt, turn.sent_at = index, previous, sent_at
        chat.results.append(turn)
        previous = turn.prompt_tokens
        messages.append({"role": "assistant", "content": answer})
        if index + 1 < chat.turns:
            time.sleep(chat.thinks[index])


def pasted_output(rng: random.Random, lines: int) -> str:
    """What a student pastes under a question: lines of their program's timings, different each run."""
    if lines <= 0:
        return ""
    rows = [f"run {n}: prompt_n={rng.randint(20, 400)} cache_n={rng.randint(0, 300)} "
            f"prompt_ms={rng.uniform(5, 900):.1f} predicted_n={rng.randint(8, 128)} "
            f"predicted_per_second={rng.uniform(8, 60):.2f}" for n in range(1, lines + 1)]
    return "\n\nEcco il mio output:\n" + "\n".join(rows)


def schedule(students: int, seed: int, paste: int = 0) -> list[Conversation]:
    """The class: the same for both policies."""
    rng = random.Random(seed)
    chats = [Conversation(key=f"sk-student-{i:02d}", turns=rng.randint(3, 5), offset=rng.uniform(0, 5),
                          thinks=[rng.uniform(2, 5) for _ in range(5)], questions=rng.sample(QUESTIONS, 5))
             for i in range(students)]
    for chat in chats:  # drawn after the schedule, so that --paste 0 keeps the class it always had
        chat.questions = [question + pasted_output(rng, paste) for question in chat.questions]
    return chats


def upstream(kind: str, binary: str | None, model: str, flags: list[str]) -> Server:
    if kind == "llama-server":
        server = llama_server(binary, model, [*flags, "--no-repack"])
        if server is None:
            raise SystemExit("no llama-server: build it with shared/peer/build_llama_server.sh or pass --llama-server")
        return server
    return kinetic_server(model, flags)


def one_policy(args: argparse.Namespace, policy: str, keys: Path) -> dict[str, Any]:
    flags = ["-t", "1", "-np", str(args.parallel), "-c", str(args.ctx), "-a", MODEL_ID, "--metrics",
             *shlex.split(args.upstream_args)]
    with upstream(args.upstream, args.llama_server, args.model, flags) as first, \
            upstream(args.upstream, args.llama_server, args.model, flags) as second:
        router = Server("router", [sys.executable, "-m", "kinetic", "serve", "--api-key-file", str(keys),
                                   "--admin-key", "sk-bench", "-np", str(args.parallel), "--upstream-policy", policy,
                                   "--upstream", f"class={first.url},model={MODEL_ID}",
                                   "--upstream", f"class={second.url},model={MODEL_ID}"])
        with router:
            chats = schedule(args.students, args.seed, args.paste)
            begin = time.perf_counter()
            threads = [threading.Thread(target=run_conversation, args=(router.url, chat, args.tokens, begin))
                       for chat in chats]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - begin
            rows = httpx.get(router.url + "/v1/models", headers={"Authorization": "Bearer sk-bench"},
                             timeout=30).json()["data"]
            members = next(row for row in rows if row["id"] == "class")["status"]["upstreams"]
    turns = [turn for chat in chats for turn in chat.results]
    return {"policy": policy, "turns": turns, "wall": wall, "served": [m["served"] for m in members]}


def merged(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One policy's rounds as one: every turn, the wall time summed, the requests per server summed."""
    return {"policy": runs[0]["policy"], "turns": [t for run in runs for t in run["turns"]],
            "wall": sum(run["wall"] for run in runs),
            "served": [sum(n) for n in zip(*(r["served"] for r in runs), strict=True)]}


def row_of(result: dict[str, Any]) -> list[Any]:
    turns: list[Turn] = result["turns"]
    ok = [t for t in turns if t.ok]
    follow = [t for t in ok if t.index > 0]
    prompt = sum(t.prompt_tokens for t in ok)
    return [result["policy"], f"{len(ok)}/{len(turns)}", 1000 * percentile([t.ttft for t in ok], 0.5),
            1000 * percentile([t.ttft for t in ok], 0.95), 1000 * percentile([t.ttft for t in follow], 0.95),
            f"{100 * sum(t.cache_n for t in ok) / prompt:.0f} %" if prompt else "-",
            f"{100 * sum(t.hit for t in follow) / len(follow):.0f} %" if follow else "-",
            " / ".join(str(n) for n in result["served"]), result["wall"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=32, help="max_tokens of each answer")
    parser.add_argument("-np", "--parallel", type=int, default=4, help="slots of each upstream server")
    parser.add_argument("-c", "--ctx", type=int, default=8192, help="context of each upstream server")
    parser.add_argument("--upstream", choices=("kinetic", "llama-server"), default="kinetic")
    parser.add_argument("--upstream-args", default="", help="more flags for each upstream server (one string)")
    parser.add_argument("--llama-server", help="the llama-server binary (default: PATH, /tmp/lsbuild/bin)")
    parser.add_argument("--model", default=str(gemma_model_path()))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of both policies, in turn order reversed each round (the machine drifts)")
    parser.add_argument("--paste", type=int, default=0,
                        help="lines of program output under each question (the history grows by them)")
    parser.add_argument("--dump", type=Path, help="write every turn here (JSON lines) to look at")
    args = parser.parse_args()
    handle = tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False)
    handle.write("".join(f"sk-student-{i:02d} student{i:02d}\n" for i in range(args.students)))
    handle.close()
    try:
        with model_lock():
            runs = [one_policy(args, policy, Path(handle.name))
                    for round_ in range(args.rounds) for policy in (POLICIES if round_ % 2 == 0 else POLICIES[::-1])]
    finally:
        os.unlink(handle.name)
    results = [merged([run for run in runs if run["policy"] == policy]) for policy in POLICIES]
    if args.dump:
        args.dump.write_text("".join(json.dumps({"policy": run["policy"], "round": number // len(POLICIES),
                                                 **dataclasses.asdict(turn)}) + "\n"
                                     for number, run in enumerate(runs) for turn in run["turns"]))
    print(f"\n{args.students} students, 3-5 turns each, thinking 2-5 s, {args.tokens} tokens an answer, "
          f"{args.paste} pasted lines a question; "
          f"two {args.upstream} servers, -t 1 -np {args.parallel} -c {args.ctx} {args.upstream_args} each, "
          f"{args.rounds} round(s)\n")
    print(table(["policy", "turns ok", "TTFT p50 ms", "TTFT p95 ms", "follow-up TTFT p95 ms", "cache_n share",
                 "follow-ups hitting their cache", "requests per server", "wall s"],
                [row_of(result) for result in results]))
    least, affine = (percentile([t.ttft for t in r["turns"] if t.ok], 0.95) for r in results)
    least_f, affine_f = (percentile([t.ttft for t in r["turns"] if t.ok and t.index > 0], 0.95) for r in results)
    # first turns are new conversations, placed by load under either policy, and the first on each fresh
    # server (each slot, on llama-server) reads the system prompt cold: routing changes only the follow-ups
    print(f"\np95 TTFT cache-aware / least-outstanding: {affine / least:.2f} (every turn), "
          f"{affine_f / least_f:.2f} (follow-up turns)")


if __name__ == "__main__":
    main()
