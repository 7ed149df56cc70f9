"""Single-stream decode speed and time to first token: kinetic over HTTP vs llama-cpp-python in-process.

Both sides load the same GGUF with the same context size and thread count, run the same prompt
greedily for the same number of tokens, and are measured in this one run, one after the other
(never at the same time: llama.cpp's worker threads spin, so concurrent runs would measure
contention). The printed ratios are what to read; absolute figures drift from machine to machine.

    python bench/bench_decode.py [--model PATH] [--tokens 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # a checkout without an install

from kinetic.backends.bundled import gemma_model_path  # noqa: E402
from kinetic.server.launch import KineticServer, model_lock  # noqa: E402

PROMPT = "The history of the printing press begins"
CTX = 2048


def measure_in_process(model: Path, tokens: int, threads: int) -> tuple[float, float, int]:
    """(ttft seconds, decode tokens/s, tokens generated) with llama_cpp.Llama streaming."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(model), n_ctx=CTX, n_threads=threads, n_threads_batch=threads, verbose=False)
    eog = {llm.token_eos(): float("-inf")}
    try:
        started = time.perf_counter()
        stamps = []
        for _ in llm.create_completion(PROMPT, max_tokens=tokens, temperature=0.0, stream=True, logit_bias=eog):
            stamps.append(time.perf_counter())
        return stamps[0] - started, (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)
    finally:
        llm.close()


def measure_http(url: str, tokens: int) -> tuple[float, float, int, dict]:
    """(ttft seconds, decode tokens/s, tokens, server timings) streaming /v1/completions."""
    body = {"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "cache_prompt": False}
    stamps: list[float] = []
    timings: dict[str, Any] = {}
    started = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                stamps.append(time.perf_counter())
            timings = chunk.get("timings", timings)
    return stamps[0] - started, (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps), timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: the bundled Gemma 3 270M)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = args.model or gemma_model_path()

    with model_lock():
        local = [measure_in_process(model, args.tokens, args.threads) for _ in range(args.repeats)]
        with KineticServer(str(model), "-c", str(CTX), "-np", "1", "-t", str(args.threads)) as server:
            measure_http(server.url, 8)  # warm-up
            remote = [measure_http(server.url, args.tokens) for _ in range(args.repeats)]

    local_ttft = statistics.median(r[0] for r in local)
    local_tps = statistics.median(r[1] for r in local)
    http_ttft = statistics.median(r[0] for r in remote)
    http_tps = statistics.median(r[1] for r in remote)
    server_tps = statistics.median(r[3].get("predicted_per_second", 0.0) for r in remote)
    print(f"model: {model.name}, prompt {PROMPT!r}, {args.tokens} tokens, {args.threads} threads, "
          f"median of {args.repeats}")
    print(f"{'':34}{'in-process':>12}{'kinetic HTTP':>14}{'ratio':>8}")
    print(f"{'decode tokens/s (client clock)':34}{local_tps:12.1f}{http_tps:14.1f}{http_tps / local_tps:8.2f}")
    print(f"{'time to first token (ms)':34}{local_ttft * 1000:12.1f}{http_ttft * 1000:14.1f}"
          f"{http_ttft / local_ttft:8.2f}")
    print(f"{'decode tokens/s (server timings)':34}{'':12}{server_tps:14.1f}{server_tps / local_tps:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
