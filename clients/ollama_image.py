"""A local image through the official ollama Python client's `images` (/api/chat). The server's model must
read images: /api/show lists `vision` among its capabilities.

    LLAMA_URL=http://127.0.0.1:8080 API_KEY=no-key-required python clients/ollama_image.py [IMAGE]
"""

import os
import sys
from pathlib import Path

from ollama import Client

LAB_PICTURE = Path(__file__).resolve().parents[1] / "labs" / "lab-04-05-images" / "picture.png"

# --8<-- [start:client]
image = Path(sys.argv[1]) if len(sys.argv) > 1 else LAB_PICTURE
client = Client(host=os.environ.get("LLAMA_URL", "http://127.0.0.1:8080"),
                headers={"Authorization": f"Bearer {os.environ.get('API_KEY', 'no-key-required')}"})
model = client.list().models[0].model
print(f"[capabilities: {', '.join(client.show(model).capabilities or [])}]")

# `images` takes paths, bytes or base64 strings: the client sends each file base64-encoded
r = client.chat(model=model, messages=[{"role": "user", "content": "What is in this picture?", "images": [image]}],
                options={"num_predict": 40})
print(r.message.content)
print(f"[done_reason={r.done_reason} prompt_eval_count={r.prompt_eval_count} eval_count={r.eval_count}]")
# --8<-- [end:client]
