"""Lab 04-01 (kinetic serve and its routes, with curl): what `kinetic grade lab-04-01` checks.

The outputs are JSON objects the server answered, found wherever they are pasted (one line or
pretty-printed, fenced or not): `/health`'s, `/props`'s and two chat completions. Only the answer
to the question is found by its heading or label.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from kinetic.grading import Context, Failure, Fingerprint, Lab, Skip, Unchecked
from kinetic.grading.deliverable import Deliverable
from kinetic.grading.ledger_view import Record, author_ledger, describe_record

lab = Lab("lab-04-01", "kinetic serve and its routes", deliverable_min_outputs=2, copy_weight=3, copy_points=1)

REQUEST = json.loads((Path(__file__).parent / "request.json").read_text(encoding="utf-8"))
LISTENING_RE = re.compile(r"listening on (https?://\S+)")
ANSWER_HEADING = re.compile(r"cache_n|why|perch|answer|risposta|domanda|question", re.I)
OUTPUT_HEADING = re.compile(r"curl|health|props|completion|again|di nuovo|start|avvi", re.I)
CACHE_TERMS = re.compile(r"cache|kv", re.I)
PROMPT_TERMS = re.compile(r"prompt|prefi|token", re.I)
# Each speed is its count over its time; the server rounds nothing, so the pasted JSON agrees to the
# last digits. Generation speed over n - 1 steps is kinetic's (the first token comes out of the
# prompt's batch); over n tokens is llama-server's: both are accepted.
REL_TOLERANCE = 1e-6
MIN_REUSE = 0.5  # the repeat reuses at least half of the prompt (in practice all but one token)


def _is_completion(obj: dict[str, Any]) -> bool:
    return obj.get("object") == "chat.completion" and isinstance(obj.get("timings"), dict)


def _is_props(obj: dict[str, Any]) -> bool:
    return "total_slots" in obj or "default_generation_settings" in obj


def completions(deliverable: Deliverable) -> list[dict[str, Any]]:
    return [o for o in deliverable.json_objects() if _is_completion(o)]


def props(deliverable: Deliverable) -> dict[str, Any] | None:
    return next((o for o in deliverable.json_objects() if _is_props(o)), None)


def health(deliverable: Deliverable) -> dict[str, Any] | None:
    return next((o for o in deliverable.json_objects() if set(o) == {"status"} or
                 (isinstance(o.get("error"), dict) and o["error"].get("code") == 503)), None)


def answer(deliverable: Deliverable) -> list[str] | None:
    found = [s for s in deliverable.sections
             if ANSWER_HEADING.search(s.heading) and not OUTPUT_HEADING.search(s.heading)]
    return found[-1].prose if found else None


@lab.outputs_found
def count_outputs(deliverable: Deliverable) -> int:
    return sum(map(bool, (LISTENING_RE.search(deliverable.text), health(deliverable), props(deliverable),
                          completions(deliverable), answer(deliverable))))


@lab.fingerprints
def fingerprints(ctx: Context) -> list[Fingerprint]:
    prints = []
    for completion in completions(ctx.deliverable):
        prints.append(Fingerprint(f"the id {completion.get('id')}", str(completion.get("id")), 3))
        prints.append(Fingerprint("a prompt_ms", repr(completion["timings"].get("prompt_ms")), 2))
    return prints


def _two(ctx: Context) -> list[dict[str, Any]]:
    found = completions(ctx.deliverable)
    if not found:
        raise Skip("no chat completion is pasted (see outputs_present)")
    return found


@lab.check(points=2)
def outputs_present(ctx: Context) -> None:
    """lab-04-01.md holds every output: the listening line, /health, /props, two chat completions and the answer."""
    d = ctx.deliverable
    missing = []
    if not LISTENING_RE.search(d.text):
        missing.append("the 'listening on http://...' line")
    if health(d) is None:
        missing.append("the JSON of /health")
    if props(d) is None:
        missing.append("the JSON of /props")
    count = len(completions(d))
    if count < 2:
        missing.append(f"two chat completions (found {count})")
    if not answer(d):
        missing.append("the answer (under a heading such as 'Why did cache_n grow')")
    if missing:
        raise Failure("missing: " + "; ".join(missing), "paste each whole output as curl printed it, under the "
                      "template's headings")


@lab.check()
def health_ok(ctx: Context) -> None:
    """/health answered {"status":"ok"}: the model was loaded."""
    found = health(ctx.deliverable)
    if found is None:
        raise Skip("no /health output (see outputs_present)")
    if found != {"status": "ok"}:
        raise Failure(f"/health answered {json.dumps(found)}: the model was still loading",
                      "wait for 'listening on' before calling /health, then paste its answer")


@lab.check()
def props_read(ctx: Context) -> str:
    """/props names its slots, their context and the model, and is the server that answered the completions."""
    found = props(ctx.deliverable)
    if found is None:
        raise Skip("no /props output (see outputs_present)")
    slots = found.get("total_slots")
    n_ctx = (found.get("default_generation_settings") or {}).get("n_ctx")
    if not isinstance(slots, int) or slots < 1 or not isinstance(n_ctx, int) or n_ctx < 1:
        raise Failure(f"total_slots={slots!r} and n_ctx={n_ctx!r} are not a server's",
                      "paste the whole output of /props")
    alias = found.get("model_alias")
    models = {c.get("model") for c in completions(ctx.deliverable)}
    if alias and models and models != {alias}:
        raise Failure(f"/props serves {alias!r} but the completions come from {', '.join(sorted(map(str, models)))}",
                      "paste the outputs of one server")
    return f"{slots} slot(s) of {n_ctx} tokens, model {alias}"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=1e-9)


def completion_problem(completion: dict[str, Any]) -> str | None:
    """Why one completion's numbers do not agree with each other, or None."""
    usage, t = completion.get("usage") or {}, completion["timings"]
    try:
        prompt_n, cache_n, predicted_n = int(t["prompt_n"]), int(t["cache_n"]), int(t["predicted_n"])
        prompt_ms, predicted_ms = float(t["prompt_ms"]), float(t["predicted_ms"])
        prompt_tps, predicted_tps = float(t["prompt_per_second"]), float(t["predicted_per_second"])
    except (KeyError, TypeError, ValueError) as exc:
        return f"timings lacks {exc}"
    if usage.get("completion_tokens") != predicted_n:
        return f"completion_tokens={usage.get('completion_tokens')} but timings.predicted_n={predicted_n}"
    if usage.get("prompt_tokens") != prompt_n + cache_n:
        return f"prompt_tokens={usage.get('prompt_tokens')} but prompt_n + cache_n = {prompt_n + cache_n}"
    if not 1 <= predicted_n <= REQUEST["max_tokens"]:
        return f"predicted_n={predicted_n}: request.json asks for 1 to {REQUEST['max_tokens']} tokens"
    if prompt_ms > 0 and not _close(prompt_tps, 1000 * prompt_n / prompt_ms):
        return f"prompt_per_second={prompt_tps} is not prompt_n / prompt_ms = {1000 * prompt_n / prompt_ms}"
    speeds = [1000 * n / predicted_ms for n in (predicted_n - 1, predicted_n)] if predicted_ms > 0 else [0.0]
    if not any(_close(predicted_tps, s) for s in speeds):
        return f"predicted_per_second={predicted_tps} is not predicted_n / predicted_ms"
    return None


