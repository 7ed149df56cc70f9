"""One model's decode speed served alone, and in a router with other local models loaded beside it.

A router process holds several models; each one's decodes must not slow the others down while they sit idle
(scheduler.py: libgomp keeps an OpenMP team for every thread that has computed, and once the process holds more
OpenMP threads than cores every barrier sleeps). Measured in one run, one server at a time:

  alone    `kinetic serve -m A`: one stream at a time on A
  router   `kinetic serve -m A -a a -m B -a b [-m E -a e]`: B (and the embedding model E) loaded and used once,
           then the same streams on A, then on B, then one stream on each at once

Printed: per-stream decode tokens/s (client side, median of --rounds streams) and the server's own
`predicted_per_token_ms`, with the router/alone ratio for each model; and for the two at once, each one's
tokens/s and their sum.

    python bench/bench_router.py [--model tiny:lfm2] [--other bundled] [--tokens 128] [--rounds 8] [--no-embedding]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import httpx
from filelock import FileLock

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_streams import PROMPT, aggregate_tps, model_path  # noqa: E402
from load import (  # noqa: E402
    MODEL_LOCK_PATH,
    Server,
    gather_streams,
    kinetic_server,
    median,
    stream_request,
    table,
)


def speeds(url: str, model: str, tokens: int, rounds: int) -> tuple[float, float]:
    """(client decode tok/s, server ms a token), medians over `rounds` single streams after one warm-up."""
    body: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": tokens, "ignore_eos": True,
                            "temperature": 0}
    stream_request(url, "/v1/completions", {**body, "max_tokens": 4})
    client, server = [], []
    for _ in range(rounds):
        timed = stream_request(url, "/v1/completions", body)
        if not timed.ok:
            raise SystemExit(f"a stream on {model} failed: {timed.error}")
        client.append(timed.decode_tps)
        reply = httpx.post(url + "/v1/completions", timeout=300, json={**body, "max_tokens": tokens})
        server.append(float(reply.json()["timings"]["predicted_per_token_ms"]))
    return median(client), median(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny:lfm2", help="the model measured (see bench_streams.py --model)")
    parser.add_argument("--other", default="bundled", help="the chat model loaded beside it ('bundled': Gemma)")
    parser.add_argument("--no-embedding", action="store_true", help="no embedding model in the router")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--flags", default="", help="extra flags for every kinetic serve")
    args = parser.parse_args()
    first, other = model_path(args.model), model_path(None if args.other == "bundled" else args.other)
    flags = args.flags.split()
    embedding: str | None = None
    if not args.no_embedding:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.embedding_model import embedding_gguf

        found = embedding_gguf()
        embedding = str(found) if found is not None else None
    rows = []
    with FileLock(MODEL_LOCK_PATH):
        alone: dict[str, tuple[float, float]] = {}
        for name, path in (("a", first), ("b", other)):
            with kinetic_server(path, ["-a", name, *flags]) as server:
                alone[name] = speeds(server.url, name, args.tokens, args.rounds)
        command = [sys.executable, "-m", "kinetic", "serve", "-m", first, "-a", "a", "-m", other, "-a", "b", *flags]
        if embedding is not None:
            command += ["-m", embedding, "-a", "e"]
        with Server("kinetic router", command) as router:
            for name in ("a", "b") + (("e",) if embedding is not None else ()):
                reply = httpx.post(router.url + "/models/load", json={"model": name}, timeout=300)
                reply.raise_for_status()
            if embedding is not None:  # the embedding model computes once, as a class's RAG exercise would
                httpx.post(router.url + "/v1/embeddings", json={"model": "e", "input": "a lighthouse"},
                           timeout=60).raise_for_status()
            together = {name: speeds(router.url, name, args.tokens, args.rounds) for name in ("b", "a")}
            both = [gather_streams(router.url, [(0.0, "/v1/completions", {
                "model": name, "prompt": PROMPT, "max_tokens": args.tokens, "ignore_eos": True, "temperature": 0})
                for name in ("a", "b")])[0] for _ in range(args.rounds)]
    for name, label in (("a", args.model), ("b", args.other)):
        (tps_alone, ms_alone), (tps_router, ms_router) = alone[name], together[name]
        rows.append([label, tps_alone, tps_router, tps_router / tps_alone, ms_alone, ms_router])
    beside = "the other model" + (" and an embedding model" if embedding is not None else "")
    print(f"one stream of {args.tokens} tokens at a time, {args.rounds} rounds; router: {beside} loaded and used")
    print(table(["model", "alone tok/s", "router tok/s", "router/alone", "alone ms/token (server)",
                 "router ms/token (server)"], rows))
    runs = [run for run in both if all(r.ok for r in run)]
    print(f"one stream on each at once ({len(runs)} of {args.rounds} rounds whole): {args.model} "
          f"{median([run[0].decode_tps for run in runs]):.1f} tok/s, {args.other} "
          f"{median([run[1].decode_tps for run in runs]):.1f} tok/s, together "
          f"{median([aggregate_tps(run) for run in runs]):.1f} tok/s")


if __name__ == "__main__":
    main()
