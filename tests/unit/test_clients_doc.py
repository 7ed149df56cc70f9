"""docs/clients.md's compatibility table and the client test modules must describe the same rows."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "clients.md"


def table_rows() -> list[list[str]]:
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]
    return cells[1:]  # skip the header (the |---| line does not start with "| ")


def test_every_row_names_an_existing_test_module() -> None:
    rows = table_rows()
    assert len(rows) >= 4
    for row in rows:
        modules = re.findall(r"`(tests/e2e/test_client_\w+\.py)`", row[-1])
        assert len(modules) == 1, f"row {row[0]!r} must name its test module"
        assert (ROOT / modules[0]).is_file(), f"{modules[0]} (row {row[0]!r}) does not exist"
        assert row[2].startswith("works")


def test_every_client_test_module_has_a_row() -> None:
    named = {m for row in table_rows() for m in re.findall(r"`(tests/e2e/test_client_\w+\.py)`", row[-1])}
    existing = {str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "e2e").glob("test_client_*.py")}
    assert existing == named
