"""Lab 04-04: N clients at once against one server, each streaming the lab's request.

    python load.py                          4 clients, 8 requests in all
    python load.py --clients 1 --requests 4

Prints the server's slot count (-np), the totals, aggregate and per-stream tokens/s, TTFT p50/p95,
the prompt cache and the requests' ids (short) for the grader.
"""

import argparse
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from openai import OpenAI

LLAMA_URL = os.environ.get("LLAMA_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("API_KEY", "no-key-required")  # the key of --api-key, if the server has one
MAX_TOKENS = 32  # every request generates exactly this many tokens (ignore_eos): the runs compare
# The same long system prompt in every request: the part a slot can keep in its cache (cache_n).
SYSTEM = ("Sei l'assistente del corso di laboratorio sui server di modelli linguistici locali. "
          "Rispondi in italiano, in modo breve e preciso, senza elenchi puntati. " * 6).strip()
QUESTIONS = ["Che cos'è uno slot?", "A cosa serve la cache dei prompt?", "Che cos'è il TTFT?",
             "Perché il throughput aggregato cresce?", "Che cosa misura tokens al secondo?",
             "Che cos'è il batching continuo?", "Perché serve -np?", "Che cos'è la KV cache?"]
EXTRA = {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}}

client = OpenAI(base_url=LLAMA_URL + "/v1", api_key=API_KEY, max_retries=0)


def one_request(index: int) -> dict:
    """One streamed request: when it started, its first token and its end, on this client's clock."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}]
    start = time.perf_counter()
    first = None
    tokens = 0
    timings = {}
    response_id = ""
    for chunk in client.chat.completions.create(model="local", messages=messages, max_tokens=MAX_TOKENS,
                                                stream=True, extra_body=EXTRA):
        response_id = chunk.id or response_id
        timings = (chunk.model_extra or {}).get("timings") or timings
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            tokens += 1
    end = time.perf_counter()
    return {"start": start, "ttft": (first or end) - start, "end": end, "id": response_id,
            "tokens": timings.get("predicted_n", tokens),
            "prompt": timings.get("prompt_n", 0) + timings.get("cache_n", 0),
            "cache_n": timings.get("cache_n", 0)}


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def slots() -> str:
    """The server's -np, from /props (total_slots)."""
    try:
        response = httpx.get(LLAMA_URL + "/props", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
        return str(response.json()["total_slots"])
    except (httpx.HTTPError, ValueError, KeyError):
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4, help="requests in flight at once")
    parser.add_argument("--requests", type=int, default=8, help="requests in all")
    args = parser.parse_args()
    np_slots = slots()
    lock = threading.Lock()
    queue = list(range(args.requests))
    results = []

    def worker() -> None:  # each client sends its next request as soon as the previous one ends
        while True:
            with lock:
                if not queue:
                    return
                index = queue.pop(0)
            result = one_request(index)
            with lock:
                results.append(result)

    begin = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        for running in [pool.submit(worker) for _ in range(args.clients)]:
            running.result()  # a client's error ends the run with its traceback
    wall = time.perf_counter() - begin
    tokens = sum(r["tokens"] for r in results)
    stream_time = sum(r["end"] - r["start"] for r in results)  # each stream's life, its TTFT included
    ttfts = [r["ttft"] for r in results]
    print(f"[np={np_slots}, {args.clients} client, {len(results)} richieste, {tokens} token in {wall:.1f}s]")
    print(f"[aggregato {tokens / wall:.1f} t/s, per stream {tokens / stream_time:.1f} t/s, "
          f"TTFT p50 {percentile(ttfts, 0.5):.2f}s p95 {percentile(ttfts, 0.95):.2f}s]")
    print(f"[cache: prompt {max(r['prompt'] for r in results)} tok, cache_n medio "
          f"{sum(r['cache_n'] for r in results) / len(results):.0f}]")
    ids = [r["id"].removeprefix("chatcmpl-")[:8] for r in sorted(results, key=lambda r: r["start"])]
    print("[id: " + " ".join(ids) + "]")


if __name__ == "__main__":
    main()
