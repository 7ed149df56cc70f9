"""A local image through the official openai SDK: sent inside the request as a data: URL, answered with usage
and llama.cpp's timings. The server's model must read images (`kinetic serve -hf ggml-org/Qwen3.5-0.8B-GGUF`
fetches its projector; `-mm MMPROJ.gguf` loads one).

    LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required python clients/openai_image.py [IMAGE]
"""

import base64
import mimetypes
import os
import sys
from pathlib import Path

from openai import OpenAI

LAB_PICTURE = Path(__file__).resolve().parents[1] / "labs" / "lab-04-05-images" / "picture.png"

# --8<-- [start:client]
image = Path(sys.argv[1]) if len(sys.argv) > 1 else LAB_PICTURE
mime = mimetypes.guess_type(image.name)[0] or "image/png"
url = f"data:{mime};base64," + base64.b64encode(image.read_bytes()).decode()  # the file itself, no upload

client = OpenAI(base_url=os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1",
                api_key=os.environ.get("API_KEY", "no-key-required"))
r = client.chat.completions.create(
    model="local",
    messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": url}},  # the image goes where its part stands
    ]}],
    max_tokens=40,
    extra_body={"chat_template_kwargs": {"enable_thinking": False}},
)
print(r.choices[0].message.content)
# the image's embeddings are prompt tokens: usage and timings count them
print(f"[finish_reason={r.choices[0].finish_reason} prompt={r.usage.prompt_tokens} "
      f"completion={r.usage.completion_tokens}]")
timings = r.model_extra["timings"]
print(f"[timings: cache_n={timings['cache_n']} prompt_n={timings['prompt_n']} "
      f"{timings['predicted_per_second']:.1f} t/s]")
# --8<-- [end:client]
