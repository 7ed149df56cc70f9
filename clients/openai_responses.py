"""OpenAI's Responses API (/v1/responses), which the openai SDK 3.x steers new code to.

    LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required python clients/openai_responses.py
"""

import os

from openai import OpenAI

# --8<-- [start:full]
client = OpenAI(base_url=os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1",
                api_key=os.environ.get("API_KEY", "no-key-required"))

r = client.responses.create(model="local", instructions="Answer briefly.", input="What is a KV cache?",
                            max_output_tokens=40)
print(r.output_text)
print(f"[status={r.status} input={r.usage.input_tokens} output={r.usage.output_tokens}]")
# --8<-- [end:full]

# --8<-- [start:stream]
with client.responses.stream(model="local", input="What is a KV cache?", max_output_tokens=40) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":  # typed events, one per text piece
            print(event.delta, end="", flush=True)
    final = stream.get_final_response()
print(f"\n[streamed: output={final.usage.output_tokens}]")
# --8<-- [end:stream]
