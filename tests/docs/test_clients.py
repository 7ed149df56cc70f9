"""Every example in clients/ runs against the live server, as a student would run it (LLAMA_URL, API_KEY).

The bundled model is a base model: the checks look at the numbers and markers each example prints,
never at the wording.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser import ARTIFACTS, chromium_context, serve_directory
from tests.projector_model import GEMMA3_IMAGE_TOKENS, tiny_projector
from tests.server import KEYED_SERVER_KEY, KineticServer

pytestmark = pytest.mark.e2e

CLIENTS = Path(__file__).resolve().parents[2] / "clients"
BROWSER_PAGE = "browser.html"


KEY = KEYED_SERVER_KEY  # the session's keyed_server (tests/conftest.py)


def launch(command: list[str], server: KineticServer, key: str = KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.update(LLAMA_URL=server.url, API_KEY=key)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, cwd=CLIENTS.parent)


def run_client(command: list[str], server: KineticServer) -> str:
    proc = launch(command, server)
    assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def seeing_server(model_lock: None) -> Iterator[KineticServer]:
    """The bundled model with the tests' tiny gemma3 projector: it reads images (16 embeddings each)."""
    with KineticServer("-mm", str(tiny_projector("gemma3")), "-c", "1024", "-np", "1") as server:
        yield server


def test_every_client_file_has_a_test() -> None:
    """A new example in clients/ needs a test here (and a tab in docs/examples.md)."""
    source = Path(__file__).read_text(encoding="utf-8")
    for path in CLIENTS.iterdir():
        assert f'"{path.name}"' in source, f"clients/{path.name} is run by no test"


def test_every_client_reads_llama_url_and_api_key() -> None:
    for path in CLIENTS.iterdir():
        text = path.read_text(encoding="utf-8")
        assert "LLAMA_URL" in text and "API_KEY" in text, f"clients/{path.name} must read LLAMA_URL and API_KEY"


@pytest.mark.parametrize("command", [
    [sys.executable, "openai_chat.py"], [sys.executable, "anthropic_messages.py"], ["node", "fetch_chat.mjs"],
    ["sh", "curl.sh"], [sys.executable, "ollama_chat.py"], [sys.executable, "openai_responses.py"]],
    ids=lambda command: command[-1])
def test_client_sends_api_key(command: list[str], keyed_server: KineticServer) -> None:
    """Against a server with --api-key: a wrong API_KEY is refused with 401, the right one answers."""
    command = [*command[:-1], str(CLIENTS / command[-1])]
    wrong = launch(command, keyed_server, key="wrong-key")
    assert wrong.returncode != 0 and "Invalid API Key" in wrong.stdout + wrong.stderr, wrong.stderr[-2000:]
    right = launch(command, keyed_server)
    assert right.returncode == 0, right.stderr[-2000:]


def test_openai_chat(default_server: KineticServer) -> None:
    out = run_client([sys.executable, str(CLIENTS / "openai_chat.py")], default_server)
    usage = re.search(r"\[finish_reason=(stop|length) prompt=(\d+) completion=(\d+)\]", out)
    assert usage and int(usage.group(2)) > 0 and 0 < int(usage.group(3)) <= 40, out
    assert re.search(r"\[timings: cache_n=\d+ \d+\.\d t/s\]", out), out


def test_openai_stream(default_server: KineticServer) -> None:
    out = run_client([sys.executable, str(CLIENTS / "openai_stream.py")], default_server)
    line = re.search(r"\[first token after (\d+\.\d\d)s, (\d+) tokens in (\d+\.\d)s\]", out)
    assert line and 0 < int(line.group(2)) <= 40, out


def test_anthropic_messages(default_server: KineticServer) -> None:
    out = run_client([sys.executable, str(CLIENTS / "anthropic_messages.py")], default_server)
    full = re.search(r"\[stop_reason=(end_turn|max_tokens) input=(\d+) output=(\d+)\]", out)
    assert full and 0 < int(full.group(3)) <= 40, out
    assert re.search(r"\[streamed: stop_reason=(end_turn|max_tokens) output=\d+\]", out), out


def test_ollama_chat(default_server: KineticServer) -> None:
    out = run_client([sys.executable, str(CLIENTS / "ollama_chat.py")], default_server)
    full = re.search(r"\[done_reason=(stop|length) prompt_eval_count=(\d+) eval_count=(\d+) \d+\.\d t/s\]", out)
    assert full and int(full.group(2)) > 0 and 0 < int(full.group(3)) <= 40, out
    streamed = re.search(r"\[streamed: eval_count=(\d+)\]", out)
    assert streamed and 0 < int(streamed.group(1)) <= 40, out