@lab.check(points=2)
def completion_numbers_agree(ctx: Context) -> None:
    """each completion's usage and timings agree with each other to the last digit, as the server computes them."""
    for completion in _two(ctx):
        problem = completion_problem(completion)
        if problem:
            raise Failure(f"{completion.get('id', 'a completion')}: {problem}",
                          "paste the server's JSON as curl printed it, without editing a number")


@lab.check(points=2)
def cache_grew(ctx: Context) -> str:
    """the second completion is a new request that reused the first one's prompt: cache_n grew."""
    found = _two(ctx)
    if len(found) < 2:
        raise Skip("only one chat completion is pasted (see outputs_present)")
    first, second = found[0], found[1]
    if first.get("id") == second.get("id"):
        raise Failure("both completions have the same id: the same answer pasted twice",
                      "run the curl command of step 4 a second time and paste the second answer")
    c1, c2 = first["timings"].get("cache_n", 0), second["timings"].get("cache_n", 0)
    prompt = (second.get("usage") or {}).get("prompt_tokens", 0)
    if (first.get("usage") or {}).get("prompt_tokens") != prompt:
        raise Failure("the two completions have different prompts: the same request must be sent twice",
                      "send request.json unchanged both times")
    # A first request may already find its prompt cached (the student ran it before, and the server
    # kept the prefix in a slot or in host memory, as --cache-ram does): then both show it reused.
    if not (c2 >= c1 and c2 >= MIN_REUSE * prompt):
        raise Failure(f"cache_n went from {c1} to {c2} of {prompt} prompt tokens: the second request did not reuse "
                      "the first one's prompt", "send the same request twice in a row to a server with one slot")
    return f"cache_n {c1} -> {c2} of {prompt} prompt tokens"


