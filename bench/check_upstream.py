"""kinetic in front of a real llama-server still serves every protocol, whole and streamed.

Starts llama-server (built from the vendored llama.cpp: shared/peer/build_llama_server.sh, with
--no-repack on an AMX CPU) on the bundled Gemma, then a keyed `kinetic serve --upstream NAME=URL
--ledger FILE` in front of it, and calls every generation route through kinetic with the real
clients: the openai SDK (chat completions, completions, responses, embeddings), the anthropic SDK
(messages), the ollama client (chat, generate) and httpx (llama-server's /completion, and
/v1/chat/completions read line by line). For each call, whole and streamed, it checks what the
client was told (an id where the protocol has one, usage, a finish reason, some text) and that the
ledger recorded the call with the same counts. CI has no llama-server, so this is a script, not a
test; `--upstream-kind kinetic` runs the same check against a kinetic upstream.

    python bench/check_upstream.py [--llama-server PATH] [--upstream-kind llama-server|kinetic]

It holds the machine's model lock while it runs. Exits 1 when any call failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import Server, kinetic_server, llama_server, table  # noqa: E402

from kinetic.backends.bundled import gemma_model_path  # noqa: E402
from kinetic.classroom.ledger import LedgerRecord, read_ledger  # noqa: E402
from kinetic.server.launch import model_lock  # noqa: E402

KEY, NAME = "sk-check-upstream", "checker"
MODEL, UPSTREAM_ID = "class", "gemma-up"
MAX = 8
ASK = [{"role": "user", "content": "What is the capital of Italy?"}]
PROMPT = "Once upon a time"
# OpenAI's and Ollama's, Anthropic's, Responses' (status or incomplete reason), llama-server's stop_type
FINISHES = {"stop", "length", "end_turn", "max_tokens", "completed", "max_output_tokens", "eos", "limit", "word"}


LENGTH = {"length", "max_tokens", "max_output_tokens", "limit"}  # each protocol's "the limit stopped it"
# llama-server names a /v1/completions answer chatcmpl- too (gen_chatcmplid), and kinetic follows it
ID_PREFIX = {"/v1/chat/completions": "chatcmpl-", "/v1/completions": "chatcmpl-", "/v1/responses": "resp_",
             "/v1/messages": "msg_"}


class CheckFailed(Exception):
    pass


@dataclass
class Told:
    """What the client was told: the response's id (None where the protocol has none), its counts of
    prompt and answer tokens (the prompt's cached ones included), why it ended, and its text."""

    id: str | None
    prompt: int
    completion: int
    finish: str | None
    text: str
    chunks: int | None = None  # text pieces a stream carried


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise CheckFailed(what)


# --------------------------------------------------------------------------- the calls, by client


def openai_chat(oai: openai.OpenAI, stream: bool) -> Told:
    if not stream:
        whole = oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX, temperature=0)  # type: ignore[arg-type]
        expect(whole.usage is not None, "no usage")
        assert whole.usage is not None
        return Told(whole.id, whole.usage.prompt_tokens, whole.usage.completion_tokens,
                    whole.choices[0].finish_reason, whole.choices[0].message.content or "")
    chunks = list(oai.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX, temperature=0,  # type: ignore[call-overload]
                                              stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    expect(usage is not None, "no usage in the last chunk")
    assert usage is not None
    expect(len({c.id for c in chunks}) == 1, "chunks carry different ids")
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    finish = next((c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), None)
    return Told(chunks[0].id, usage.prompt_tokens, usage.completion_tokens, finish, "".join(pieces), len(pieces))


def openai_completions(oai: openai.OpenAI, stream: bool) -> Told:
    if not stream:
        whole = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX, temperature=0)
        expect(whole.usage is not None, "no usage")
        assert whole.usage is not None
        return Told(whole.id, whole.usage.prompt_tokens, whole.usage.completion_tokens,
                    whole.choices[0].finish_reason, whole.choices[0].text)
    chunks = list(oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    usage = next((c.usage for c in chunks if c.usage), None)
    expect(usage is not None, "no usage chunk")
    assert usage is not None
    pieces = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    finish = next((c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), None)
    return Told(chunks[0].id, usage.prompt_tokens, usage.completion_tokens, finish, "".join(pieces), len(pieces))


def openai_responses(oai: openai.OpenAI, stream: bool) -> Told:
    if not stream:
        whole = oai.responses.create(model=MODEL, input="Say hi.", max_output_tokens=MAX, temperature=0)
        events = None
    else:
        with oai.responses.stream(model=MODEL, input="Say hi.", max_output_tokens=MAX, temperature=0) as running:
            events = list(running)
            whole = running.get_final_response()
        expect(events[0].type == "response.created" and events[-1].type in ("response.completed",
                                                                            "response.incomplete"),
               f"events run {events[0].type} .. {events[-1].type}")
    expect(whole.usage is not None, "no usage")
    assert whole.usage is not None
    finish = whole.incomplete_details.reason if whole.incomplete_details else whole.status
    chunks = None if events is None else sum(1 for e in events if e.type == "response.output_text.delta" and e.delta)
    return Told(whole.id, whole.usage.input_tokens, whole.usage.output_tokens, finish, whole.output_text, chunks)


def anthropic_messages(client: anthropic.Anthropic, stream: bool) -> Told:
    greedy = {"temperature": 0}
    if not stream:
        whole = client.messages.create(model=MODEL, max_tokens=MAX, messages=ASK, extra_body=greedy)  # type: ignore[arg-type]
        chunks = None
    else:
        with client.messages.stream(model=MODEL, max_tokens=MAX, messages=ASK, extra_body=greedy) as running:  # type: ignore[arg-type]
            events = list(running)
            whole = running.get_final_message()
        expect(events[0].type == "message_start" and events[-1].type == "message_stop",
               f"events run {events[0].type} .. {events[-1].type}")
        chunks = sum(1 for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"
                     and e.delta.text)
    cached = whole.usage.cache_read_input_tokens or 0
    text = "".join(block.text for block in whole.content if block.type == "text")
    return Told(whole.id, whole.usage.input_tokens + cached, whole.usage.output_tokens, whole.stop_reason, text,
                chunks)


def ollama_chat(client: ollama.Client, stream: bool) -> Told:
    options = {"num_predict": MAX, "temperature": 0}
    if not stream:
        whole = client.chat(model=MODEL, messages=ASK, options=options)
        return Told(None, whole.prompt_eval_count or 0, whole.eval_count or 0, whole.done_reason,
                    whole.message.content or "")
    parts = list(client.chat(model=MODEL, messages=ASK, options=options, stream=True))
    expect(bool(parts) and parts[-1].done is True, "the stream's last line is not done")
    pieces = [p.message.content for p in parts if p.message.content]
    last = parts[-1]
    return Told(None, last.prompt_eval_count or 0, last.eval_count or 0, last.done_reason, "".join(pieces), len(pieces))


def ollama_generate(client: ollama.Client, stream: bool) -> Told:
    options = {"num_predict": MAX, "temperature": 0}
    if not stream:
        whole = client.generate(model=MODEL, prompt=PROMPT, options=options)
        return Told(None, whole.prompt_eval_count or 0, whole.eval_count or 0, whole.done_reason, whole.response or "")
    parts = list(client.generate(model=MODEL, prompt=PROMPT, options=options, stream=True))
    expect(bool(parts) and parts[-1].done is True, "the stream's last line is not done")
    pieces = [p.response for p in parts if p.response]
    last = parts[-1]
    return Told(None, last.prompt_eval_count or 0, last.eval_count or 0, last.done_reason, "".join(pieces), len(pieces))


def sse_frames(response: httpx.Response) -> tuple[list[dict[str, Any]], bool]:
    """The JSON frames of a stream, and whether it ended with `data: [DONE]`."""
    frames, done = [], False
    for line in response.iter_lines():
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            frames.append(json.loads(line[6:]))
    return frames, done


def native_completion(http: httpx.Client, stream: bool) -> Told:
    body = {"model": MODEL, "prompt": PROMPT, "n_predict": MAX, "temperature": 0}
    if not stream:
        response = http.post("/completion", json=body)
        expect(response.status_code == 200, f"HTTP {response.status_code}: {response.text[:200]}")
        whole = response.json()
        expect(isinstance(whole.get("timings"), dict), "no timings")
        return Told(None, whole["tokens_evaluated"], whole["tokens_predicted"], whole.get("stop_type"),
                    whole["content"])
    with http.stream("POST", "/completion", json={**body, "stream": True}) as response:
        expect(response.status_code == 200, f"HTTP {response.status_code}")
        frames, _ = sse_frames(response)
    final = frames[-1]
    expect(final.get("stop") is True and isinstance(final.get("timings"), dict), "the last frame has no stop/timings")
    pieces = [f["content"] for f in frames if f.get("content")]
    return Told(None, final["tokens_evaluated"], final["tokens_predicted"], final.get("stop_type"), "".join(pieces),
                len(pieces))


def raw_chat(http: httpx.Client, stream: bool) -> Told:
    body = {"model": MODEL, "messages": ASK, "max_tokens": MAX, "temperature": 0}
    if not stream:
        response = http.post("/v1/chat/completions", json=body)
        expect(response.status_code == 200, f"HTTP {response.status_code}: {response.text[:200]}")
        whole = response.json()
        expect(isinstance(whole.get("timings"), dict), "no timings")
        return Told(whole["id"], whole["usage"]["prompt_tokens"], whole["usage"]["completion_tokens"],
                    whole["choices"][0]["finish_reason"], whole["choices"][0]["message"]["content"] or "")
    # usage only when asked for, as llama-server does (its timings come regardless)
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=streamed) as response:
        expect(response.status_code == 200, f"HTTP {response.status_code}")
        frames, done = sse_frames(response)
    expect(done, "no data: [DONE]")
    final = frames[-1]
    expect(bool(final.get("usage")) and isinstance(final.get("timings"), dict), "the last chunk has no usage/timings")
    pieces = [c["choices"][0]["delta"]["content"] for c in frames
              if c.get("choices") and c["choices"][0].get("delta", {}).get("content")]
    finish = next((c["choices"][0]["finish_reason"] for c in frames
                   if c.get("choices") and c["choices"][0].get("finish_reason")), None)
    return Told(frames[0]["id"], final["usage"]["prompt_tokens"], final["usage"]["completion_tokens"], finish,
                "".join(pieces), len(pieces))


