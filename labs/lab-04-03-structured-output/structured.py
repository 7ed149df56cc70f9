"""Lab 04-03: JSON out of the model with the openai SDK.

    python structured.py                 json_schema from a pydantic model (client.chat.completions.parse)
    python structured.py --no-strict     the same schema sent by hand with "strict": false
    python structured.py --json-object   json_object: any JSON, no schema
    python structured.py --invalid       a schema the server cannot compile: the 400 and its message
"""

import json
import os
import sys
import time

from openai import BadRequestError, OpenAI
from pydantic import BaseModel, Field

BASE_URL = os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1"
API_KEY = os.environ.get("API_KEY", "no-key-required")  # the key of --api-key, if the server has one
MAX_TOKENS = 120
MESSAGES = [
    {"role": "system", "content": "Rispondi solo con JSON."},
    {"role": "user", "content": "Descrivi una città italiana: nome, regione, abitanti in milioni, se è sul mare."},
]
EXTRA = {"chat_template_kwargs": {"enable_thinking": False}}

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)


class Citta(BaseModel):  # (1) the schema: every field required, strings bounded so the answer ends
    nome: str = Field(max_length=24)
    regione: str = Field(max_length=24)
    abitanti_milioni: int = Field(ge=0, le=20)
    sul_mare: bool


def report(r, elapsed: float) -> None:
    """The response id, then the same two lines as lab 04-02's chat.py."""
    u, t = r.usage, r.model_extra["timings"]
    print(f"[id={r.id}]")
    print(f"[finish_reason={r.choices[0].finish_reason} prompt={u.prompt_tokens} tok, "
          f"completion={u.completion_tokens} tok, {elapsed:.1f}s]")
    print(f"[server: cache_n={t['cache_n']} prompt {t['prompt_per_second']:.1f} t/s, "
          f"generazione {t['predicted_per_second']:.1f} t/s]")


def schema() -> None:
    start = time.perf_counter()
    r = client.chat.completions.parse(model="local", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                      response_format=Citta, extra_body=EXTRA)  # (2) parse sends the schema
    elapsed = time.perf_counter() - start
    print(r.choices[0].message.content)
    print(f"[valido: {r.choices[0].message.parsed!r}]")  # (3) already a Citta object
    report(r, elapsed)


def no_strict() -> None:
    fmt = {"type": "json_schema",
           "json_schema": {"name": "Citta", "schema": Citta.model_json_schema(), "strict": False}}
    start = time.perf_counter()
    r = client.chat.completions.create(model="local", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                       response_format=fmt, extra_body=EXTRA)
    elapsed = time.perf_counter() - start
    print(r.choices[0].message.content)
    print(f"[valido: {Citta.model_validate_json(r.choices[0].message.content)!r}]")
    report(r, elapsed)


def json_object() -> None:
    start = time.perf_counter()
    r = client.chat.completions.create(model="local", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                       response_format={"type": "json_object"}, extra_body=EXTRA)
    elapsed = time.perf_counter() - start
    content = r.choices[0].message.content
    print(content)
    try:
        value = json.loads(content)
        print(f"[json: {type(value).__name__}]")
    except ValueError:
        print("[json non valido: la risposta è stata troncata da max_tokens]")
    report(r, elapsed)


def invalid() -> None:
    broken = {"type": "object", "properties": {"nome": {"type": "string"}, "abitanti": {"type": "intero"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "Rotta", "schema": broken}}  # "intero" is no JSON type
    try:
        client.chat.completions.create(model="local", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                       response_format=fmt, extra_body=EXTRA)
    except BadRequestError as e:  # the server refuses the request before generating anything
        error = e.body if isinstance(e.body, dict) else {"message": str(e.body)}
        print(f"[errore {e.status_code} param={error.get('param')}: {error.get('message')}]")


if __name__ == "__main__":
    if "--invalid" in sys.argv:
        invalid()
    elif "--json-object" in sys.argv:
        json_object()
    elif "--no-strict" in sys.argv:
        no_strict()
    else:
        schema()
