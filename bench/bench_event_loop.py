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
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

MODEL_LOCK_PATH = Path(tempfile.gettempdir()) / "kinetic-tests-model.lock"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kinetic", "serve", "--port", str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"kinetic serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("kinetic serve did not become healthy")


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
    return [b - a for a, b in zip(stamps, stamps[1:])]


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
    from filelock import FileLock

    schema = big_schema(args.properties)
    server_args = ["-c", "4096", "-np", "2", "-t", str(min(2, os.cpu_count() or 1))]
    if args.model:
        server_args += ["-m", args.model]
    with FileLock(str(MODEL_LOCK_PATH)):
        proc, url = start_server(server_args)
        try:
            figures = run(url, args.senders, schema, args.tokens)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"schema of {args.properties} properties ({len(json.dumps(schema))} bytes), {args.senders} senders")
    print("| streaming client | worst gap (ms) | p99 gap (ms) |")
    print("|---|---|---|")
    print(f"| alone | {figures['alone_max_ms']:.0f} | {figures['alone_p99_ms']:.0f} |")
    print(f"| while schema requests arrive | {figures['loaded_max_ms']:.0f} | {figures['loaded_p99_ms']:.0f} |")


if __name__ == "__main__":
    main()