# --------------------------------------------------------------------------- checking a call


def ledger_line(ledger: Path, route: str, stream: bool, told: Told, seen: int) -> LedgerRecord:
    """The call's line: by id where the protocol has one, else the first new line on its route."""
    deadline = time.monotonic() + 10  # the line is written as the answer ends: a moment after the client has it
    while time.monotonic() < deadline:
        records = read_ledger(ledger)[seen:]
        found = [r for r in records if (r.id == told.id if told.id else r.route == route and r.stream == stream)]
        if found:
            return found[-1]
        time.sleep(0.05)
    raise CheckFailed(f"no ledger line for {route} (id {told.id})")


def check_call(call: Callable[[bool], Told], route: str, stream: bool, ledger: Path) -> str:
    seen = len(read_ledger(ledger))
    try:
        told = call(stream)
        expect(told.text.strip() != "", "no text")
        expect(told.prompt > 0 and told.completion > 0, f"usage {told.prompt}/{told.completion}")
        expect(told.finish in FINISHES, f"finish {told.finish!r}")
        expect((told.completion >= MAX) == (told.finish in LENGTH), f"{told.completion} tokens, finish {told.finish}")
        expect(told.id is None or told.id.startswith(ID_PREFIX[route]), f"id {told.id!r}")
        record = ledger_line(ledger, route, stream, told, seen)
        expect(record.status == 200 and record.error is None, f"ledger status {record.status} {record.error}")
        expect(record.client == NAME and record.stream == stream,
               f"ledger client {record.client} stream {record.stream}")
        expect((record.prompt_tokens, record.completion_tokens) == (told.prompt, told.completion),
               f"ledger {record.prompt_tokens}/{record.completion_tokens}, client {told.prompt}/{told.completion}")
        expect(told.chunks is None or record.chunks == told.chunks,
               f"ledger chunks {record.chunks}, client {told.chunks}")
        expect(record.finish_reason == told.finish, f"ledger finish {record.finish_reason}, client {told.finish}")
        expect(record.timings is not None and record.timings.get("predicted_n") == told.completion,
               f"ledger timings {record.timings}")
    except CheckFailed as exc:
        return f"FAIL: {exc}"
    except Exception as exc:  # an SDK's own error says what the server answered: report it, go on
        return f"FAIL: {type(exc).__name__}: {str(exc)[:160]}"
    return "ok"


