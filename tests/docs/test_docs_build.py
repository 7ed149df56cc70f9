"""The course site builds strictly: every snippet include (README set-up, the lab text, clients/) resolves."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TABS = ("Python", "Node", "curl", "Anthropic", "Ollama", "Responses")


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    site = tmp_path / "site"
    lab_page = (site / "labs" / "lab-04-02" / "index.html").read_text()
    assert "chat.py" in lab_page and "kinetic serve" in lab_page
    assert lab_page.count("<h1") == 1, "the lab page prints its title twice"
    assert '<pre class="mermaid"><code>sequenceDiagram' in lab_page
    setup_page = (site / "setup" / "index.html").read_text()
    assert "multimodal library" in setup_page and "The first install compiles llama.cpp" in setup_page

    raw = (site / "examples" / "index.html").read_text()
    labels = re.findall(r'<label for="__tabbed_\d+_\d+">([^<]+)</label>', raw)
    for label in TABS:  # each group has the same labels, so content.tabs.link keeps them in step
        assert labels.count(label) == 2, f"tab {label!r} should be in both the answer and the stream groups"
    examples = html.unescape(re.sub(r"<[^>]+>", "", raw))
    assert "--8<--" not in examples, "a snippet marker leaked into the page"
    for client in sorted((ROOT / "clients").iterdir()):
        assert f"clients/{client.name}" in (ROOT / "docs" / "examples.md").read_text(), (
            f"clients/{client.name} is not shown on the examples page")
    assert 'client = OpenAI(base_url=os.environ.get("LLAMA_URL"' in examples
    assert "for await (const text of res.body.pipeThrough(new TextDecoderStream()))" in examples
    assert 'curl -sS --fail-with-body "$URL/v1/chat/completions"' in examples
    assert "client.messages.stream(model=" in examples

    grading = (site / "grading" / "index.html").read_text()
    assert "kinetic grade lab-04-02 submissions/" in grading and "autograding-command-grader" in grading
    for lab in ("lab-04-01", "lab-04-02"):
        assert (site / "labs" / lab / "index.html").read_text().count("<h1") == 1, f"{lab} prints its title twice"
