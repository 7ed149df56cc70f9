"""Does CPU work for one request stall everybody else's stream?

One client streams a long completion while 8 others send chat requests with a large
`json_schema` (rendering, tokenizing and compiling the schema to a grammar, then building the
sampler, is real CPU work). If that work runs on the server's event loop, the streaming client
sees a gap in its chunks for as long as it takes. The script prints the worst and the 99th
percentile gap between the streaming client's chunks, alone and with the schema requests arriving,
measured in this one run. It asserts nothing: it is a measurement.

    python bench/bench_event_loop.py [--model PATH] [--senders 8] [--properties 120]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a checkout without an install

from kinetic.server.launch import KineticServer, model_lock  # noqa: E402


def big_schema(n_properties: int) -> dict:
    kinds = [{"type": "string", "maxLength": 12}, {"type": "integer", "minimum": 0, "maximum": 99},
             {"type": "number"}, {"type": "boolean"}, {"type": "array", "items": {"type": "string"}, "maxItems": 3},
             {"enum": ["red", "green", "blue", "cyan", "magenta"]},
             {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
              "required": ["a", "b"]}]
    properties = {f"field_{i:03d}": kinds[i % len(kinds)] for i in range(n_properties)}
    return {"type": "object", "properties": properties, "required": list(properties)}


def stream_gaps(url: str, tokens: int) -> list[float]:
    """Seconds between consecutive SSE chunks of one streamed completion."""
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "stream": True, "ignore_eos": True,
            "temperature": 0}
    stamps: list[float] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


def send_schema_requests(url: str, senders: int, schema: dict) -> None:
    """Each sender's schema differs by one property, so no server-side cache can share the work."""
    def one(index: int) -> None:
        own = {**schema, "properties": {**schema["properties"], f"sender_{index}": {"type": "string"}}}
        body = {"messages": [{"role": "user", "content": "Fill in the form."}], "max_tokens": 1,
                "response_format": {"type": "json_schema", "json_schema": {"name": "form", "schema": own}}}
        httpx.post(url + "/v1/chat/completions", json=body, timeout=300)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def run(url: str, senders: int, schema: dict, tokens: int) -> dict[str, float]:
    alone = stream_gaps(url, tokens)
    result: dict[str, list[float]] = {}

    def streamer() -> None:
        result["gaps"] = stream_gaps(url, tokens)

    thread = threading.Thread(target=streamer)
    thread.start()
    time.sleep(0.5)  # let the stream get going, then the schema requests arrive together
    send_schema_requests(url, senders, schema)
    thread.join()
    loaded = result["gaps"]

    def p99(gaps: list[float]) -> float:
        return statistics.quantiles(gaps, n=100)[98] if len(gaps) > 1 else 0.0

    return {"alone_max_ms": 1000 * max(alone), "alone_p99_ms": 1000 * p99(alone),
            "loaded_max_ms": 1000 * max(loaded), "loaded_p99_ms": 1000 * p99(loaded)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF to serve (default: the bundled model)")
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--properties", type=int, default=120, help="properties in the large schema")
    parser.add_argument("--tokens", type=int, default=160, help="tokens the streaming client asks for")
    args = parser.parse_args()
    schema = big_schema(args.properties)
    server_args = ["-c", "4096", "-np", "2", "-t", str(min(2, os.cpu_count() or 1))]
    if args.model:
        server_args += ["-m", args.model]
    with model_lock(), KineticServer(*server_args) as server:
        figures = run(server.url, args.senders, schema, args.tokens)
    print(f"schema of {args.properties} properties ({len(json.dumps(schema))} bytes), {args.senders} senders")
    print("| streaming client | worst gap (ms) | p99 gap (ms) |")
    print("|---|---|---|")
    print(f"| alone | {figures['alone_max_ms']:.0f} | {figures['alone_p99_ms']:.0f} |")
    print(f"| while schema requests arrive | {figures['loaded_max_ms']:.0f} | {figures['loaded_p99_ms']:.0f} |")


if __name__ == "__main__":
    main()
