"""Lab 04-03 as students run it and write it up: the real scripts' outputs, pasted in several styles.

Shared by the e2e test (with a class ledger) and by the reference regeneration.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.lab_04_02_runs import run

LAB_DIR = Path(__file__).resolve().parents[1] / "labs" / "lab-04-03-structured-output"
STRUCTURED_PY, TOOLS_PY, GRAMMAR_JSON = LAB_DIR / "structured.py", LAB_DIR / "tools.py", LAB_DIR / "grammar.json"
ANSWER = """tools.py forces the call: the server turns meteo's parameters into a grammar, so the answer is a call
and finish_reason is tool_calls. With auto nothing constrains the text: the base model writes prose,
never a call, so finish_reason is stop or length (an instruction-tuned model could call the tool)."""
ANSWER_IT = """Con la chiamata forzata il server compila i parametri di meteo in una grammatica: la risposta è per
forza una chiamata e finish_reason è tool_calls. Con auto il modello base scrive testo libero, mai una
chiamata: finish_reason è stop o length."""


@dataclass(frozen=True)
class Runs:
    """One student's outputs of every step, as the scripts printed them."""

    schema: str
    json_object: str
    tools: str
    auto: str
    grammar: str
    invalid: str
    stream: str


def curl_completion(url: str, key: str | None) -> str:
    command = ["curl", "-s", url + "/completion", "-d", f"@{GRAMMAR_JSON}"]
    if key:
        command[2:2] = ["-H", f"Authorization: Bearer {key}"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("{"), proc.stdout + proc.stderr
    return proc.stdout + "\n"


def student_runs(url: str, key: str | None, stream: bool = True) -> Runs:
    """Every step of the lab against `url`, with `key` (API_KEY, and curl's Authorization header)."""
    env = {"API_KEY": key} if key else {}
    outputs = []
    for script, flag in ((STRUCTURED_PY, None), (STRUCTURED_PY, "--json-object"), (TOOLS_PY, None),
                         (TOOLS_PY, "--auto")):
        proc = run([sys.executable, str(script), *([flag] if flag else [])], url, env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outputs.append(proc.stdout)
    outputs.append(curl_completion(url, key))
    invalid = run([sys.executable, str(STRUCTURED_PY), "--invalid"], url, env)
    assert invalid.returncode == 0, invalid.stderr
    outputs.append(invalid.stdout)
    streamed = run([sys.executable, str(TOOLS_PY), "--stream"], url, env) if stream else None
    assert streamed is None or streamed.returncode == 0, streamed.stderr
    outputs.append(streamed.stdout if streamed else "")
    return Runs(*outputs)


def _fence(text: str, fence: str = "```", info: str = "text") -> str:
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def template_style(runs: Runs, name: str | None = None) -> str:
    """The lab-04-03.md template filled in: its headings and ``` blocks."""
    text = (LAB_DIR / "lab-04-03.md").read_text(encoding="utf-8")
    for block in (runs.schema, runs.json_object, runs.tools, runs.auto, runs.grammar, runs.invalid, runs.stream):
        text = text.replace("```text\n```", _fence(block) if block.strip() else "```text\n```", 1)
    if name:
        text = text.replace("\nName:\n", f"\nName: {name}\n", 1)
    return text.rstrip() + "\n\n" + ANSWER + "\n"


def bold_style(runs: Runs, name: str | None = None) -> str:
    """Bold labels, ~~~ fences with the command lines, the curl JSON pretty-printed, Italian answer."""
    head = f"# Lab 04-03\n\n**Studente:** {name}\n" if name else "# Lab 04-03\n"
    pretty = json.dumps(json.loads(runs.grammar), indent=2, ensure_ascii=False)
    return textwrap.dedent("""\
        {head}
        **1. Schema con pydantic**

        {schema}

        **2. json_object**

        {json_object}

        **3. Chiamata forzata e risultato**

        {tools}

        **4. tool_choice auto**

        {auto}

        **5. curl con grammatica**

        {grammar}

        **6. Errore 400:** `{invalid}`

        **7. Risposta:** {answer}
        """).format(head=head, schema=_fence("$ python structured.py\n" + runs.schema, "~~~", "console"),
                    json_object=_fence("$ python structured.py --json-object\n" + runs.json_object, "~~~", ""),
                    tools=_fence("$ python tools.py\n" + runs.tools, "~~~", "sh"),
                    auto=_fence("$ python tools.py --auto\n" + runs.auto, "~~~", "sh"),
                    grammar=_fence(pretty, "~~~", "json"), invalid=runs.invalid.strip(),
                    answer=ANSWER_IT.replace("\n", " "))


def plain_style(runs: Runs, name: str | None = None) -> str:
    """No Markdown: label lines ending with a colon, PowerShell prompts."""
    head = f"Lab 04-03 - {name}\n" if name else "Lab 04-03\n"
    return (f"{head}\nstructured.py:\nPS C:\\lab> python structured.py\n{runs.schema.rstrip()}\n\n"
            f"json_object:\nPS C:\\lab> python structured.py --json-object\n{runs.json_object.rstrip()}\n\n"
            f"tools.py:\nPS C:\\lab> python tools.py\n{runs.tools.rstrip()}\n\n"
            f"auto:\nPS C:\\lab> python tools.py --auto\n{runs.auto.rstrip()}\n\n"
            f"grammar:\nPS C:\\lab> curl.exe -s http://127.0.0.1:8080/completion -d '@grammar.json'\n"
            f"{runs.grammar.rstrip()}\n\nerror 400:\n{runs.invalid.rstrip()}\n\nAnswer:\n{ANSWER}\n")


STYLES = {"template": template_style, "bold-labels": bold_style, "plain": plain_style}


def _replace(text: str, pattern: str, make) -> str:
    changed, count = re.subn(pattern, make, text, count=1)
    assert count == 1, pattern
    return changed


def broken_variants(good: str, readme: str) -> dict[str, str]:
    """One deliberately broken deliverable per offline check, each made from the good one."""
    start, end = good.index("## 4. tools.py --auto"), good.index("## 5. /completion")
    readme_ids = re.findall(r"\[id=(chatcmpl-\w+)\]", readme)
    readme_copy = good
    for index, found in enumerate(re.findall(r"\[id=(chatcmpl-\w+)\]", good)[:len(readme_ids)]):
        readme_copy = readme_copy.replace(found, readme_ids[index])
    return {
        "broken-missing-section.md": good[:start] + good[end:],
        "broken-schema.md": _replace(good, r'"abitanti_milioni"\s*:\s*\d+', lambda m: '"abitanti_milioni": 95'),
        "broken-tool-call-id.md": _replace(good, r"tool_call_id=(\w+)", lambda m: "tool_call_id=call_" + m[1][5:]),
        "broken-grammar.md": _replace(good, r'"content":"([^"]*)"', lambda m: '"content":"domani alle 9"'),
        "broken-numbers.md": _replace(good, r"(\[finish_reason=stop prompt=\d+ tok, completion=\d+ tok, )[\d.]+s\]",
                                      lambda m: m[1] + "0.1s]"),
        "broken-answer.md": good.replace(ANSWER, "The server decides.\n"),
        "broken-readme-copy.md": readme_copy,
    }
