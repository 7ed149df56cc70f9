"""Lab 04-05: send a local image to `kinetic serve` with the openai SDK, and watch what it costs.

    python see.py              the lab's picture.png
    python see.py photo.jpg    an image of your own

Three requests with the same question: without the image, with it, and with it again. The first two
show what the image adds to the prompt; the last two, what the server's cache does with a repeated image.
"""

import base64
import hashlib
import mimetypes
import os
import sys
import time
from pathlib import Path

from openai import OpenAI

BASE_URL = os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1"
API_KEY = os.environ.get("API_KEY", "no-key-required")  # your key on the class server
MAX_TOKENS = 32
QUESTION = "Describe the picture in one sentence."
PICTURE = Path(__file__).with_name("picture.png")  # the lab's image, unless you name another

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
EXTRA = {"chat_template_kwargs": {"enable_thinking": False}}  # a thinking model would spend MAX_TOKENS thinking


def data_url(path: Path) -> str:
    """The file's bytes in the URL itself: the server needs no access to your disk."""
    mime = mimetypes.guess_type(path.name)[0] or "image/png"
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()  # (1) the whole file, base64


def ask(label: str, content: str | list[dict]) -> None:
    start = time.perf_counter()
    r = client.chat.completions.create(model="local", messages=[{"role": "user", "content": content}],
                                       max_tokens=MAX_TOKENS, extra_body=EXTRA)
    elapsed = time.perf_counter() - start
    print(f"--- {label}")
    print(r.choices[0].message.content)
    u = r.usage
    print(f"[{label}: finish_reason={r.choices[0].finish_reason} prompt={u.prompt_tokens} tok, "
          f"completion={u.completion_tokens} tok, {elapsed:.1f}s]")
    t = r.model_extra["timings"]  # llama.cpp's extra field: pydantic keeps it in model_extra
    print(f"[server: cache_n={t['cache_n']} prompt_n={t['prompt_n']} prompt {t['prompt_per_second']:.1f} t/s, "
          f"generazione {t['predicted_per_second']:.1f} t/s]")


if __name__ == "__main__":
    image = Path(sys.argv[1]) if len(sys.argv) > 1 else PICTURE
    picture = [{"type": "text", "text": QUESTION},
               {"type": "image_url", "image_url": {"url": data_url(image)}}]  # (2) an image part beside the text
    digest = hashlib.sha256(image.read_bytes()).hexdigest()[:12]  # what tells two images apart: their bytes
    print(f"[image {image.name}: {image.stat().st_size / 1024:.1f} KB, sha256 {digest}]")
    ask("text only", QUESTION)
    ask("image", picture)  # (3) the same question, now with the image
    ask("image again", picture)
