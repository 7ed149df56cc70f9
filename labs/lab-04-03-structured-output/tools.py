"""Lab 04-03: tool calls with the openai SDK.

    python tools.py            a forced call to `meteo`, run it here, send the result back (tool_call_id)
    python tools.py --auto     tool_choice "auto": the model decides, finish_reason says what it did
    python tools.py --stream   the forced call streamed: the arguments arrive in pieces
"""

import json
import os
import sys
import time

from openai import OpenAI

BASE_URL = os.environ.get("LLAMA_URL", "http://127.0.0.1:8080") + "/v1"
API_KEY = os.environ.get("API_KEY", "no-key-required")  # the key of --api-key, if the server has one
MAX_TOKENS = 60
MESSAGES = [{"role": "user", "content": "Che tempo fa a Roma?"}]
EXTRA = {"chat_template_kwargs": {"enable_thinking": False}}
TOOLS = [{
    "type": "function",
    "function": {
        "name": "meteo",
        "description": "Il meteo di oggi in una città italiana",
        "parameters": {"type": "object", "properties": {"citta": {"type": "string", "maxLength": 24}},
                       "required": ["citta"], "additionalProperties": False},
    },
}]
FORCED = {"type": "function", "function": {"name": "meteo"}}  # (1) the server must call meteo

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)


def meteo(citta: str) -> dict:
    """The tool itself runs here, in the client: the model only asks for it."""
    return {"citta": citta, "temperatura": 21, "cielo": "sereno"}


def report(r, elapsed: float) -> None:
    """The response id, then the same two lines as lab 04-02's chat.py."""
    u, t = r.usage, r.model_extra["timings"]
    print(f"[id={r.id}]")
    print(f"[finish_reason={r.choices[0].finish_reason} prompt={u.prompt_tokens} tok, "
          f"completion={u.completion_tokens} tok, {elapsed:.1f}s]")
    print(f"[server: cache_n={t['cache_n']} prompt {t['prompt_per_second']:.1f} t/s, "
          f"generazione {t['predicted_per_second']:.1f} t/s]")


def ask(messages: list, tool_choice) -> object:
    start = time.perf_counter()
    r = client.chat.completions.create(model="local", messages=messages, max_tokens=MAX_TOKENS, tools=TOOLS,
                                       tool_choice=tool_choice, extra_body=EXTRA)
    message = r.choices[0].message
    if message.content:
        print(message.content)
    for call in message.tool_calls or []:
        print(f"[tool_call id={call.id} nome={call.function.name} argomenti={call.function.arguments}]")
    report(r, time.perf_counter() - start)
    return r


def round_trip() -> None:
    r = ask(MESSAGES, FORCED)
    call = r.choices[0].message.tool_calls[0]
    result = meteo(**json.loads(call.function.arguments))  # (2) run the tool with the model's arguments
    messages = MESSAGES + [
        r.choices[0].message.model_dump(exclude_none=True),  # the assistant's turn, with its tool_calls
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},  # (3) the same id
    ]
    print(f"[risultato inviato con tool_call_id={call.id}: {json.dumps(result)}]")
    ask(messages, "none")  # the answer that reads the result: no second call


def auto() -> None:
    r = ask(MESSAGES, "auto")
    print(f"[tool_calls: {len(r.choices[0].message.tool_calls or [])}]")


def stream() -> None:
    start = time.perf_counter()
    first = None
    chunks = 0
    finish = None
    for chunk in client.chat.completions.create(model="local", messages=MESSAGES, max_tokens=MAX_TOKENS,
                                                tools=TOOLS, tool_choice=FORCED, extra_body=EXTRA, stream=True):
        if not chunk.choices:
            continue
        finish = chunk.choices[0].finish_reason or finish
        for delta in chunk.choices[0].delta.tool_calls or []:
            if first is None:
                first = time.perf_counter() - start
            chunks += 1
            if delta.id:  # the first piece of a call carries its id and name
                print(f"[tool_call id={delta.id} nome={delta.function.name}]")
            print(delta.function.arguments or "", end="", flush=True)
    total = time.perf_counter() - start
    print()
    print(f"[{chunks} chunk, primo token dopo {first or 0:.2f}s, totale {total:.1f}s, finish_reason={finish}]")


if __name__ == "__main__":
    if "--auto" in sys.argv:
        auto()
    elif "--stream" in sys.argv:
        stream()
    else:
        round_trip()
