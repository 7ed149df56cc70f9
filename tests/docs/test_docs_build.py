"""The course site builds strictly: every snippet include (README set-up, the lab text) resolves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    lab_page = (tmp_path / "site" / "labs" / "lab-04-02" / "index.html").read_text()
    assert "chat.py" in lab_page and "kinetic serve" in lab_page
    setup_page = (tmp_path / "site" / "setup" / "index.html").read_text()
    assert "CMAKE_ARGS" in setup_page and "The first install compiles llama.cpp" in setup_page
