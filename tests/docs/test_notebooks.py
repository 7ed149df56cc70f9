"""The notebooks (notebooks/ and the labs' own): committed without outputs, and each one runs top to
bottom against the live server.

They read LLAMA_URL and API_KEY from the environment, which the kernel inherits from this process. A
lab's notebook runs in its lab folder, as a student opens it there (it runs the lab's scripts).
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

from tests.browser import ARTIFACTS
from tests.server import KineticServer

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("lab-*/*.ipynb"))
PLOTTED = {"02-measuring-speed", "lab-04-04"}
IDS = [path.stem for path in NOTEBOOKS]
CELL_TIMEOUT_S = 240


def test_the_course_notebooks_exist() -> None:
    assert {"01-first-request", "02-measuring-speed", "03-protocols", "lab-04-04"} <= set(IDS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} cell {index} has outputs: clear them before committing")


@pytest.mark.e2e
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_against_the_live_server(path: Path, default_server: KineticServer,
                                               monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from nbclient import NotebookClient

    monkeypatch.setenv("LLAMA_URL", default_server.url)
    monkeypatch.setenv("API_KEY", "sk-course")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(path, as_version=4)
    workdir = path.parent if path.parent.parent.name == "labs" else tmp_path
    # the kernel is this interpreter (the test venv), whatever kernelspecs the machine has
    client = NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir)}})
    client.km = client.create_kernel_manager()
    client.km.kernel_cmd = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    try:
        client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
    finally:  # the executed notebook, outputs and plot included, for people to look at
        (ARTIFACTS / "notebooks").mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, ARTIFACTS / "notebooks" / path.name)
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any(o.output_type in ("stream", "execute_result") for o in outputs)
    if path.stem in PLOTTED:  # the plot was drawn
        assert any("image/png" in o.get("data", {}) for o in outputs), f"no plot in {path.name}"