def test_openai_responses(default_server: KineticServer) -> None:
    out = run_client([sys.executable, str(CLIENTS / "openai_responses.py")], default_server)
    full = re.search(r"\[status=completed input=(\d+) output=(\d+)\]", out)
    assert full and int(full.group(1)) > 0 and 0 < int(full.group(2)) <= 40, out
    streamed = re.search(r"\[streamed: output=(\d+)\]", out)
    assert streamed and 0 < int(streamed.group(1)) <= 40, out


def test_openai_image(seeing_server: KineticServer) -> None:
    out = run_client([sys.executable, str(CLIENTS / "openai_image.py")], seeing_server)
    usage = re.search(r"\[finish_reason=(stop|length) prompt=(\d+) completion=(\d+)\]", out)
    assert usage and int(usage.group(2)) > GEMMA3_IMAGE_TOKENS and 0 < int(usage.group(3)) <= 40, out
    timings = re.search(r"\[timings: cache_n=(\d+) prompt_n=(\d+) \d+\.\d t/s\]", out)
    assert timings and int(timings.group(1)) + int(timings.group(2)) == int(usage.group(2)), out


def test_ollama_image(seeing_server: KineticServer) -> None:
    out = run_client([sys.executable, str(CLIENTS / "ollama_image.py")], seeing_server)
    capabilities = re.search(r"\[capabilities: (.*)\]", out)
    assert capabilities and "vision" in capabilities.group(1).split(", "), out
    full = re.search(r"\[done_reason=(stop|length) prompt_eval_count=(\d+) eval_count=(\d+)\]", out)
    assert full and int(full.group(2)) > GEMMA3_IMAGE_TOKENS and 0 < int(full.group(3)) <= 40, out


def test_image_clients_are_refused_by_a_text_only_model(default_server: KineticServer) -> None:
    """The bundled model alone reads no images: a 400 that says how to give it a projector."""
    for name in ("openai_image.py", "ollama_image.py"):
        proc = launch([sys.executable, str(CLIENTS / name)], default_server)
        assert proc.returncode != 0 and "reads text only" in proc.stderr, proc.stderr[-2000:]


def test_langchain_chat(default_server: KineticServer) -> None:
    out = run_client([sys.executable, str(CLIENTS / "langchain_chat.py")], default_server)
    usage = re.search(r"\[usage: (\d+) in, (\d+) out\]", out)
    assert usage and int(usage.group(1)) > 0 and 0 < int(usage.group(2)) <= 60, out
    # the structured answer is grammar-constrained, so it always parses into the model
    assert re.search(r"\[structured: City\(name='[^']*', country='[^']*'\)\]", out), out


def test_llamaindex_chat(default_server: KineticServer) -> None:
    out = run_client([sys.executable, str(CLIENTS / "llamaindex_chat.py")], default_server)
    assert out.endswith("\n"), out


def test_curl(default_server: KineticServer) -> None:
    out = run_client(["sh", str(CLIENTS / "curl.sh")], default_server)
    lines = out.splitlines()
    chat, completion, tokenized = [json.loads(line) for line in lines if line.startswith("{")]
    assert chat["object"] == "chat.completion" and 0 < chat["usage"]["completion_tokens"] <= 20
    events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and "timings" in json.loads(events[-2])
    assert 0 < completion["tokens_predicted"] <= 10 and completion["timings"]["predicted_n"] > 0
    assert "".join(piece["piece"] for piece in tokenized["tokens"]) == "Hello world"


def test_node_fetch_chat(default_server: KineticServer) -> None:
    out = run_client(["node", str(CLIENTS / "fetch_chat.mjs")], default_server)
    usage = re.search(r"\[finish_reason=(stop|length) prompt=(\d+) completion=(\d+)\]", out)
    assert usage and int(usage.group(2)) > 0 and 0 < int(usage.group(3)) <= 40, out
    assert re.search(r"\[timings: cache_n=\d+ \d+\.\d t/s\]", out), out


def test_node_fetch_stream(default_server: KineticServer) -> None:
    out = run_client(["node", str(CLIENTS / "fetch_stream.mjs")], default_server)
    line = re.search(r"\[(\d+) tokens, (\d+\.\d) t/s\]", out)
    assert line and 0 < int(line.group(1)) <= 40, out


def test_browser_page(default_server: KineticServer) -> None:
    """browser.html, served from another origin (so CORS is exercised), in headless Chromium."""
    with serve_directory(CLIENTS) as pages, chromium_context() as context:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{pages}/{BROWSER_PAGE}?LLAMA_URL={default_server.url}&API_KEY=sk-course")
        page.click("#send")
        page.wait_for_function("document.getElementById('stats').textContent.length > 0", timeout=120_000)
        stats = page.inner_text("#stats")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "clients-browser.png"), full_page=True)
    assert not errors, errors
    line = re.search(r"\[(\d+) tokens, \d+\.\d t/s, first token after \d+\.\d\ds\] \[done\]", stats)
    assert line and 0 < int(line.group(1)) <= 40, stats
