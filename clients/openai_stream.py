"""A streamed chat through the official openai SDK: text as it arrives, time to first token, usage.

    LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required python clients/openai_stream.py
"""

import os
import time

from openai import OpenAI

# --8<-- [start:client]
client = OpenAI(base_url=os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1",
                api_key=os.environ.get("API_KEY", "no-key-required"))

start = time.perf_counter()
ttft = None
stream = client.chat.completions.create(
    model="local",
    messages=[{"role": "user", "content": "Why does a second identical request start faster?"}],
    max_tokens=40,
    stream=True,
    stream_options={"include_usage": True},  # one last chunk with usage and no choices
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:  # the first chunk only says role="assistant"
        if ttft is None:
            ttft = time.perf_counter() - start
        print(chunk.choices[0].delta.content, end="", flush=True)
    if chunk.usage:
        usage = chunk.usage
print(f"\n[first token after {ttft or 0:.2f}s, {usage.completion_tokens} tokens in "
      f"{time.perf_counter() - start:.1f}s]")
# --8<-- [end:client]
