"""Does a batch slow the class? (issue 47). Not a test: one `kinetic serve`, measured in one run.

Eight students stream chats without pause but a short think (the openai SDK, their own keys), and their TTFT is
measured three times over the same duration: alone, beside a 200-line batch of the instructor's (chat completions,
run below every live request), and alone again. It prints TTFT p50/p95 of each phase, the ratio of the batch
phase's p95 to the mean of the two alone, and how far the batch got during its phase and when it ended.

    python bench/bench_batch.py [--seconds 60] [--streams 8] [--lines 200] [-np 10]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402
from load import LAB_SYSTEM, MODEL_LOCK_PATH, QUESTIONS, kinetic_server, percentile, table  # noqa: E402

from kinetic.backends.bundled import gemma_model_path  # noqa: E402

ADMIN = "sk-batch-teacher"


def cpu() -> str:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in flags.splitlines() if line.startswith("model name")), "?")
    return f"{model}, {'AVX-512' if 'avx512f' in flags else 'AVX2'}"


async def student(url: str, key: str, until: float, tokens: int, ttfts: list[float], errors: list[str]) -> None:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    while time.monotonic() < until:
        question = random.choice(QUESTIONS)
        started = time.monotonic()
        first = None
        try:
            stream = await client.chat.completions.create(
                model="local", stream=True, max_tokens=tokens,
                messages=[{"role": "system", "content": LAB_SYSTEM}, {"role": "user", "content": question}])
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic() - started
        except openai.APIError as exc:
            errors.append(str(exc)[:80])
        if first is not None:
            ttfts.append(first)
        await asyncio.sleep(random.uniform(0.3, 0.8))
    await client.close()


async def phase(url: str, keys: list[str], seconds: float, tokens: int) -> tuple[list[float], list[str]]:
    ttfts: list[float] = []
    errors: list[str] = []
    until = time.monotonic() + seconds
    await asyncio.gather(*(student(url, key, until, tokens, ttfts, errors) for key in keys))
    return ttfts, errors


def start_batch(url: str, lines: int, tokens: int) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key=ADMIN, max_retries=0)
    requests = [{"custom_id": f"eval-{i}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "local", "max_tokens": tokens,
                          "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]}}
                for i in range(lines)]
    data = "".join(json.dumps(r) + "\n" for r in requests).encode()
    file_id = client.files.create(file=("eval.jsonl", io.BytesIO(data)), purpose="batch").id
    return client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h").id


def batch_state(url: str, batch_id: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key=ADMIN, max_retries=0).batches.retrieve(batch_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="each phase")
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=24, help="max tokens of a live answer")
    parser.add_argument("--batch-tokens", type=int, default=16, help="max tokens of a batch line's answer")
    parser.add_argument("-np", "--parallel", type=int, default=10)
    parser.add_argument("--model", default=str(gemma_model_path()))
    args = parser.parse_args()

    import fcntl

    folder = Path(tempfile.mkdtemp(prefix="kinetic-batch-"))
    keys = [f"sk-batch-student-{i}" for i in range(args.streams)]
    (folder / "keys.txt").write_text("".join(f"{key} student{i}\n" for i, key in enumerate(keys)), encoding="utf-8")
    flags = ["-c", str(2048 * args.parallel), "-np", str(args.parallel), "-a", "local",
             "--api-key-file", str(folder / "keys.txt"), "--admin-key", ADMIN, "--ledger", str(folder / "ledger.jsonl")]
    rows = []
    with open(MODEL_LOCK_PATH, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with kinetic_server(args.model, flags) as server:
            asyncio.run(phase(server.url, keys[:2], 5, args.tokens))  # warm up
            alone, errors = asyncio.run(phase(server.url, keys, args.seconds, args.tokens))
            rows.append(("alone", alone, errors, ""))
            batch_id = start_batch(server.url, args.lines, args.batch_tokens)
            began = time.monotonic()
            beside, errors = asyncio.run(phase(server.url, keys, args.seconds, args.tokens))
            done = batch_state(server.url, batch_id).request_counts
            rows.append(("beside the batch", beside, errors, f"{done.completed + done.failed} of {done.total} lines"))
            again, errors = asyncio.run(phase(server.url, keys, args.seconds, args.tokens))
            rows.append(("alone again", again, errors, ""))
            state = batch_state(server.url, batch_id)
            while state.status not in ("completed", "failed", "cancelled", "expired"):
                time.sleep(0.5)
                state = batch_state(server.url, batch_id)
            took = time.monotonic() - began
    print(f"\n{args.streams} live streams ({args.tokens} tokens an answer), -np {args.parallel}, "
          f"{args.seconds:.0f} s a phase; a {args.lines}-line batch ({args.batch_tokens} tokens a line); "
          f"CPU: {cpu()}\n")
    print(table(["phase", "requests", "errors", "TTFT p50 ms", "TTFT p95 ms", "batch"],
                [[name, len(ttfts), len(errs), f"{percentile(ttfts, 0.50) * 1000:.0f}",
                  f"{percentile(ttfts, 0.95) * 1000:.0f}", note] for name, ttfts, errs, note in rows]))
    reference = (percentile(rows[0][1], 0.95) + percentile(rows[2][1], 0.95)) / 2
    ratio = percentile(rows[1][1], 0.95) / reference
    print(f"\nlive TTFT p95 beside the batch / alone (mean of both): {ratio:.3f} "
          f"({'within' if ratio <= 1.10 else 'NOT within'} 10%)")
    print(f"the batch: {state.status}, {state.request_counts.completed} completed, {state.request_counts.failed} "
          f"failed, {took:.0f} s after it was made")


if __name__ == "__main__":
    main()
