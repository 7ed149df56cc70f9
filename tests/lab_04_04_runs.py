"""Lab 04-04 as students run it and write it up: load.py against servers with different -np, the
outputs pasted in several styles with the table made from them.

Shared by the e2e test (with a ledger) and by the reference regeneration.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.lab_04_02_runs import run

LAB_DIR = Path(__file__).resolve().parents[1] / "labs" / "lab-04-04-concurrency"
LOAD_PY = LAB_DIR / "load.py"
# Few requests: the suite's time is short. Enough for four clients to be in flight at once.
RUNS_ON_ONE_SLOT = ((1, 2), (4, 4))  # (clients, requests) against -np 1
RUN_ON_FOUR_SLOTS = (4, 4)
ANSWERS = {
    "aggregate": "Each decode step serves every active slot at once: one step over four sequences costs more "
                 "than a step over one but much less than four, so the total rises while each stream waits "
                 "for the others' share of the step.",
    "memory": "-c is the context of all the slots together: each slot keeps its own KV cache, so -np 4 with "
              "-c 4096 leaves 1024 tokens a slot (n_ctx in /slots).",
    "class": "With 30 students at once and 4 slots, 26 wait in the queue: the TTFT p95 is several request "
             "times, about 30 / 4 x 1 s = 8 s here.",
}


def load(url: str, key: str | None, clients: int, requests: int) -> str:
    proc = run([sys.executable, str(LOAD_PY), "--clients", str(clients), "--requests", str(requests)], url,
               {"API_KEY": key} if key else {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def table(outputs: list[str]) -> str:
    rows = ["| np | clients | aggregate t/s | per stream t/s | TTFT p50 s | TTFT p95 s |", "|---|---|---|---|---|---|"]
    for out in outputs:
        head = re.search(r"\[np=(\w+|\?), (\d+) client", out)
        speed = re.search(r"\[aggregato ([\d.]+) t/s, per stream ([\d.]+) t/s, TTFT p50 ([\d.]+)s p95 ([\d.]+)s\]", out)
        assert head and speed, out
        rows.append(f"| {head[1]} | {head[2]} | {speed[1]} | {speed[2]} | {speed[3]} | {speed[4]} |")
    return "\n".join(rows)


def template_style(one_slot: list[str], four_slots: list[str], name: str | None = None) -> str:
    """The lab-04-04.md template filled in (no default -np run: the tests start two servers only)."""
    text = (LAB_DIR / "lab-04-04.md").read_text(encoding="utf-8")
    text = text.replace("```text\n```", "```text\n" + "\n".join(o.rstrip() for o in one_slot) + "\n```", 1)
    text = text.replace("```text\n```", "```text\n" + "\n".join(o.rstrip() for o in four_slots) + "\n```", 1)
    text = text.replace("## 3. The default -np\n", "## 3. The default -np\n\nNot run: my laptop has 4 GB.\n", 1)
    text = text.replace("| np | clients | aggregate t/s | per stream t/s | TTFT p50 s | TTFT p95 s |\n"
                        "|---|---|---|---|---|---|", table(one_slot + four_slots), 1)
    if name:
        text = text.replace("\nName:\n", f"\nName: {name}\n", 1)
    for key, heading in (("aggregate", "## 5."), ("memory", "## 6."), ("class", "## 7.")):
        start = text.index(heading)
        end = text.index("\n", start)
        text = text[:end + 1] + "\n" + ANSWERS[key] + "\n" + text[end + 1:]
    return text


def plain_style(one_slot: list[str], four_slots: list[str], name: str | None = None) -> str:
    """No Markdown fences: label lines, the commands pasted too, the table as a Markdown table."""
    head = f"Lab 04-04 - {name}\n" if name else "Lab 04-04\n"
    runs = "\n".join(f"$ python load.py\n{o.rstrip()}" for o in one_slot)
    return (f"{head}\nUn solo slot (-np 1):\n{runs}\n\nQuattro slot (-np 4):\n"
            + "\n".join(f"$ python load.py --clients 4\n{o.rstrip()}" for o in four_slots)
            + f"\n\nTabella:\n{table(one_slot + four_slots)}\n\n"
            f"Perché l'aggregato cresce e ogni stream rallenta:\n{ANSWERS['aggregate']}\n\n"
            f"Quanta memoria costa -np:\n{ANSWERS['memory']}\n\n"
            f"Una classe di 30:\n{ANSWERS['class']}\n")


STYLES = {"template": template_style, "plain": plain_style}


def _replace(text: str, pattern: str, make) -> str:
    changed, count = re.subn(pattern, make, text, count=1)
    assert count == 1, pattern
    return changed


def broken_variants(good: str, readme: str) -> dict[str, str]:
    """One deliberately broken deliverable per offline check, each made from the good one."""
    start = good.index("## 7. Question")
    readme_runs = re.findall(r"\[np=.*\]\n\s*\[aggregato.*\]\n\s*\[cache.*\]\n\s*\[id: .*\]", readme)
    readme_copy = good
    block = r"\[np=.*\]\n\[aggregato.*\]\n\[cache.*\]\n\[id: .*\]"
    for index, found in enumerate(re.findall(block, good)[:len(readme_runs)]):
        readme_copy = readme_copy.replace(found, "\n".join(line.strip() for line in readme_runs[index].splitlines()))
    # the table made from the copied runs, as a student who copies would make it
    readme_copy = re.sub(r"\| np \|.*(?:\n\|.*)*", lambda m: table(re.findall(block, readme_copy)), readme_copy,
                         count=1)
    return {
        "broken-missing-section.md": good[:start],
        "broken-physics.md": _replace(good, r"(\d+) token in", lambda m: f"{int(m[1]) + 2} token in"),
        "broken-table.md": _replace(good, r"(\n\| 1 \| 1 \| )([\d.]+)", lambda m: m[1] + "55.5"),
        "broken-answer.md": good.replace(ANSWERS["memory"], "A lot, it depends on the model."),
        "broken-readme-copy.md": readme_copy,
    }
