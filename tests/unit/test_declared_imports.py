"""Every third-party module the package imports is a declared dependency (issue 7): the grader's in
the base install, the rest in the `serve` extra; test-only libraries stay in `dev`."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The modules the grader and its CLI load: these may only use the base dependencies.
GRADER = ("kinetic/__init__.py", "kinetic/__main__.py", "kinetic/cli.py", "kinetic/config/settings.py",
          "kinetic/errors.py", "kinetic/config/llama_flags.py",
          "kinetic/grading/", "kinetic/classroom/keys.py", "kinetic/classroom/ledger.py", "kinetic/server/launch.py")


def dist_names(specs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in specs}


def third_party_imports(path: Path, *, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name not in ("kinetic", "__future__")}


def distributions(modules: set[str]) -> set[str]:
    mapping = packages_distributions()
    return {mapping[m][0].lower().replace("_", "-") for m in modules}


def test_every_import_of_the_package_is_declared() -> None:
    declared = dist_names(PROJECT["dependencies"]) | dist_names(PROJECT["optional-dependencies"]["serve"])
    used = set().union(*(third_party_imports(p, top_level_only=False) for p in (ROOT / "kinetic").rglob("*.py")))
    assert distributions(used) <= declared, distributions(used) - declared


def test_the_grader_imports_only_base_dependencies_at_load_time() -> None:
    files = [p for p in (ROOT / "kinetic").rglob("*.py") if str(p.relative_to(ROOT)).startswith(GRADER)]
    used = set().union(*(third_party_imports(p, top_level_only=True) for p in files))
    assert distributions(used) <= dist_names(PROJECT["dependencies"])


def test_serve_extra_is_in_dev_and_test_libraries_are_not_in_serve() -> None:
    assert "kinetic[serve]" in PROJECT["optional-dependencies"]["dev"]
    serve = dist_names(PROJECT["optional-dependencies"]["serve"])
    assert not serve & {"pytest", "openai", "anthropic", "mkdocs-material"}
