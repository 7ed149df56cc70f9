"""Ollama's API (/api/chat) through the official ollama Python client, full and streamed.

    LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required python clients/ollama_chat.py
"""

import os

from ollama import Client

# --8<-- [start:full]
# The ollama client talks to the server's root; kinetic answers /api/* as Ollama does. The model
# name must be the one the server serves (`kinetic serve -a NAME`, or what /api/tags lists).
client = Client(host=os.environ.get("LLAMA_URL", "http://127.0.0.1:8080"),
                headers={"Authorization": f"Bearer {os.environ.get('API_KEY', 'no-key-required')}"})
model = client.list().models[0].model

messages = [{"role": "user", "content": "What is a KV cache?"}]
r = client.chat(model=model, messages=messages, options={"num_predict": 40})
print(r.message.content)
print(f"[done_reason={r.done_reason} prompt_eval_count={r.prompt_eval_count} eval_count={r.eval_count} "
      f"{r.eval_count / (r.eval_duration / 1e9):.1f} t/s]")  # durations are in nanoseconds
# --8<-- [end:full]

# --8<-- [start:stream]
for part in client.chat(model=model, messages=messages, options={"num_predict": 40}, stream=True):
    print(part.message.content, end="", flush=True)
    if part.done:  # the last line carries the counts
        print(f"\n[streamed: eval_count={part.eval_count}]")
# --8<-- [end:stream]
