"""Lab 04-02: talk to `kinetic serve` with the official openai SDK.

    python chat.py            full response, then usage and the server's timings
    python chat.py --stream   text as it arrives, then chunks, time to first token and total
"""

import os
import sys
import time

from openai import OpenAI

BASE_URL = os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1"
API_KEY = os.environ.get("API_KEY", "no-key-required")  # the key of --api-key, e.g. "segreta123"
MAX_TOKENS = 80  # variant: 300, then compare finish_reason (length or stop)
MESSAGES = [
    {"role": "system", "content": "Rispondi in italiano, in modo breve."},
    {"role": "user", "content": "Che cos'è llama.cpp?"},
]

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)  # (1) only base_url differs from "real" OpenAI code
EXTRA = {"chat_template_kwargs": {"enable_thinking": False}}  # (2) fields OpenAI does not know


def full() -> None:
    start = time.perf_counter()
    r = client.chat.completions.create(model="local", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                       extra_body=EXTRA)  # (3) model is ignored by a one-model server
    elapsed = time.perf_counter() - start
    print(r.choices[0].message.content)
    print()
    u = r.usage
    print(f"[finish_reason={r.choices[0].finish_reason} prompt={u.prompt_tokens} tok, "
          f"completion={u.completion_tokens} tok, {elapsed:.1f}s]")
    t = r.model_extra["timings"]  # not in the SDK's data model: pydantic keeps it in model_extra
    print(f"[server: cache_n={t['cache_n']} prompt {t['prompt_per_second']:.1f} t/s, "
          f"generazione {t['predicted_per_second']:.1f} t/s]")


def stream() -> None:
    start = time.perf_counter()
    first = None
    chunks = 0
    for chunk in client.chat.completions.create(model="local", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                extra_body=EXTRA, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning = (delta.model_extra or {}).get("reasoning_content")  # only when thinking is on
        if reasoning:
            print(reasoning, end="", flush=True)
        if delta.content:  # the first chunk has role="assistant" and content=None
            if first is None:
                first = time.perf_counter() - start  # time to first token (TTFT)
            chunks += 1
            print(delta.content, end="", flush=True)
    total = time.perf_counter() - start
    print()
    print(f"[{chunks} chunk, primo token dopo {first or 0:.2f}s, totale {total:.1f}s]")


if __name__ == "__main__":
    if "--stream" in sys.argv:
        stream()
    else:
        full()
