"""One chat request through the official openai SDK: the answer, usage and llama.cpp's timings.

    LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required python clients/openai_chat.py
"""

import os

from openai import OpenAI

# --8<-- [start:client]
client = OpenAI(base_url=os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1",
                api_key=os.environ.get("API_KEY", "no-key-required"))  # the SDK refuses an empty key

r = client.chat.completions.create(
    model="local",  # a one-model server answers with its own name (the -a alias)
    messages=[{"role": "user", "content": "Name three uses of a local LLM server."}],
    max_tokens=40,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},  # fields OpenAI does not know
)
print(r.choices[0].message.content)
print(f"[finish_reason={r.choices[0].finish_reason} prompt={r.usage.prompt_tokens} "
      f"completion={r.usage.completion_tokens}]")
timings = r.model_extra["timings"]  # llama.cpp's extra field: pydantic keeps it in model_extra
print(f"[timings: cache_n={timings['cache_n']} {timings['predicted_per_second']:.1f} t/s]")
# --8<-- [end:client]
