"""Lab 04-05 as students run it and write it up: see.py's real outputs on the lab's picture and on an image
of their own, pasted in two styles, and the broken files made from a good one.

Shared by the e2e test and by the reference regeneration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.projector_model import png_image

LAB_DIR = Path(__file__).resolve().parents[1] / "labs" / "lab-04-05-images"
SEE_PY = LAB_DIR / "see.py"
ANSWER = """The image took the difference between the two prompt counts: its embeddings plus the marker tokens
around them. Sent again, it cost almost nothing: cache_n covered the whole prompt but its last token, so the
server computed one token, not the image. A new image is computed whole: the cache stops where the image
starts, because the server keys the image by its bytes."""
ANSWER_IT = """L'immagine vale la differenza tra i due conteggi di prompt: i suoi embedding più i token dei
marcatori. Rimandata, non costa quasi nulla: cache_n copre tutto il prompt tranne l'ultimo token. Un'immagine
nuova si calcola tutta: la cache si ferma dove l'immagine comincia."""


def see(url: str, key: str | None, image: Path | None = None) -> str:
    """One `python see.py [IMAGE]` against `url`, as a student with `key` runs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("API_KEY", "OPENAI_API_KEY")}
    env["LLAMA_URL"] = url
    if key:
        env["API_KEY"] = key
    command = [sys.executable, str(SEE_PY), *([str(image)] if image else [])]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@dataclass(frozen=True)
class Runs:
    """One student's two runs of see.py: on picture.png and on an image of their own."""

    picture: str
    own: str


def student_runs(url: str, key: str | None, work: Path, seed: int) -> Runs:
    """see.py on the lab's picture, then on a photo of the student's own (one no one else sends: `seed`)."""
    work.mkdir(parents=True, exist_ok=True)
    photo = work / "my-photo.png"
    photo.write_bytes(png_image(120, 90, seed))
    return Runs(see(url, key, None), see(url, key, photo))


def _fence(text: str) -> str:
    return f"```text\n{text.rstrip()}\n```"


def template_style(runs: Runs, name: str | None = None) -> str:
    """The lab-04-05.md template filled in: its headings and ``` blocks."""
    text = (LAB_DIR / "lab-04-05.md").read_text(encoding="utf-8")
    for block in (runs.picture, runs.own):
        text = text.replace("```text\n```", _fence(block), 1)
    if name:
        text = text.replace("\nName:\n", f"\nName: {name}\n", 1)
    return text.rstrip() + "\n\n" + ANSWER + "\n"


def _indent(text: str) -> str:
    return "\n".join("    " + line if line.strip() else "" for line in text.rstrip().splitlines())


def italian_style(runs: Runs, name: str | None = None) -> str:
    """Italian headings, indented code, the command lines pasted too, prose between the outputs."""
    head = f"# Laboratorio 04-05: immagini\n\nNome: {name}\n" if name else "# Laboratorio 04-05: immagini\n"
    return (f"{head}\n## L'immagine del laboratorio\n\n{_indent('$ python see.py' + chr(10) + runs.picture)}\n\n"
            f"Poi con una foto mia:\n\n{_indent('$ python see.py my-photo.png' + chr(10) + runs.own)}\n\n"
            f"## Risposta: quanto costa un'immagine?\n\n{ANSWER_IT}\n")


STYLES: dict[str, Callable[[Runs, str | None], str]] = {"template": template_style, "italian": italian_style}

RUN_LINE = r"\[{label}: finish_reason=\w+ prompt=\d+ tok, completion=\d+ tok, [\d.]+s\]\n\[server: [^\]]*\]"


def _run_lines(block: str, label: str) -> str:
    match = re.search(RUN_LINE.format(label=label), block)
    assert match, f"no '{label}' run in {block!r}"
    return match[0]


def _with_run(block: str, label: str, lines: str) -> str:
    """`block` with its `label` run's two lines replaced by `lines` (another run's, relabelled)."""
    relabelled = re.sub(r"^\[[a-z ]+:", f"[{label}:", lines)
    return block.replace(_run_lines(block, label), relabelled, 1)


def broken_variants(good: str, runs: Runs, readme: str) -> dict[str, str]:
    """One deliberately broken deliverable per offline check, each made from the good one."""
    picture, own = runs.picture.rstrip(), runs.own.rstrip()
    assert picture in good and own in good
    example = re.search(r"\[image picture\.png: .*?\[image again: .*?\n\s*\[server: [^\]]*\]", readme, flags=re.S)
    assert example, "the README shows no whole example output of see.py"
    readme_block = "\n".join(line.strip() for line in example[0].splitlines())
    start, end = good.index("## 2."), good.index("## 3.")
    return {
        "broken-missing-own-image.md": good[:start] + good[end:],
        "broken-numbers.md": good.replace(picture, re.sub(r"(\[text only: [^\]]*tok, )[\d.]+s\]", r"\g<1>0.1s]",
                                                          picture, count=1), 1),
        "broken-image-adds-nothing.md": good.replace(
            picture, _with_run(picture, "image", _run_lines(picture, "text only")), 1),
        "broken-no-cache.md": good.replace(own, _with_run(own, "image again", _run_lines(own, "image")), 1),
        "broken-reused-new-image.md": good.replace(own, _with_run(own, "image", _run_lines(own, "image again")), 1),
        "broken-answer.md": good.replace(ANSWER, "The picture shows a house; the second time it was faster.", 1),
        "broken-readme-copy.md": good.replace(picture, readme_block, 1),
    }