@lab.check()
def answer_explains_cache(ctx: Context) -> None:
    """your answer says what cache_n counts: prompt tokens kept in the slot's (KV) cache and not computed again."""
    text = "\n".join(answer(ctx.deliverable) or [])
    if not text:
        raise Skip("no answer (see outputs_present)")
    missing = [what for what, pattern in (("the cache (or KV)", CACHE_TERMS),
                                          ("the prompt or its tokens", PROMPT_TERMS))
               if not pattern.search(text)]
    if missing:
        raise Failure(f"the answer does not mention {' nor '.join(missing)}",
                      "say what the server kept from the first request and what it did not compute again")


# --- against the class server's ledger ---

@lab.check(points=2, needs="ledger")
def completions_in_ledger(ctx: Context) -> str:
    """each completion is one of your requests in the ledger: same id, same usage, same timings."""
    ledger = author_ledger(ctx.ledger)

    def same(c: dict[str, Any], r: Record) -> bool:
        usage = c.get("usage") or {}
        return (r.id == c.get("id") and r.timings == c["timings"]
                and r.prompt_tokens == usage.get("prompt_tokens")
                and r.completion_tokens == usage.get("completion_tokens"))

    return ledger.match_each(_two(ctx), same, lambda c: f"request of {ledger.name} is {c.get('id')}",
                             "send the requests yourself, with your key, and paste their answers unedited")


@lab.check(needs="ledger", optional=True)
def props_in_ledger(ctx: Context) -> str:
    """you asked /props with your key (the ledger has it)."""
    ledger = ctx.ledger
    assert ledger is not None
    if all(r.auth == "open" for r in ledger.view.records):
        raise Unchecked("the class server takes any key: its ledger cannot tell whose /props call is whose")
    record, _ = ledger.find(lambda r: r.route == "/props" and r.status == 200)
    if record is None:
        raise Failure(f"no /props request of {ledger.who()} in the ledger",
                      'call /props with your key: curl -s URL/props -H "Authorization: Bearer YOUR-KEY"')
    return f"matches {describe_record(record)}"


# --- against a running server ---

@lab.check(needs="server")
def prompt_tokens_match_server(ctx: Context) -> str:
    """the prompt token count is what this server's model counts for request.json's messages."""
    assert ctx.server is not None
    counted = ctx.server.count_prompt_tokens(REQUEST["messages"], REQUEST["chat_template_kwargs"])
    for completion in _two(ctx):
        reported = (completion.get("usage") or {}).get("prompt_tokens")
        if reported != counted:
            raise Unchecked(f"prompt_tokens={reported} where this server's model counts {counted} for request.json: "
                            "the outputs come from another model (or an edited request.json), so this server "
                            "cannot judge them")
    return f"prompt_tokens={counted}, as this server counts request.json"