def check_embeddings(embed: Callable[[], tuple[int, int]], route: str, ledger: Path) -> str:
    """`embed` returns how many vectors came back (of two inputs) and the prompt tokens it was told."""
    seen = len(read_ledger(ledger))
    try:
        vectors, prompt = embed()
        expect(vectors == 2 and prompt > 0, f"{vectors} vectors, {prompt} prompt tokens")
        record = ledger_line(ledger, route, False, Told(None, 0, 0, None, ""), seen)
        expect(record.status == 200 and record.prompt_tokens == prompt,
               f"ledger {record.status} {record.prompt_tokens}, client {prompt}")
    except CheckFailed as exc:
        return f"FAIL: {exc}"
    except Exception as exc:
        return f"FAIL: {type(exc).__name__}: {str(exc)[:160]}"
    return "ok"


def openai_embed(oai: openai.OpenAI) -> tuple[int, int]:
    got = oai.embeddings.create(model=MODEL, input=["one cat", "two dogs"])
    return sum(1 for d in got.data if d.embedding), got.usage.prompt_tokens


def ollama_embed(client: ollama.Client) -> tuple[int, int]:
    got = client.embed(model=MODEL, input=["one cat", "two dogs"])
    return sum(1 for v in got.embeddings if v), got.prompt_eval_count or 0


