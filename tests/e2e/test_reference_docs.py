"""The reference pages' examples stay true: each `<!-- check METHOD PATH [stream] [status=N] -->`
in docs/reference/ is followed by the request body (POST) and the documented answer; the test sends
the request to the live server and compares the answer's keys with the documented ones, nested
objects and first list items included. A documented object with a "..." key only promises the keys
it shows. Values are not compared: the bundled base model writes different nonsense every run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

PAGES = ("native-generation.md", "tokenizer.md", "server-state.md", "embeddings.md")
REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"
CHECK = re.compile(r"<!-- check (GET|POST) (\S+)((?: [a-z]+(?:=\d+)?)*) -->")
FENCE = re.compile(r"```(\w+)\n(.*?)\n```", re.S)


def examples() -> list[tuple[str, str, str, list[str], str | None, tuple[str, str]]]:
    found = []
    for page in PAGES:
        text = (REFERENCE / page).read_text()
        for match in CHECK.finditer(text):
            method, path, options = match.group(1), match.group(2), match.group(3).split()
            blocks = FENCE.findall(text, match.end())[: 2 if method == "POST" else 1]
            request = blocks[0][1] if method == "POST" else None
            found.append((page, method, path, options, request, blocks[-1]))
    return found


EXAMPLES = examples()


def test_every_page_has_examples() -> None:
    assert {page for page, *_ in EXAMPLES} == set(PAGES)


def same_keys(documented: Any, live: Any, where: str = "") -> None:
    if isinstance(documented, dict):
        assert isinstance(live, dict), f"{where}: documented an object, got {live!r}"[:300]
        keys = set(documented) - {"..."}
        if "..." in documented:
            assert keys <= set(live), f"{where}: documented keys missing: {keys - set(live)}"
        else:
            assert keys == set(live), f"{where}: documented {sorted(keys ^ set(live))} differ"
        for key in keys:
            same_keys(documented[key], live[key], f"{where}.{key}")
    elif isinstance(documented, list):
        assert isinstance(live, list), f"{where}: documented a list, got {live!r}"[:300]
        if documented and live:
            same_keys(documented[0], live[0], f"{where}[0]")


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def key_shape(value: Any) -> Any:
    return frozenset(value) if isinstance(value, dict) else None


@pytest.mark.parametrize(("page", "method", "path", "options", "request_text", "answer"), EXAMPLES,
                         ids=[f"{e[0]}:{e[1]} {e[2]}{' stream' if 'stream' in e[3] else ''}" for e in EXAMPLES])
def test_documented_example(base_url: str, page: str, method: str, path: str, options: list[str],
                            request_text: str | None, answer: tuple[str, str]) -> None:
    # a request first, so that /slots shows a slot with a task and /metrics has counted something
    httpx.post(base_url + "/completion", json={"prompt": "Warm up", "n_predict": 1}, timeout=60)
    status = next((int(o.split("=")[1]) for o in options if o.startswith("status=")), 200)
    body = json.loads(request_text) if request_text is not None else None
    response = httpx.request(method, base_url + path, json=body, timeout=120)
    assert response.status_code == status, response.text[:500]
    kind, documented = answer
    if "stream" in options:
        live_events = events(response.text)
        for index, event in enumerate(events(documented)):
            matching = [e for e in live_events if set(e) == set(event) - {"..."} or
                        ("..." in json.dumps(event) and set(event) <= set(e))]
            assert matching, f"documented event {index} has no live event with its keys"
            same_keys(event, matching[0], f"event {index}")
    elif kind == "text":
        names = [line.split()[0] for line in documented.splitlines() if line.startswith("llamacpp:")]
        live_names = [line.split()[0] for line in response.text.splitlines() if line.startswith("llamacpp:")]
        assert names == live_names
    else:
        same_keys(json.loads(documented), response.json())
