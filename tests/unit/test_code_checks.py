"""The checks the project runs on itself: ruff over every Python file in the repository and mypy over
kinetic/, scripts/ and bench/, both with the settings in pyproject.toml (the labs are students' code,
written as plain as the openai SDK allows, so mypy leaves them out). A finding is fixed, or waived on its own line with
the reason (`# noqa: CODE  why`, `# type: ignore[code]  # why`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    # the venv's own interpreter, so the versions pinned in the dev extra are the ones that run
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_ruff_finds_nothing() -> None:
    result = run_tool("ruff", "check", "--no-fix", "--output-format", "concise", ".")
    if result.returncode != 0:
        pytest.fail(f"ruff check (exit {result.returncode}):\n{result.stdout}{result.stderr}", pytrace=False)


def test_mypy_finds_nothing() -> None:
    # files and options from [tool.mypy]; the incremental cache lives in .mypy_cache
    result = run_tool("mypy", "--no-error-summary", "--no-pretty")
    if result.returncode != 0:
        pytest.fail(f"mypy (exit {result.returncode}):\n{result.stdout}{result.stderr}", pytrace=False)
