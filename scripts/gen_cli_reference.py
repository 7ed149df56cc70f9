"""Rewrites the flag table in docs/reference/cli.md and the "ignored flags" rows of the differences table in
docs/reference/http-llamacpp.md from kinetic/config/flag_status.py (which flags act, and why each other one is
ignored). tests/unit/test_flag_status.py fails when either page is stale."""

from __future__ import annotations

from pathlib import Path

from kinetic.config.flag_status import TABLE_END, TABLE_START, difference_rows, reference_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"
DIFFERENCES = Path(__file__).resolve().parents[1] / "docs" / "reference" / "http-llamacpp.md"


def main() -> None:
    text = PAGE.read_text(encoding="utf-8")
    start, end = text.index(TABLE_START), text.index(TABLE_END) + len(TABLE_END)
    PAGE.write_text(text[:start] + reference_table() + text[end:], encoding="utf-8")
    print(f"wrote {PAGE}")
    lines = [line for line in DIFFERENCES.read_text(encoding="utf-8").splitlines()
             if not line.startswith("| ignored flags: ")]
    head = lines.index("## Differences from llama-server")
    last_row = max(i for i, line in enumerate(lines) if i > head and line.startswith("| "))
    lines[last_row + 1:last_row + 1] = difference_rows()
    DIFFERENCES.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {DIFFERENCES}")


if __name__ == "__main__":
    main()
