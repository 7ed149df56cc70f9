"""The site has the five labs of module 04, and the instructor's pages on grading and on writing checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_lab_and_grading_pages_build(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    lab = (site / "labs" / "lab-04-01" / "index.html").read_text()
    assert "request.json" in lab and "cache_n" in lab and "kinetic grade lab-04-01" in lab
    structured = (site / "labs" / "lab-04-03" / "index.html").read_text()
    assert "grammar.json" in structured and "tool_call_id" in structured and "kinetic grade lab-04-03" in structured
    concurrency = (site / "labs" / "lab-04-04" / "index.html").read_text()
    assert "load.py" in concurrency and "/slots" in concurrency and "kinetic grade lab-04-04" in concurrency
    images = (site / "labs" / "lab-04-05" / "index.html").read_text()
    assert "see.py" in images and "--no-mmproj" in images and "kinetic grade lab-04-05" in images
    assert images.count("<h1") == 1
    notebooks = (site / "notebooks" / "index.html").read_text()
    assert "kinetic[notebooks]" in notebooks and "jupyterlab" in notebooks.lower()
    grading = (site / "grading" / "index.html").read_text()
    assert "--ledger" in grading and "SIS Login ID" in grading and "--ledger-content" in grading
    assert "Lab 04-03: what each check looks at" in grading and "Lab 04-04: what each check looks at" in grading
    assert "Lab 04-05: what each check looks at" in grading
    assert "The docstring is what the student reads" in (site / "labs" / "writing-checks" / "index.html").read_text()
