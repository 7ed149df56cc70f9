"""Lab 04-02 as students run it and write it up: the real scripts' outputs, pasted in several styles.

Shared by the e2e tests (with and without a ledger) and by the reference regeneration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parents[1] / "labs" / "lab-04-02-client-openai"
CHAT_PY, CHAT_MJS = LAB_DIR / "chat.py", LAB_DIR / "chat.mjs"
NODE = "node"
ANSWER = """base_url: remove it (or set https://api.openai.com/v1): the SDK's default is the real API.
api_key: a real OpenAI key, read from OPENAI_API_KEY, instead of "no-key-required".
model: a real model name such as "gpt-4o-mini" instead of "local" (and drop the chat_template_kwargs extra_body)."""
ANSWER_IT = """- base_url: da togliere (o https://api.openai.com/v1), il default dell'SDK è l'API vera;
- api_key: una chiave OpenAI vera, letta da OPENAI_API_KEY, al posto di "no-key-required";
- model: un modello vero come "gpt-4o-mini" al posto di "local"."""


def run(command: list[str], url: str, script_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "OPENAI_API_KEY")}
    env.update({"LLAMA_URL": url, **(script_env or {})})
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)


def edited_copy(source: Path, folder: Path, old: str, new: str) -> Path:
    """What the lab asks students to do: change one line of the script."""
    text = source.read_text(encoding="utf-8")
    assert old in text, f"{source.name} no longer contains {old!r}"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / source.name
    target.write_text(text.replace(old, new), encoding="utf-8")
    return target


@dataclass(frozen=True)
class Runs:
    """One student's four runs and the error line of step 8."""

    full: str
    stream: str
    mjs: str
    mjs_stream: str
    error: str


def student_runs(url: str, key: str | None, work: Path, error_line: str) -> Runs:
    """chat.py and chat.mjs as a student runs them against `url`, with `key` if the server has keys
    (chat.mjs with its Authorization line uncommented, as step 8 says)."""
    env = {"API_KEY": key} if key else {}
    mjs = edited_copy(CHAT_MJS, work, '// "Authorization"', '"Authorization"') if key else CHAT_MJS
    outputs = []
    for command in ([sys.executable, str(CHAT_PY)], [sys.executable, str(CHAT_PY), "--stream"],
                    [NODE, str(mjs)], [NODE, str(mjs), "--stream"]):
        proc = run(command, url, env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs.append(proc.stdout)
    return Runs(*outputs, error_line)


def _fence(text: str, fence: str = "```", info: str = "text") -> str:
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def template_style(runs: Runs, name: str | None = None) -> str:
    """The lab-04-02.md template filled in: its headings, ``` blocks, no command lines."""
    text = (LAB_DIR / "lab-04-02.md").read_text(encoding="utf-8")
    for block in (runs.full, runs.stream, runs.mjs + runs.mjs_stream, runs.error):
        text = text.replace("```text\n```", _fence(block), 1)
    if name:
        text = text.replace("\nName:\n", f"\nName: {name}\n", 1)
    return text.rstrip() + "\n\n" + ANSWER + "\n"


def bold_style(runs: Runs, name: str | None = None) -> str:
    """Bold labels instead of headings, ~~~ fences, the command lines pasted too, answer on the label line."""
    head = f"# Lab 04-02\n\n**Student:** {name}\n" if name else "# Lab 04-02\n"
    return textwrap.dedent("""\
        {head}
        **1. chat.py (full response)**

        {full}

        **2. chat.py --stream:**

        {stream}

        **3. node chat.mjs, then node chat.mjs --stream**

        {mjs}

        **4. The 401 error:** `{error}`

        **5. Answer:** {answer}
        """).format(head=head, full=_fence("$ python chat.py\n" + runs.full, "~~~", "console"),
                    stream=_fence("$ python chat.py --stream\n" + runs.stream, "~~~", ""),
                    mjs=_fence(f"$ node chat.mjs\n{runs.mjs}$ node chat.mjs --stream\n{runs.mjs_stream}", "~~~", "sh"),
                    error=runs.error, answer=ANSWER.replace("\n", "\n"))


def _indent(text: str) -> str:
    return "\n".join("    " + line if line.strip() else "" for line in text.rstrip().splitlines())


def italian_style(runs: Runs, name: str | None = None) -> str:
    """Italian headings, indented code blocks, prose between the outputs."""
    head = f"# Laboratorio 04-02: client OpenAI\n\nNome: {name}\n" if name else "# Laboratorio 04-02: client OpenAI\n"
    return (f"{head}\n## Risposta completa di chat.py\n\nHo avviato il server e lanciato lo script:\n\n"
            f"{_indent(runs.full)}\n\nAlla prima richiesta il server non ha niente in cache.\n\n"
            f"## chat.py in streaming\n\n{_indent(runs.stream)}\n\n"
            f"## Client Node.js (chat.mjs)\n\nPrima senza streaming, poi con `--stream`:\n\n"
            f"{_indent(runs.mjs)}\n\n{_indent(runs.mjs_stream)}\n\n"
            f"## Errore 401\n\n{_indent(runs.error)}\n\n"
            f"## Domanda: quali righe cambieresti per usare l'API vera di OpenAI?\n\n{ANSWER_IT}\n")


def plain_style(runs: Runs, name: str | None = None) -> str:
    """No Markdown at all: label lines ending with a colon, PowerShell prompts, outputs as plain text."""
    head = f"Lab 04-02 - {name}\n" if name else "Lab 04-02\n"
    return (f"{head}\nchat.py:\nPS C:\\lab> python chat.py\n{runs.full.rstrip()}\n\n"
            f"chat.py --stream:\nPS C:\\lab> python chat.py --stream\n{runs.stream.rstrip()}\n\n"
            f"chat.mjs:\nPS C:\\lab> node chat.mjs\n{runs.mjs.rstrip()}\n"
            f"PS C:\\lab> node chat.mjs --stream\n{runs.mjs_stream.rstrip()}\n\n"
            f"Error 401:\n{runs.error}\n\nAnswer:\n{ANSWER}\n")


STYLES = {"template": template_style, "bold-labels": bold_style, "italian": italian_style, "plain": plain_style}


OPENAI_401 = ("openai.AuthenticationError: Error code: 401 - {'error': {'message': 'Incorrect API key provided: "
              "segreta123. You can find your API key at https://platform.openai.com/account/api-keys.', "
              "'type': 'invalid_request_error', 'param': None, 'code': 'invalid_api_key'}}")


def _replace_line(text: str, pattern: str, make: Callable[[re.Match[str]], str]) -> str:
    changed, count = re.subn(pattern, make, text, count=1)
    assert count == 1, pattern
    return changed


def broken_variants(good: str, readme: str) -> dict[str, str]:
    """One deliberately broken deliverable per offline check, each made from the good one."""
    start, end = good.index("## 3. chat.mjs"), good.index("## 4. The 401 error")
    readme_lines = [line.strip() for line in readme.splitlines()
                    if re.match(r"\s*\[(finish_reason|server:|\d+ chunk|\d+ token)", line)]
    readme_copy = good
    for pattern in (r"\[finish_reason=\w+ prompt=\d+.*\]", r"\[server: cache_n=\d+.*\]", r"\[\d+ chunk.*\]"):
        example = next(line for line in readme_lines if re.fullmatch(pattern, line))
        readme_copy = _replace_line(readme_copy, pattern, lambda m, e=example: e)
    token_examples = iter([line for line in readme_lines if re.fullmatch(r"\[\d+ token, .*\]", line)])
    readme_copy = re.sub(r"\[\d+ token, [\d.]+ t/s\]", lambda m: next(token_examples, m[0]), readme_copy)
    return {
        "broken-missing-section.md": good[:start] + good[end:],
        "broken-numbers.md": _replace_line(good, r"(\[finish_reason=\w+ prompt=\d+ tok, completion=\d+ tok, )[\d.]+s\]",
                                           lambda m: m[1] + "0.1s]"),
        "broken-ttft.md": _replace_line(good, r"primo token dopo [\d.]+s, totale ([\d.]+)s",
                                        lambda m: f"primo token dopo {float(m[1]) + 1:.2f}s, totale {m[1]}s"),
        "broken-401-line.md": _replace_line(good, r"openai\.AuthenticationError: .*", lambda m: OPENAI_401),
        "broken-answer.md": _replace_line(good, r"base_url: remove it \(or set https://api.openai.com/v1\)",
                                          lambda m: "the server address: point the client to api.openai.com"),
        "broken-readme-copy.md": readme_copy,
    }
