"""Lab 04-02 as a student does it: chat.py and chat.mjs against the live server, then `kinetic grade`.

The good reference deliverable is rebuilt here from real runs and graded against the same server;
KINETIC_REGENERATE_REFERENCE=1 also writes it to labs/lab-04-02-client-openai/reference/good.md.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from kinetic.grading import lab_04_02
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

LAB_DIR = Path(__file__).resolve().parents[2] / "labs" / "lab-04-02-client-openai"
CHAT_PY, CHAT_MJS = LAB_DIR / "chat.py", LAB_DIR / "chat.mjs"
NODE = "node"
KEY = "segreta123"
ERROR_LINE = ("openai.AuthenticationError: Error code: 401 - {'error': {'message': 'Invalid API Key', "
              "'type': 'authentication_error', 'code': 401}}")
ANSWER = """base_url: remove it (or set https://api.openai.com/v1): the SDK's default is the real API.
api_key: a real OpenAI key, read from OPENAI_API_KEY, instead of "no-key-required".
model: a real model name such as "gpt-4o-mini" instead of "local" (and drop the chat_template_kwargs extra_body)."""


def run(command: list[str], url: str, script_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "OPENAI_API_KEY")}
    env.update({"LLAMA_URL": url, **(script_env or {})})
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)


def edited_copy(source: Path, tmp_path: Path, old: str, new: str) -> Path:
    """What the lab asks students to do: change one line of the script."""
    text = source.read_text(encoding="utf-8")
    assert old in text, f"{source.name} no longer contains {old!r}"
    target = tmp_path / source.name
    target.write_text(text.replace(old, new), encoding="utf-8")
    return target


def fill_template(blocks: list[str], answer: str) -> str:
    """The deliverable a student hands in: the template with each empty block filled, then the answer."""
    text = (LAB_DIR / "lab-04-02.md").read_text(encoding="utf-8")
    for block in blocks:
        text = text.replace("```text\n```", f"```text\n{block.rstrip()}\n```", 1)
    return text.rstrip() + "\n\n" + answer + "\n"


@pytest.fixture(scope="module")
def outputs(base_url: str) -> dict[str, str]:
    runs = {
        "full": [sys.executable, str(CHAT_PY)],
        "stream": [sys.executable, str(CHAT_PY), "--stream"],
        "mjs": [NODE, str(CHAT_MJS)],
        "mjs_stream": [NODE, str(CHAT_MJS), "--stream"],
    }
    result = {}
    for name, command in runs.items():
        proc = run(command, base_url)
        assert proc.returncode == 0, proc.stderr
        result[name] = proc.stdout
    return result


@pytest.fixture(scope="module")
def keyed_server(model_lock: None, live_server: KineticServer) -> Iterator[KineticServer]:
    with KineticServer("-c", "1024", "-np", "1", "--api-key", KEY) as server:
        yield server


def last_lines(text: str, n: int) -> list[str]:
    return text.strip().splitlines()[-n:]


def test_chat_py_messages_are_the_graders() -> None:
    script = runpy.run_path(str(CHAT_PY), run_name="lab")  # not "__main__": nothing is sent
    assert script["MESSAGES"] == lab_04_02.CHAT_PY_MESSAGES
    assert script["EXTRA"] == {"chat_template_kwargs": lab_04_02.CHAT_TEMPLATE_KWARGS}


def test_chat_py_full_prints_answer_usage_and_timings(outputs: dict[str, str]) -> None:
    usage, server = last_lines(outputs["full"], 2)
    match = re.fullmatch(r"\[finish_reason=(stop|length) prompt=(\d+) tok, completion=(\d+) tok, \d+\.\ds\]", usage)
    assert match and 1 <= int(match[3]) <= 80, usage
    assert re.fullmatch(r"\[server: cache_n=\d+ prompt \d+\.\d t/s, generazione \d+\.\d t/s\]", server), server


def test_chat_py_stream_prints_chunks_ttft_and_total(outputs: dict[str, str]) -> None:
    (line,) = last_lines(outputs["stream"], 1)
    match = re.fullmatch(r"\[(\d+) chunk, primo token dopo (\d+\.\d\d)s, totale (\d+\.\d)s\]", line)
    assert match and int(match[1]) >= 1 and float(match[2]) <= float(match[3]) + 0.05, line


def test_chat_mjs_prints_tokens_and_fine(outputs: dict[str, str]) -> None:
    (full_line,) = last_lines(outputs["mjs"], 1)
    assert re.fullmatch(r"\[\d+ token, \d+\.\d t/s\]", full_line), full_line
    tokens, fine = last_lines(outputs["mjs_stream"], 2)
    assert re.fullmatch(r"\[\d+ token, \d+\.\d t/s\]", tokens) and fine == "[fine]"


def test_good_deliverable_from_real_runs_passes_live_grading(outputs: dict[str, str], base_url: str,
                                                              tmp_path: Path) -> None:
    text = fill_template([outputs["full"], outputs["stream"], outputs["mjs"] + outputs["mjs_stream"], ERROR_LINE],
                         ANSWER)
    deliverable = tmp_path / "good.md"
    deliverable.write_text(text, encoding="utf-8")
    proc = run([sys.executable, "-m", "kinetic", "grade", "lab-04-02", str(deliverable), "--server", base_url,
                "--json"], base_url)
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["students"][0]["checks"]}
    assert proc.returncode == 0 and report["passed"], [c for c in checks.values() if c["passed"] is False]
    assert checks["prompt_tokens_match_server"]["passed"] and checks["speeds_plausible"]["passed"]
    assert checks["error_401_matches_server"]["passed"] is None  # this server takes any key
    if os.environ.get("KINETIC_REGENERATE_REFERENCE") == "1":
        (LAB_DIR / "reference" / "good.md").write_text(text, encoding="utf-8")


def test_client_without_key_gets_401_then_works_with_it(keyed_server: KineticServer, tmp_path: Path) -> None:
    url = keyed_server.url
    denied = run([sys.executable, str(CHAT_PY)], url)
    assert denied.returncode != 0 and last_lines(denied.stderr, 1) == [ERROR_LINE]
    allowed = run([sys.executable, str(CHAT_PY)], url, {"API_KEY": KEY})
    assert allowed.returncode == 0 and "[server: cache_n=" in allowed.stdout, allowed.stderr
    # Without the api_key argument the SDK reads OPENAI_API_KEY by itself.
    no_arg = edited_copy(CHAT_PY, tmp_path, "client = OpenAI(base_url=BASE_URL, api_key=API_KEY)",
                         "client = OpenAI(base_url=BASE_URL)")
    assert run([sys.executable, str(no_arg)], url, {"OPENAI_API_KEY": KEY}).returncode == 0

    node_denied = run([NODE, str(CHAT_MJS)], url)
    assert node_denied.returncode != 0 and "401" in node_denied.stdout and "Invalid API Key" in node_denied.stdout
    header = edited_copy(CHAT_MJS, tmp_path, '// "Authorization"', '"Authorization"')
    node_allowed = run([NODE, str(header), "--stream"], url, {"API_KEY": KEY})
    assert node_allowed.returncode == 0 and last_lines(node_allowed.stdout, 1) == ["[fine]"], node_allowed.stderr


def test_grader_401_line_matches_keyed_server(keyed_server: KineticServer, tmp_path: Path) -> None:
    good = LAB_DIR / "reference" / "good.md"
    wrong = LAB_DIR / "reference" / "broken-401-line.md"
    command = [sys.executable, "-m", "kinetic", "grade", "lab-04-02", "--server", keyed_server.url,
               "--api-key", KEY, "--json"]
    proc = run([*command, str(good), str(wrong)], keyed_server.url)
    students = {s["student"]: {c["name"]: c for c in s["checks"]} for s in json.loads(proc.stdout)["students"]}
    assert students["good"]["error_401_matches_server"]["passed"] is True
    assert students["broken-401-line"]["error_401_matches_server"]["passed"] is False
    assert proc.returncode == 1


def test_lab_variants_run_as_written(base_url: str, tmp_path: Path) -> None:
    longer = edited_copy(CHAT_PY, tmp_path, "MAX_TOKENS = 80", "MAX_TOKENS = 300")
    usage = run([sys.executable, str(longer)], base_url).stdout
    match = re.search(r"\[finish_reason=(stop|length) prompt=\d+ tok, completion=(\d+) tok", usage)
    assert match and (match[1] == "stop" or int(match[2]) == 300), usage

    no_kwargs = edited_copy(CHAT_PY, tmp_path, 'EXTRA = {"chat_template_kwargs": {"enable_thinking": False}}',
                            "EXTRA = {}")
    assert "primo token dopo" in run([sys.executable, str(no_kwargs), "--stream"], base_url).stdout

    with_usage = edited_copy(CHAT_MJS, tmp_path, "// stream_options", "stream_options")
    out = run([NODE, str(with_usage), "--stream"], base_url).stdout
    assert re.search(r"\[usage: prompt=\d+ completion=\d+\]", out) and last_lines(out, 1) == ["[fine]"], out
