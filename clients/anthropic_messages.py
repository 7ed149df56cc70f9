"""The Anthropic Messages API (/v1/messages) through the official anthropic SDK, full and streamed.

    LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required python clients/anthropic_messages.py
"""

import os

from anthropic import Anthropic

# --8<-- [start:full]
# No /v1 here: the SDK adds /v1/messages itself. It sends the key as x-api-key, which kinetic accepts.
client = Anthropic(base_url=os.environ.get("LLAMA_URL", "http://127.0.0.1:8080"),
                   api_key=os.environ.get("API_KEY", "no-key-required"))

messages = [{"role": "user", "content": "What is a KV cache?"}]
r = client.messages.create(model="local", max_tokens=40, system="Answer briefly.", messages=messages)
print("".join(block.text for block in r.content if block.type == "text"))
print(f"[stop_reason={r.stop_reason} input={r.usage.input_tokens} output={r.usage.output_tokens}]")
# --8<-- [end:full]

# --8<-- [start:stream]
with client.messages.stream(model="local", max_tokens=40, messages=messages) as stream:  # max_tokens is required
    for text in stream.text_stream:
        print(text, end="", flush=True)
    final = stream.get_final_message()
print(f"\n[streamed: stop_reason={final.stop_reason} output={final.usage.output_tokens}]")
# --8<-- [end:stream]
