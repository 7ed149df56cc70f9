"""Students check their deliverable without compiling llama.cpp: the base install is the grader.

A fresh virtual environment gets kinetic without the `serve` extra (from a copy of this checkout,
so the source tree stays clean); `kinetic grade` then works, the server's dependencies are absent,
and `kinetic serve` says which extra to install.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "labs" / "lab-04-02-client-openai"


@pytest.fixture(scope="module")
def grader_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("grader-install")
    source = work / "kinetic-src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "kinetic", source / "kinetic", ignore=shutil.ignore_patterns("__pycache__"))
    env = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    bindir = env / ("Scripts" if sys.platform == "win32" else "bin")
    # pip's cache serves setuptools and httpx after the first run: seconds, not a download each time.
    proc = subprocess.run([str(bindir / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return bindir


def run(bindir: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bindir / "kinetic"), *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_the_base_install_has_no_server_dependencies(grader_env: Path) -> None:
    for module in ("llama_cpp", "fastapi", "uvicorn", "numpy"):
        proc = subprocess.run([str(grader_env / "python"), "-c", f"import {module}"], capture_output=True, text=True)
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, module


def test_kinetic_grade_runs_without_llama_cpp(grader_env: Path) -> None:
    by_path = run(grader_env, "grade", str(LAB), str(LAB / "reference" / "good.md"))
    assert by_path.returncode == 0 and "10/10 points" in by_path.stdout, by_path.stdout + by_path.stderr
    # A student inside the lab folder names the lab by its id.
    by_id = run(grader_env, "grade", "lab-04-02", "reference/broken-ttft.md", cwd=LAB)
    assert by_id.returncode == 1 and ":( chat.py --stream reports chunks" in by_id.stdout, by_id.stderr


def test_kinetic_serve_names_the_extra_to_install(grader_env: Path) -> None:
    proc = run(grader_env, "serve")
    assert proc.returncode == 1 and 'pip install "kinetic[serve]"' in proc.stderr
