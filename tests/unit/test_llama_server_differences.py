"""docs/reference/http-llamacpp.md "Differences from llama-server": every row names a test that exists,
and the claims no e2e test covers are checked here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from kinetic.config.settings import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "http-llamacpp.md"
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    return text[text.index("## Differences from llama-server"):]


def test_every_difference_names_a_test_that_exists() -> None:
    rows = [line for line in section().splitlines() if line.startswith("| ") and not line.startswith("| what")]
    rows = [row for row in rows if not set(row) <= set("|- ")]
    assert len(rows) >= 8
    for row in rows:
        refs = TEST_REF.findall(row.rsplit(" | ", 1)[-1])
        assert refs, f"no test named for: {row[:60]}"
        for path, name in refs:
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            assert name in {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}, (path, name)


def test_the_not_differences_name_tests_that_exist() -> None:
    tail = section().split("Not differences", 1)[1]
    refs = TEST_REF.findall(tail)
    assert refs
    for path, name in refs:
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), (path, name)


def test_cache_ram_default_is_1024_mib() -> None:
    assert ServerSettings().cache_ram == 1024


def test_cors_default_is_llama_servers() -> None:
    assert ServerSettings().cors_policy == "*"
    assert ServerSettings(tools="all").cors_policy == "localhost"
    assert ServerSettings(agent=True).cors_policy == "localhost" and ServerSettings(agent=True).cors_proxy
    assert ServerSettings(ignored_flags=("--mcp-servers-json",)).cors_policy == "localhost"
    assert ServerSettings(tools="all", cors_origins="*").cors_policy == "*"  # an explicit choice wins
    assert ServerSettings(tools=" ").cors_policy == "*"  # no tool named