# --------------------------------------------------------------------------- the run


def the_upstream(args: argparse.Namespace) -> Server:
    flags = ["-t", "2", "-np", "2", "-c", "4096", "-a", UPSTREAM_ID, "--embeddings"]
    if args.upstream_kind == "kinetic":
        return kinetic_server(args.model, flags)
    # the bundled Gemma's GGUF says pooling none, which llama-server refuses for embeddings: mean is
    # what kinetic uses for a decoder model; llama-server keeps serving chat beside it
    server = llama_server(args.llama_server, args.model, [*flags, "--pooling", "mean", "--no-repack"])
    if server is None:
        raise SystemExit("no llama-server: build it with shared/peer/build_llama_server.sh or pass --llama-server")
    return server


def run_checks(url: str, ledger: Path) -> list[list[str]]:
    oai = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    claude = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=120)
    llama = ollama.Client(host=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    calls: list[tuple[str, str, Callable[[bool], Told]]] = [
        ("openai chat.completions", "/v1/chat/completions", lambda s: openai_chat(oai, s)),
        ("openai completions", "/v1/completions", lambda s: openai_completions(oai, s)),
        ("openai responses", "/v1/responses", lambda s: openai_responses(oai, s)),
        ("anthropic messages", "/v1/messages", lambda s: anthropic_messages(claude, s)),
        ("ollama chat", "/api/chat", lambda s: ollama_chat(llama, s)),
        ("ollama generate", "/api/generate", lambda s: ollama_generate(llama, s)),
        ("httpx /completion", "/completion", lambda s: native_completion(http, s)),
        ("httpx /v1/chat/completions", "/v1/chat/completions", lambda s: raw_chat(http, s)),
    ]
    rows = [[label, check_call(call, route, False, ledger), check_call(call, route, True, ledger)]
            for label, route, call in calls]
    rows.append(["openai embeddings", check_embeddings(lambda: openai_embed(oai), "/v1/embeddings", ledger),
                 "(not streamed)"])
    rows.append(["ollama embed", check_embeddings(lambda: ollama_embed(llama), "/api/embed", ledger), "(not streamed)"])
    http.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream-kind", choices=("llama-server", "kinetic"), default="llama-server")
    parser.add_argument("--llama-server", help="the llama-server binary (default: PATH, /tmp/lsbuild/bin)")
    parser.add_argument("--model", default=str(gemma_model_path()))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="check-upstream-"))
    (folder / "keys.txt").write_text(f"{KEY} {NAME}\n", encoding="utf-8")
    ledger = folder / "ledger.jsonl"
    with model_lock(), the_upstream(args) as upstream:
        router = Server("kinetic", [sys.executable, "-m", "kinetic", "serve", "--api-key-file",
                                    str(folder / "keys.txt"), "--ledger", str(ledger), "-np", "2",
                                    "--upstream", f"{MODEL}={upstream.url},model={UPSTREAM_ID}"])
        with router:
            rows = run_checks(router.url, ledger)
    print(f"\nkinetic --upstream in front of {args.upstream_kind} ({upstream.command[0]}), bundled Gemma, "
          f"{MAX} tokens an answer, ledger {ledger}\n")
    print(table(["route (client)", "whole", "streamed"], rows))
    failed = sum(cell.startswith("FAIL") for row in rows for cell in row[1:])
    print(f"\n{failed} failed" if failed else "\nall ok")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
